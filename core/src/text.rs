//! Rules for free text people type: reasons and user names. One place, so the server refuses what the portal
//! already flags as it is typed.

/// Longest reason (a request's, a rejection's, a release's, a layout rejection's), in characters.
pub const MAX_REASON_CHARS: usize = 2000;
/// Longest user name, in characters.
pub const MAX_USER_NAME_CHARS: usize = 254;

/// Why a text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Longer than allowed.
    #[error("{what} has {chars} characters; at most {max}")]
    TooLong {
        /// What the text is ("a reason").
        what: &'static str,
        /// Its length in characters.
        chars: usize,
        /// The most allowed.
        max: usize,
    },
    /// Empty once trimmed.
    #[error("{what} is empty")]
    Empty {
        /// What the text is.
        what: &'static str,
    },
    /// Holds a character that hides or reorders what people read.
    #[error("{what} contains U+{code:04X}, an invisible or text-direction character")]
    Invisible {
        /// What the text is.
        what: &'static str,
        /// The character's code point.
        code: u32,
    },
}

impl TextError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            TextError::TooLong { .. } => "text_too_long",
            TextError::Empty { .. } => "text_empty",
            TextError::Invisible { .. } => "text_invisible",
        }
    }
}

/// Whether `c` is a control character, or a format character that is invisible or changes the direction of the
/// text around it: bidirectional embeddings, overrides and isolates (the "Trojan Source" characters), marks,
/// zero-width spaces and joiners, the byte-order mark, and the other Unicode `Cf` characters people meet.
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'                  // soft hyphen
            | '\u{034F}'                // combining grapheme joiner
            | '\u{061C}'                // Arabic letter mark
            | '\u{115F}' | '\u{1160}'   // Hangul fillers
            | '\u{17B4}' | '\u{17B5}'   // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}'   // Mongolian variation selectors and vowel separator
            | '\u{200B}'..='\u{200F}'   // zero-width space, non-joiner, joiner; LRM, RLM
            | '\u{202A}'..='\u{202E}'   // embeddings and overrides
            | '\u{2060}'..='\u{206F}'   // word joiner, invisible operators, isolates, deprecated format
            | '\u{3164}'                // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'   // variation selectors
            | '\u{FEFF}'                // byte-order mark, zero-width no-break space
            | '\u{FFA0}'                // halfwidth Hangul filler
            | '\u{FFF9}'..='\u{FFFB}'   // interlinear annotations
            | '\u{1D173}'..='\u{1D17A}' // musical format characters
            | '\u{E0000}'..='\u{E007F}' // tags
        )
}

/// Checks a reason: at most [`MAX_REASON_CHARS`] characters. Line breaks and tabs are allowed (reasons are prose),
/// other control characters and direction overrides are not.
pub fn check_reason(reason: &str) -> Result<(), TextError> {
    let what = "a reason";
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(TextError::TooLong { what, chars, max: MAX_REASON_CHARS });
    }
    match reason.chars().find(|&c| c != '\n' && c != '\r' && c != '\t' && is_invisible(c)) {
        Some(c) => Err(TextError::Invisible { what, code: u32::from(c) }),
        None => Ok(()),
    }
}

/// Checks a user name (a login or an e-mail address): 1 to [`MAX_USER_NAME_CHARS`] characters once trimmed, with
/// no control, invisible or direction characters, so that two names that look the same are the same name. (Names
/// that differ only in case are one name too: the store compares them case-insensitively, see
/// [`user_name_key`].)
pub fn check_user_name(name: &str) -> Result<(), TextError> {
    let what = "a user name";
    let name = name.trim();
    if name.is_empty() {
        return Err(TextError::Empty { what });
    }
    let chars = name.chars().count();
    if chars > MAX_USER_NAME_CHARS {
        return Err(TextError::TooLong { what, chars, max: MAX_USER_NAME_CHARS });
    }
    match name.chars().find(|&c| is_invisible(c)) {
        Some(c) => Err(TextError::Invisible { what, code: u32::from(c) }),
        None => Ok(()),
    }
}

/// The form under which user names are unique: trimmed and lower-cased, so `ADMIN` and `admin` are one name.
pub fn user_name_key(name: &str) -> String {
    name.trim().to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded_and_free_of_direction_tricks() {
        assert!(check_reason("fine-tuning run\nsecond line\twith a tab").is_ok());
        assert!(check_reason(&"x".repeat(MAX_REASON_CHARS)).is_ok());
        let long = "é".repeat(MAX_REASON_CHARS + 1);
        assert_eq!(
            check_reason(&long),
            Err(TextError::TooLong { what: "a reason", chars: MAX_REASON_CHARS + 1, max: MAX_REASON_CHARS })
        );
        assert_eq!(check_reason("abc\u{202E}cba").map_err(|e| e.code()), Err("text_invisible"));
        assert_eq!(check_reason("a\u{0007}").map_err(|e| e.code()), Err("text_invisible"));
    }

    #[test]
    fn user_names_refuse_invisible_and_direction_characters() {
        assert!(check_user_name("ada@example.org").is_ok());
        assert!(check_user_name("José Núñez").is_ok());
        assert!(check_user_name("王小明").is_ok());
        for bad in ["ad\u{202E}min", "ad\u{200B}min", "\u{FEFF}admin", "ad\u{2066}min", "adm\u{00AD}in", "a\nb"] {
            assert_eq!(check_user_name(bad).map_err(|e| e.code()), Err("text_invisible"), "{bad:?}");
        }
        assert_eq!(check_user_name("   ").map_err(|e| e.code()), Err("text_empty"));
        assert_eq!(check_user_name(&"a".repeat(255)).map_err(|e| e.code()), Err("text_too_long"));
        assert_eq!(user_name_key(" ADMIN "), user_name_key("admin"));
    }
}
