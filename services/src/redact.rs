//! How secrets show in messages and `Debug` output: never.

/// A database URL without its password, for messages and `Debug`.
pub fn url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

/// How a secret shows in `Debug`: whether there is one, never what it is.
pub fn secret<T>(secret: &Option<T>) -> &'static str {
    if secret.is_some() { "Some(<redacted>)" } else { "None" }
}
