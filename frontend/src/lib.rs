//! tessera-frontend: the browser portal. Pages and components arrive with the portal; the crate already builds for
//! wasm32 against the same core rules the server uses, which is what the layout editor will call.

pub use tessera_core::layout::{LayoutError, validate};
