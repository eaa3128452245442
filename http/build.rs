//! Embeds the portal's browser half when `cargo xtask site` has built it (`target/site/pkg/tessera.js` and
//! `tessera_bg.wasm`): the `portal_wasm` cfg is set and `TESSERA_SITE_PKG` names the folder. Without it the
//! portal is served as server-rendered HTML only, and the server says so at start.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(portal_wasm)");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| manifest.join("..").join("target"));
    let pkg = target.join("site").join("pkg");
    let js = pkg.join("tessera.js");
    let wasm = pkg.join("tessera_bg.wasm");
    println!("cargo::rerun-if-changed={}", js.display());
    println!("cargo::rerun-if-changed={}", wasm.display());
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_DIR");
    if js.is_file() && wasm.is_file() {
        println!("cargo::rustc-cfg=portal_wasm");
        println!("cargo::rustc-env=TESSERA_SITE_PKG={}", pkg.display());
    }
}
