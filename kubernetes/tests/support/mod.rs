//! What the tests of this crate share.

/// The Python with `kubernetes-validate` and `cel-python` installed: `TESSERA_TEST_PYTHON`, else
/// `target/webhooks-venv` (scripts/test makes it).
pub fn python() -> String {
    let path = std::env::var("TESSERA_TEST_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/webhooks-venv/bin/python").to_string());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: `python3 -m venv target/webhooks-venv && target/webhooks-venv/bin/pip install \
         kubernetes-validate==1.37.0 cel-python==0.5.0` (scripts/test does it)"
    );
    path
}
