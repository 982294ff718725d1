//! What an error or a log event may show of a value: never a row's value, at most a redacted
//! prefix of a URL.
//!
//! A row value can carry a secret (a task URL with `user:password@` or `?key=...`, a token in
//! a header, personal data in a row key), so the connectors' errors and events name the row,
//! the column, the limit and the size, never the value. The one exception is a URL's
//! [`url_origin`]: its scheme, host and port, which tell where a request would go without the
//! user name, password, path, query or fragment.
//!
//! ```
//! use gcp_sql::encode::redact::url_origin;
//!
//! assert_eq!(
//!     url_origin("https://user:password@worker.example.com:8443/run?key=SECRET").as_deref(),
//!     Some("https://worker.example.com:8443")
//! );
//! assert_eq!(url_origin("not a url"), None);
//! ```

/// The scheme, host and port of `text` when it parses as a URL with a host
/// (`https://worker.example.com:8443`); `None` otherwise. User name, password, path, query and
/// fragment are left out.
pub fn url_origin(text: &str) -> Option<String> {
    let url = url::Url::parse(text.trim()).ok()?;
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

/// Whether `text` parses as a URL that carries a user name or a password.
pub fn has_userinfo(text: &str) -> bool {
    url::Url::parse(text.trim())
        .map(|u| !u.username().is_empty() || u.password().is_some())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_drops_userinfo_path_query_and_fragment() {
        assert_eq!(
            url_origin("http://u:p@h.example/a/b?key=SECRET#frag").as_deref(),
            Some("http://h.example")
        );
        assert_eq!(
            url_origin("ftp://u:p@[::1]:2121/x").as_deref(),
            Some("ftp://[::1]:2121")
        );
        assert_eq!(url_origin("mailto:someone@example.com"), None);
        assert_eq!(url_origin("http://u:p@ho st/"), None);
    }

    #[test]
    fn userinfo_is_seen_with_a_user_or_a_password() {
        assert!(has_userinfo("https://u@h/"));
        assert!(has_userinfo("https://:p@h/"));
        assert!(!has_userinfo("https://h/?user=u"));
        assert!(!has_userinfo("not a url"));
    }
}
