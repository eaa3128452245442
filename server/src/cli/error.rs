//! How a command ends: the process exit codes, and why a command failed (`CliError`). The dispatcher (`mod.rs`)
//! and every command import it; it imports none of them.

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the answer is negative (e.g. the layout is invalid).
pub const EXIT_NO: u8 = 1;
/// Exit code: bad input or usage.
pub const EXIT_USAGE: u8 = 2;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Input the command cannot work with.
    #[error("{0}")]
    BadInput(String),
    /// Output could not be written.
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
}

impl CliError {
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            CliError::BadInput(_) => EXIT_USAGE,
            CliError::Io(_) => EXIT_NO,
        }
    }
}
