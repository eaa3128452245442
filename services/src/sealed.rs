//! Secrets the server must read back, sealed at rest: webhook signing secrets (HMAC needs the secret itself, so
//! they cannot be hashed like tokens). Each is sealed with XChaCha20-Poly1305 under the server's secret key.
//!
//! The stored form is `enc:v1:<key id>:<base64 of the 24-byte nonce and the ciphertext>`, where the key id is the
//! first 8 hex digits of the key's SHA-256: a stored value names the key that opens it. A value without the
//! `enc:` prefix is plain text from before sealing; it is read as it is, and sealed when the server starts.
//!
//! The key is 32 bytes in base64: `[secrets] key` / `TESSERA_SECRET_KEY`. Without one, the server makes one on its
//! first start in the data directory ([`KEY_FILE`], mode 0600) and uses it from then on. Rotation: give the new key
//! as the key and the old one in `[secrets] old_keys` / `TESSERA_SECRET_OLD_KEYS` (comma-separated); at start the
//! server seals again, with the new key, every secret sealed with another one, after which the old key may go.
//! With several replicas, first add the new key to every replica's old keys, then make it the key.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

/// The file in the data directory that holds the generated key.
pub const KEY_FILE: &str = "secret.key";
/// The prefix of sealed values.
const PREFIX: &str = "enc:v1:";
/// Bound to every ciphertext, so a sealed value opens only as what it was sealed for.
const PURPOSE: &[u8] = b"tessera sealed secret v1";

/// The `[secrets]` settings: the key secrets are sealed with and old keys that still open them, each 32 bytes in
/// base64. Its `Debug` shows whether a key is set, never the key.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsConfig {
    /// The sealing key (`TESSERA_SECRET_KEY`); none: the one in the data directory, made on first start.
    pub key: Option<String>,
    /// Keys from before a rotation (`TESSERA_SECRET_OLD_KEYS`, comma-separated), for opening only.
    #[serde(default)]
    pub old_keys: Vec<String>,
}

impl std::fmt::Debug for SecretsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key", &crate::redact::secret(&self.key))
            .field("old_keys", &format_args!("[{} redacted]", self.old_keys.len()))
            .finish()
    }
}

/// Why a secret could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// No key of this server has the value's key id.
    #[error("sealed with key {0}, which this server does not have (see `[secrets] old_keys`)")]
    UnknownKey(String),
    /// The value is not in the sealed form or does not authenticate.
    #[error("the sealed value is damaged")]
    Damaged,
    /// No randomness for a nonce.
    #[error("no randomness: {0}")]
    Random(String),
}

/// The keys secrets are sealed and opened with: the current one, and old ones that only open.
#[derive(Clone)]
pub struct Keyring {
    current: (String, XChaCha20Poly1305),
    old: Vec<(String, XChaCha20Poly1305)>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let old: Vec<&str> = self.old.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Keyring").field("current", &self.current.0).field("old", &old).finish()
    }
}

/// A key from its base64 form, with its id.
fn key_of(text: &str) -> Result<(String, XChaCha20Poly1305), String> {
    let bytes = B64.decode(text.trim()).map_err(|_| "a secret key is 32 bytes in base64".to_string())?;
    if bytes.len() != 32 {
        return Err(format!("a secret key is 32 bytes in base64, not {} bytes", bytes.len()));
    }
    let id: String = Sha256::digest(&bytes).iter().take(4).map(|b| format!("{b:02x}")).collect();
    let cipher = XChaCha20Poly1305::new_from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok((id, cipher))
}

/// A fresh key in base64.
pub fn new_key() -> Result<String, SealError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| SealError::Random(e.to_string()))?;
    Ok(B64.encode(bytes))
}

impl Keyring {
    /// The keyring of `key` (base64 of 32 bytes) and `old` keys.
    pub fn new(key: &str, old: &[String]) -> Result<Keyring, String> {
        let current = key_of(key)?;
        let old = old.iter().map(|k| key_of(k)).collect::<Result<Vec<_>, _>>()?;
        Ok(Keyring { current, old })
    }

    /// A keyring with a fresh key that lives as long as the process (for servers without a data directory).
    pub fn ephemeral(old: &[String]) -> Result<Keyring, String> {
        Keyring::new(&new_key().map_err(|e| e.to_string())?, old)
    }

    /// The keyring of the key in `dir`'s [`KEY_FILE`], made first (the directory mode 0700, the file 0600) when
    /// there is none.
    pub fn in_dir(dir: &Path, old: &[String]) -> Result<Keyring, String> {
        let path = dir.join(KEY_FILE);
        let key = match std::fs::read_to_string(&path) {
            Ok(key) => key,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                private_dir(dir)?;
                let key = new_key().map_err(|e| e.to_string())?;
                write_private(&path, key.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
                tracing::info!(path = %path.display(), "made the key that seals webhook secrets; keep it with backups");
                key
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Keyring::new(&key, old).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The keyring the settings name: the configured key, else the one in `data_dir` (made on first start), else
    /// (no data directory) a key for this process only.
    pub fn from_settings(settings: &SecretsConfig, data_dir: &Path) -> Result<Keyring, String> {
        match &settings.key {
            Some(key) => Keyring::new(key, &settings.old_keys).map_err(|e| format!("the secret key: {e}")),
            None if data_dir.as_os_str().is_empty() => {
                tracing::warn!("no secret key and no data directory: webhook secrets are sealed for this process only");
                Keyring::ephemeral(&settings.old_keys)
            }
            None => Keyring::in_dir(data_dir, &settings.old_keys),
        }
    }

    /// The id of the key that seals.
    pub fn key_id(&self) -> &str {
        &self.current.0
    }

    /// `plain` sealed with the current key.
    pub fn seal(&self, plain: &str) -> Result<String, SealError> {
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|e| SealError::Random(e.to_string()))?;
        let sealed = self
            .current
            .1
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: plain.as_bytes(), aad: PURPOSE })
            .map_err(|_| SealError::Damaged)?;
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(format!("{PREFIX}{}:{}", self.current.0, B64.encode(out)))
    }

    /// The secret in `stored`: opened when sealed, as it is when plain text from before sealing.
    pub fn open(&self, stored: &str) -> Result<String, SealError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            if stored.starts_with("enc:") {
                return Err(SealError::Damaged);
            }
            return Ok(stored.to_string());
        };
        let (id, body) = rest.split_once(':').ok_or(SealError::Damaged)?;
        let cipher = std::iter::once(&self.current)
            .chain(&self.old)
            .find(|(k, _)| k == id)
            .map(|(_, c)| c)
            .ok_or_else(|| SealError::UnknownKey(id.to_string()))?;
        let bytes = B64.decode(body).map_err(|_| SealError::Damaged)?;
        if bytes.len() < 24 {
            return Err(SealError::Damaged);
        }
        let (nonce, sealed) = bytes.split_at(24);
        let plain = cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: PURPOSE })
            .map_err(|_| SealError::Damaged)?;
        String::from_utf8(plain).map_err(|_| SealError::Damaged)
    }

    /// Whether `stored` is sealed with the current key (else it is plain text, or sealed with an old key, and is
    /// sealed again at start).
    pub fn is_current(&self, stored: &str) -> bool {
        stored.strip_prefix(PREFIX).and_then(|r| r.split_once(':')).is_some_and(|(id, _)| id == self.current.0)
    }
}

/// Makes `dir` (and its parents) when missing; the directory itself gets mode 0700 when made.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// Writes a new file only its owner may read (mode 0600 on Unix); fails when it exists.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_seal_open_and_rotate_to_a_new_key() {
        let (k1, k2) = (new_key().expect("key"), new_key().expect("key"));
        let one = Keyring::new(&k1, &[]).expect("keyring");
        let sealed = one.seal("whsec_abc").expect("sealed");
        assert!(sealed.starts_with(&format!("enc:v1:{}:", one.key_id())), "{sealed}");
        assert!(!sealed.contains("whsec_abc"));
        assert_ne!(sealed, one.seal("whsec_abc").expect("sealed"), "a fresh nonce each time");
        assert_eq!(one.open(&sealed).expect("opens"), "whsec_abc");
        assert_eq!(one.open("whsec_plain").expect("plain"), "whsec_plain", "plain text from before sealing");
        assert!(one.is_current(&sealed) && !one.is_current("whsec_plain"));
        // Rotation: the new key seals, the old one still opens.
        let two = Keyring::new(&k2, std::slice::from_ref(&k1)).expect("keyring");
        assert_eq!(two.open(&sealed).expect("opens with the old key"), "whsec_abc");
        assert!(!two.is_current(&sealed));
        let without_old = Keyring::new(&k2, &[]).expect("keyring");
        assert_eq!(without_old.open(&sealed), Err(SealError::UnknownKey(one.key_id().to_string())));
        // Tampering is found.
        let mut bytes = B64.decode(sealed.rsplit(':').next().expect("body")).expect("b64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = format!("enc:v1:{}:{}", one.key_id(), B64.encode(bytes));
        assert_eq!(one.open(&tampered), Err(SealError::Damaged));
        assert_eq!(one.open("enc:v1:nothing"), Err(SealError::Damaged));
        assert!(Keyring::new("c2hvcnQ=", &[]).is_err(), "a key of the wrong length is refused");
    }

    #[cfg(unix)]
    #[test]
    fn the_generated_key_is_kept_in_a_private_file_in_a_private_directory() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("tessera-key-{}", uuid::Uuid::new_v4().simple()));
        let dir = base.join("data");
        let first = Keyring::in_dir(&dir, &[]).expect("made");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        let again = Keyring::in_dir(&dir, &[]).expect("read");
        assert_eq!(first.key_id(), again.key_id(), "the same key on the next start");
        let sealed = first.seal("s").expect("sealed");
        assert_eq!(again.open(&sealed).expect("opens"), "s");
        std::fs::remove_dir_all(&base).expect("clean up");
    }
}
