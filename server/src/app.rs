//! Application state shared by every handler: one `Arc`, cloned per request.

use std::sync::Arc;

use tessera_core::Catalog;

use crate::store::Store;

/// Everything a handler may need.
#[derive(Debug)]
pub struct App {
    /// The database.
    pub store: Store,
    /// The GPU catalog.
    pub catalog: &'static Catalog,
}

/// Handler state.
#[derive(Debug, Clone)]
pub struct AppState(pub Arc<App>);

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}
