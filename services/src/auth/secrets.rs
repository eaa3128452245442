//! Secrets the server hands out (API tokens, node credentials, join tokens) and the hash the store keeps of each.
//! A secret is shown once, when it is made; only its SHA-256 is stored.

use sha2::{Digest, Sha256};

/// Prefix of every Tessera API token, so leaked tokens are easy to recognise.
pub const TOKEN_PREFIX: &str = "tsr_";
/// Prefix of node credentials.
pub use tessera_core::api::NODE_CREDENTIAL_PREFIX as NODE_TOKEN_PREFIX;
/// Prefix of join-token secrets.
pub const JOIN_TOKEN_PREFIX: &str = "tsj_";

/// A fresh token secret: the prefix and 244 random bits in hex.
pub fn new_token_secret() -> String {
    format!("{TOKEN_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// A fresh node credential secret.
pub fn new_node_secret() -> String {
    format!("{NODE_TOKEN_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// What the store keeps of a secret.
pub fn token_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
