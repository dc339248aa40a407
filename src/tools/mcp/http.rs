//! MCP servers over streamable HTTP (`url = ...`): rmcp's transport on a
//! reqwest client that follows no redirect, with the same message bound as
//! stdio.

use std::collections::HashMap;

use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use secrecy::{ExposeSecret, SecretString};

use super::client::Handler;

/// Opens a session with the server at `url` and initializes it; a response
/// or an event over `max_message` bytes fails its request.
pub async fn connect(
    handler: Handler,
    url: &str,
    headers: &[(reqwest::header::HeaderName, SecretString)],
    max_message: usize,
) -> Result<RunningService<RoleClient, Handler>, String> {
    // rustls needs a process-wide provider for this client: ring, as the
    // model client's. Installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest_mcp::Client::builder()
        // A redirect would send the session's secret headers elsewhere.
        .redirect(reqwest_mcp::redirect::Policy::none())
        .build()
        .map_err(|err| format!("cannot set up an HTTP client: {err}"))?;
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let value = reqwest::header::HeaderValue::from_str(value.expose_secret())
            .map_err(|_| format!("the value of header `{name}` is not valid"))?;
        custom.insert(name.clone(), value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
    config.max_sse_event_size = max_message;
    config.max_json_response_size = max_message;
    let transport = StreamableHttpClientTransport::with_client(client, config);
    // rmcp's errors may quote the URL, which may carry a secret.
    handler
        .serve(transport)
        .await
        .map_err(|err| crate::redact::scrub(&format!("it did not initialize: {err}"), url))
}
