//! What of a URL chatgate writes out. A URL it is given (a `--webhook`, an
//! `[[mcp]]` or http tool `url`, the model server) may carry a secret: a
//! password (`user:pass@`), a token in its query (`?token=`), or a path that
//! is itself the secret (an incoming-webhook URL). Log lines, start errors
//! and chunks name such a URL by its origin only: scheme, host and port.
//! Owns no I/O.

/// `scheme://host[:port]` of `url`; "an unreadable URL" when it does not
/// parse (its text is not repeated).
pub fn origin(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => match (parsed.host_str(), parsed.port()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}", parsed.scheme()),
            (Some(host), None) => format!("{}://{host}", parsed.scheme()),
            (None, _) => format!("a {} URL", parsed.scheme()),
        },
        Err(_) => "an unreadable URL".to_owned(),
    }
}

/// `text` with `url` in it, as given and as a parser spells it, replaced by
/// its [`origin`]: for errors of other crates that quote the URL.
pub fn scrub(text: &str, url: &str) -> String {
    let shown = origin(url);
    let mut text = text.replace(url, &shown);
    if let Ok(mut parsed) = reqwest::Url::parse(url) {
        text = text.replace(parsed.as_str(), &shown);
        // An HTTP client sends `user:pass@` as a header and quotes the rest.
        if parsed.set_username("").is_ok() && parsed.set_password(None).is_ok() {
            text = text.replace(parsed.as_str(), &shown);
        }
    }
    text
}

/// A failed HTTP request in words, without its URL: what went wrong
/// (`timed out`, `cannot connect`, ...) and the innermost cause, which
/// says why (`Connection refused (os error 111)`).
pub fn request_error(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else if err.is_body() || err.is_decode() {
        "the answer broke"
    } else {
        "failed"
    };
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(err);
    while let Some(inner) = cause.and_then(std::error::Error::source) {
        cause = Some(inner);
    }
    match cause {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_keeps_no_password_path_or_query() {
        assert_eq!(
            origin("https://user:secret@hooks.example:8443/T0/B0/xyz?token=abc#f"),
            "https://hooks.example:8443"
        );
        assert_eq!(origin("http://127.0.0.1/x?token=abc"), "http://127.0.0.1");
        assert_eq!(origin("not a url ?token=abc"), "an unreadable URL");
    }

    #[test]
    fn scrub_replaces_the_url_as_given_and_as_parsed() {
        let url = "HTTP://u:p@Example.COM/a?token=abc";
        let quoted = [
            "http://u:p@example.com/a?token=abc",
            "http://example.com/a?token=abc",
        ];
        let text = format!(
            "error sending request for url ({}), {}",
            quoted[0], quoted[1]
        );
        let scrubbed = scrub(&format!("{text}; {url}"), url);
        assert!(
            !scrubbed.contains("token") && !scrubbed.contains("u:p"),
            "{scrubbed}"
        );
        assert!(scrubbed.contains("http://example.com"), "{scrubbed}");
    }

    #[tokio::test]
    async fn a_request_error_names_the_cause_and_not_the_url() {
        // Nothing listens on a port just freed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://user:secret@127.0.0.1:{port}/hook?token=abc");
        let err = reqwest::Client::new().post(&url).send().await.unwrap_err();
        let said = request_error(&err);
        assert!(said.starts_with("cannot connect: "), "{said}");
        assert!(said.to_lowercase().contains("refused"), "{said}");
        assert!(
            !said.contains("token") && !said.contains("secret"),
            "{said}"
        );
    }
}
