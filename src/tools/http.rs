//! The `http` executor: the call's arguments POSTed as JSON to a fixed URL.
//!
//! - `headers` values may name environment variables (`"Bearer ${TOKEN}"`);
//!   they are resolved once at start (a missing variable is a start-up
//!   error) and kept as secrets: never logged, never in `{:?}`.
//! - A 2xx answer is a successful call whose body (up to
//!   [`MAX_OUTPUT_BYTES`], the rest not read) is the result; any other
//!   status, or no answer within the tool's timeout, fails the call.
//! - Redirects are not followed: a 3xx fails the call, naming the status
//!   and its `Location`. Following one would POST the call again, and send
//!   its arguments and secret headers to another address.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::outcome::{CappedOutput, ToolOutcome, MAX_OUTPUT_BYTES};
use super::stamp::Stamp;
use secrecy::{ExposeSecret, SecretString};

/// An http tool's executor, as checked at start.
#[derive(Debug)]
pub struct HttpSpec {
    pub url: reqwest::Url,
    /// Header names and their resolved values.
    headers: Vec<(reqwest::header::HeaderName, SecretString)>,
    client: reqwest::Client,
}

impl HttpSpec {
    pub fn new(url: String, headers: HashMap<String, String>) -> Result<HttpSpec, String> {
        let url = checked_url("http", &url)?;
        let resolved = resolved_headers(headers)?;
        let client = reqwest::Client::builder()
            // A redirect would send the call again, and its secret headers
            // to wherever the answer points: not followed, it fails.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| format!("key `http`: cannot set up an HTTP client: {err}"))?;
        Ok(HttpSpec {
            url,
            headers: resolved,
            client,
        })
    }

    pub async fn run(
        &self,
        args: &Value,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
        stamp: Stamp<'_>,
    ) -> ToolOutcome {
        let started = Instant::now();
        let call = async {
            let mut request = self.client.post(self.url.clone()).json(args);
            for (name, value) in stamp.headers() {
                request = request.header(name, value);
            }
            for (name, value) in &self.headers {
                request = request.header(name.clone(), value.expose_secret());
            }
            let mut response = request
                .send()
                .await
                .map_err(|err| (None, crate::redact::request_error(&err)))?;
            let status = response.status();
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .map(|value| value.chars().take(500).collect::<String>());
            let mut body = CappedOutput::default();
            while body.kept.len() < MAX_OUTPUT_BYTES {
                match response.chunk().await {
                    Ok(Some(bytes)) => body.push(&bytes),
                    Ok(None) => break,
                    Err(err) => {
                        let why = crate::redact::request_error(&err);
                        return Err((Some(status.as_u16()), why));
                    }
                }
            }
            // Past the cap the rest is not read: whether there was more.
            if body.kept.len() >= MAX_OUTPUT_BYTES && matches!(response.chunk().await, Ok(Some(_)))
            {
                body.total += 1;
            }
            Ok((status, location, body))
        };
        let result = tokio::select! {
            result = tokio::time::timeout(timeout, call) => result,
            () = stop => {
                return outcome(started, false, None, None, Some("stopped: the run was stopped".into()), CappedOutput::default());
            }
        };
        match result {
            Err(_) => outcome(
                started,
                false,
                None,
                None,
                Some(format!(
                    "timed out after {}",
                    humantime::format_duration(timeout)
                )),
                CappedOutput::default(),
            ),
            Ok(Err((status, why))) => outcome(
                started,
                false,
                status,
                None,
                Some(why),
                CappedOutput::default(),
            ),
            Ok(Ok((status, _, body))) if status.is_success() => {
                let text = body.text();
                outcome(started, true, Some(status.as_u16()), Some(text), None, body)
            }
            Ok(Ok((status, location, body))) if status.is_redirection() => {
                let why = format!(
                    "HTTP {status}: a redirect to {}, not followed (the call is POSTed once, \
                     to the declared URL only)",
                    location.as_deref().unwrap_or("nowhere given")
                );
                outcome(started, false, Some(status.as_u16()), None, Some(why), body)
            }
            Ok(Ok((status, _, body))) => {
                let snippet: String = body.text().chars().take(500).collect();
                let why = format!("HTTP {status}: {}", snippet.trim());
                outcome(started, false, Some(status.as_u16()), None, Some(why), body)
            }
        }
    }
}

fn outcome(
    started: Instant,
    ok: bool,
    http_status: Option<u16>,
    result: Option<String>,
    error: Option<String>,
    body: CappedOutput,
) -> ToolOutcome {
    ToolOutcome {
        ok,
        skipped: false,
        truncated: body.truncated(),
        result,
        error,
        duration_ms: started.elapsed().as_millis() as u64,
        exit_status: None,
        http_status,
        output_bytes: body.total,
        changed: None,
    }
}

/// `url` (the value of `key`) as an http(s) URL; the error names the key.
pub(crate) fn checked_url(key: &str, url: &str) -> Result<reqwest::Url, String> {
    // The URL itself is not repeated: it may carry a secret.
    let parsed =
        reqwest::Url::parse(url).map_err(|err| format!("key `{key}`: not a URL: {err}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "key `{key}`: {} is not an http(s) URL",
            crate::redact::origin(url)
        ));
    }
    Ok(parsed)
}

/// `headers` as written (values may name `${VARIABLES}`), checked and
/// resolved, the values kept as secrets; the error names the header.
pub(crate) fn resolved_headers(
    headers: HashMap<String, String>,
) -> Result<Vec<(reqwest::header::HeaderName, SecretString)>, String> {
    let mut resolved = Vec::new();
    for (name, value) in headers {
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("key `headers`: `{name}` is not a header name"))?;
        let value = expand_env(&value).map_err(|var| {
            format!(
                "key `headers`: `{name}` names the environment variable {var}, which is not set"
            )
        })?;
        reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
            format!("key `headers`: the value of `{name}` is not a valid header value")
        })?;
        resolved.push((header, SecretString::from(value)));
    }
    Ok(resolved)
}

/// Replaces every `${NAME}` with the variable's value; the error is the
/// name of a variable that is not set.
fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        let value = std::env::var(name).map_err(|_| name.to_owned())?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_name_environment_variables() {
        // A variable cargo sets for every test process (no set_var: other
        // test threads read the environment).
        let name = std::env::var("CARGO_PKG_NAME").unwrap();
        assert_eq!(
            expand_env("Bearer ${CARGO_PKG_NAME}").unwrap(),
            format!("Bearer {name}")
        );
        assert_eq!(expand_env("plain").unwrap(), "plain");
        assert_eq!(
            expand_env("${CHATGATE_TEST_NOT_SET_X}").unwrap_err(),
            "CHATGATE_TEST_NOT_SET_X"
        );
        let spec = HttpSpec::new(
            "http://127.0.0.1:9/".into(),
            [(
                "Authorization".to_owned(),
                "Bearer ${CARGO_PKG_NAME}".to_owned(),
            )]
            .into(),
        )
        .unwrap();
        assert!(
            !format!("{spec:?}").contains("Bearer chatgate"),
            "never in Debug output"
        );
    }
}
