//! The OpenAPI 3.1 document of every route (`GET /openapi.json`), built
//! from the names the server uses: the `error_type` enum is every
//! [`ErrorType`], the chat stream's events a `oneOf` over every
//! [`ChunkType`] (discriminated by `chunk_type`). A test keeps both equal
//! to docs/protocol.md's tables; CI checks the document with
//! `openapi-spec-validator` and runs `schemathesis` against a live server.

use serde_json::{json, Map, Value};
use strum::IntoEnumIterator;

use super::names::{ChunkType, ErrorType};

/// Where the document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";

/// Every `chunk_type`, as written.
pub fn chunk_types() -> Vec<String> {
    ChunkType::iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// Every `error_type`, as written.
pub fn error_types() -> Vec<&'static str> {
    ErrorType::iter().map(ErrorType::as_str).collect()
}

/// The metadata keys each chunk type carries (docs/protocol.md's table).
fn metadata_of(chunk_type: &str) -> &'static [&'static str] {
    match chunk_type {
        "task_init" => &["total_tasks"],
        "status" => &["step", "total_tasks", "confirmation_id", "pending"],
        "tool_output" => &[
            "step",
            "tool",
            "ok",
            "skipped",
            "truncated",
            "duration_ms",
            "result",
            "error",
            "receipt",
            "error_type",
        ],
        "confirmation_request" => &[
            "total_tasks",
            "risk_level",
            "timeout_seconds",
            "confirmation_round",
            "confirmation_id",
            "last_round",
        ],
        "input_request" => &[
            "confirmation_id",
            "kind",
            "timeout_seconds",
            "total_questions",
        ],
        "confirmation_received" => &[
            "action",
            "confirmation_id",
            "confirmation_round",
            "decisions",
            "answers",
            "kind",
        ],
        "approval_recorded" => &[
            "confirmation_id",
            "approvals",
            "required",
            "approvers",
            "task_approvals",
            "pending",
        ],
        "decision_recorded" => &["confirmation_id", "decisions", "pending"],
        "completion" => &["tasks_completed", "tasks_rejected", "total_tasks"],
        "cancelled" => &["reason"],
        "error" => &["error_type", "options"],
        _ => &[],
    }
}

fn chunk_schema(chunk_type: &str) -> Value {
    let metadata: Map<String, Value> = metadata_of(chunk_type)
        .iter()
        .map(|key| ((*key).to_owned(), json!({})))
        .collect();
    let mut schema = json!({
        "allOf": [{"$ref": "#/components/schemas/ChunkFields"}],
        "properties": {
            "chunk_type": {"const": chunk_type},
            "metadata": {"type": "object", "properties": metadata},
        },
    });
    if chunk_type == "error" {
        schema["properties"]["metadata"]["properties"]["error_type"] =
            json!({"$ref": "#/components/schemas/ErrorType"});
        schema["properties"]["metadata"]["required"] = json!(["error_type"]);
    }
    schema
}

/// The chat endpoint's statuses and what each means.
const CHAT_STATUSES: [(u16, &str); 13] = [
    (400, "an invalid request (`invalid_request`)"),
    (401, "no or an unknown API key"),
    (
        403,
        "not allowed: origin, role, scope, self-approval, a replica's header",
    ),
    (404, "no pending confirmation, no such run"),
    (405, "not POST"),
    (408, "the body did not arrive in time"),
    (
        409,
        "stale, already decided, already approved, session busy",
    ),
    (413, "the body is over 64 KiB"),
    (415, "not application/json"),
    (421, "a Host this server does not answer for"),
    (422, "a reply that does not fit its pause"),
    (
        503,
        "overloaded, shutting down, the store or the owner out of reach",
    ),
    (504, "the outcome is not known yet"),
];

/// An event stream whose every event's `data` is `data` (JSON): in
/// OpenAPI 3.1 a `text/event-stream` schema describes one event.
fn events(description: &str, data: Value) -> Value {
    json!({
        "description": description,
        "content": {"text/event-stream": {"schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "retry": {"type": "integer"},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": data},
            },
        }}},
    })
}

fn sse(description: &str) -> Value {
    events(description, json!({"$ref": "#/components/schemas/Chunk"}))
}

fn json_error(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    })
}

/// The JSON endpoints' error statuses.
fn json_errors(codes: &[u16]) -> Map<String, Value> {
    codes
        .iter()
        .map(|code| (code.to_string(), json_error("refused (see error_type)")))
        .collect()
}

fn ok_json(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn get(summary: &str, mut responses: Map<String, Value>, ok: Value) -> Value {
    responses.insert("200".to_owned(), ok);
    json!({"get": {"summary": summary, "responses": responses}})
}

/// The document, for server `version`.
pub fn document(version: &str) -> Value {
    let chunk_types = chunk_types();
    let variants: Vec<Value> = chunk_types.iter().map(|t| chunk_schema(t)).collect();
    let mapping: Map<String, Value> = chunk_types
        .iter()
        .map(|t| (t.clone(), json!(format!("#/components/schemas/chunk_{t}"))))
        .collect();
    let mut schemas = Map::new();
    for (t, schema) in chunk_types.iter().zip(variants) {
        schemas.insert(format!("chunk_{t}"), schema);
    }
    let one_of: Vec<Value> = chunk_types
        .iter()
        .map(|t| json!({"$ref": format!("#/components/schemas/chunk_{t}")}))
        .collect();
    schemas.insert("Chunk".into(), json!({
        "description": "one event of the stream: `id: <sequence>` and one `data:` line of this JSON",
        "oneOf": one_of,
        "discriminator": {"propertyName": "chunk_type", "mapping": mapping},
    }));
    schemas.insert(
        "ChunkFields".into(),
        json!({
            "type": "object",
            "required": ["chunk", "session_id", "finished", "chunk_type", "metadata",
                         "confirmation_data", "requires_response", "stream_paused", "sequence"],
            "properties": {
                "chunk": {"type": "string"},
                "session_id": {"type": "string"},
                "finished": {"type": "boolean"},
                "chunk_type": {"type": "string", "enum": chunk_types},
                "metadata": {"type": "object"},
                "confirmation_data": {"type": ["object", "null"]},
                "requires_response": {"type": "boolean"},
                "stream_paused": {"type": "boolean"},
                "sequence": {"type": "integer", "minimum": 1},
            },
        }),
    );
    schemas.insert(
        "SessionId".into(),
        json!({
        "type": "string", "minLength": 1, "maxLength": 128,
        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        "description": "1-128 characters, no control characters"}),
    );
    schemas.insert(
        "TaskDecision".into(),
        json!({
        "type": "object", "required": ["decision"],
        "properties": {
            "index": {"type": "integer", "minimum": 1},
            "task_id": {"type": "string"},
            "decision": {"enum": ["approve", "reject", "edit", "respond"]},
            "reason": {"type": "string"},
            "args": {},
            "result": {"type": "string"},
            "preview_digest": {"type": "string"},
        }}),
    );
    schemas.insert(
        "ErrorType".into(),
        json!({"type": "string", "enum": error_types()}),
    );
    schemas.insert(
        "Error".into(),
        json!({
            "type": "object",
            "required": ["error_type", "message"],
            "properties": {
                "error_type": {"$ref": "#/components/schemas/ErrorType"},
                "message": {"type": "string"},
            },
        }),
    );
    schemas.insert("ChatRequest".into(), json!({
        "type": "object",
        "description": "a chat message or a reply; a re-attach sends `session_id` alone with the `Last-Event-ID` header (docs/protocol.md)",
        "required": ["message"],
        "properties": {
            "message": {"type": "string", "minLength": 1, "maxLength": 8192, "pattern": "\\S",
                        "description": "a chat message, or a reply `CONFIRM_ACTION:<action>[:<text>]` (with `session_id`); at most 32 KiB of UTF-8, not blank; absent on a re-attach (`Last-Event-ID`)"},
            "session_id": {"oneOf": [{"$ref": "#/components/schemas/SessionId"}, {"type": "null"}]},
            "confirmation_id": {"type": "string"},
            "decisions": {"type": "array", "items": {"$ref": "#/components/schemas/TaskDecision"},
                          "description": "a confirm's or a decide's verdicts per task (replies only)"},
            "answers": {"type": "object"},
            "grant": {"type": "object"},
        },
    }));
    let mut chat_responses: Map<String, Value> = CHAT_STATUSES
        .iter()
        .map(|(code, why)| (code.to_string(), sse(why)))
        .collect();
    chat_responses.insert(
        "200".into(),
        sse("the run's stream (a chat message, a re-attach), or a reply's acknowledgement"),
    );
    let any_object = json!({"type": "object"});
    let caller_errors = [400, 401, 403, 421, 503];
    let mut paths = Map::new();
    let preflight = json!({"summary": "CORS preflight (allowed origins only)", "responses": {
        "204": {"description": "allowed"}, "403": {"description": "not an allowed origin"},
        "421": {"description": "a Host this server does not answer for"}}});
    paths.insert(super::CHAT_PATH.into(), json!({
        "options": preflight,
        "post": {
            "summary": "Start a run, reply to its pause, or re-attach (Last-Event-ID)",
            "description": "A re-attach is this same POST with the header `Last-Event-ID: <sequence>` and a body of `session_id` alone: the header switches the request's meaning, which OpenAPI cannot state of one operation, so it is described here and not listed as a parameter (docs/protocol.md, \"Dropped connections\").",
            "requestBody": {"required": true, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ChatRequest"}}}},
            "responses": chat_responses,
        },
    }));
    paths.insert(
        super::INBOX_PATH.into(),
        get(
            "The pending pauses the caller may decide",
            json_errors(&caller_errors),
            ok_json(
                "the inbox",
                json!({"type": "object", "required": ["interactions"],
                                    "properties": {"interactions": {"type": "array"}}}),
            ),
        ),
    );
    for (path, what, key) in [
        (super::TOOLS_PATH, "The offered tools", "tools"),
        (super::RULES_PATH, "The tools file's rules", "rules"),
        (super::GRANTS_PATH, "Live grants", "grants"),
    ] {
        paths.insert(
            path.into(),
            get(
                what,
                json_errors(&caller_errors),
                ok_json(
                    what,
                    json!({"type": "object", "required": [key],
                                 "properties": {key: {"type": "array"}}}),
                ),
            ),
        );
    }
    let mut revoke = json_errors(&[400, 401, 403, 404, 421, 503]);
    revoke.insert("204".into(), json!({"description": "revoked"}));
    paths.insert(format!("{}/{{id}}", super::GRANTS_PATH), json!({"delete": {
        "summary": "Revoke a grant",
        "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": revoke,
    }}));
    let mut outcome = get(
        "A session's kept run outcome",
        json_errors(&[400, 401, 403, 404, 421, 503]),
        ok_json("the outcome", any_object.clone()),
    );
    outcome["get"]["parameters"] = json!([
        {"name": "session_id", "in": "path", "required": true, "schema": {"$ref": "#/components/schemas/SessionId"}},
        {"name": "confirmation_id", "in": "query", "required": false, "schema": {"type": "string"}},
    ]);
    paths.insert(format!("{}/{{session_id}}", super::RUNS_PATH), outcome);
    for path in ["/healthz", "/health", "/health/", "/health/live"] {
        paths.insert(
            path.into(),
            get(
                "Alive",
                Map::new(),
                ok_json(
                    "ok",
                    json!({"type": "object", "properties": {"status": {"const": "ok"}}}),
                ),
            ),
        );
    }
    for path in ["/readyz", "/health/ready"] {
        let mut not_ready = Map::new();
        not_ready.insert("503".into(), ok_json("not ready", any_object.clone()));
        paths.insert(
            path.into(),
            get(
                "Ready to take runs",
                not_ready,
                ok_json(
                    "ready",
                    json!({"type": "object", "properties": {"status": {"const": "ready"}}}),
                ),
            ),
        );
    }
    paths.insert(
        "/metrics".into(),
        get(
            "Prometheus metrics",
            Map::new(),
            json!({
                "description": "text exposition (OpenMetrics when asked in Accept)",
                "content": {"text/plain": {"schema": {"type": "string"}},
                            "application/openmetrics-text": {"schema": {"type": "string"}}},
            }),
        ),
    );
    paths.insert(
        "/.well-known/jwks.json".into(),
        get(
            "The receipts' public keys",
            Map::new(),
            json!({"description": "a JWKS", "content": {"application/jwk-set+json": {
            "schema": {"type": "object", "required": ["keys"]}}}}),
        ),
    );
    let html = |what: &str| json!({"description": what, "content": {"text/html": {"schema": {"type": "string"}}}});
    let mut link = Map::new();
    link.insert("200".into(), html("the decision page"));
    link.insert("404".into(), html("no such pause (or a forged token)"));
    link.insert("409".into(), html("decided already"));
    link.insert("400".into(), html("a form that does not fit"));
    link.insert("403".into(), html("not allowed"));
    link.insert("503".into(), html("try again"));
    link.insert("504".into(), html("not known yet"));
    paths.insert("/d/{token}".into(), json!({
        "parameters": [{"name": "token", "in": "path", "required": true, "schema": {"type": "string"}}],
        "get": {"summary": "A decision link's page", "responses": link},
        "post": {"summary": "A decision link's form", "responses": link,
                 "requestBody": {"content": {"application/x-www-form-urlencoded": {"schema": any_object}}}},
    }));
    let mut slack = Map::new();
    for (code, why) in [
        (200, "taken (Slack's answer)"),
        (400, "not a block_actions payload"),
        (401, "not signed by Slack"),
        (404, "Slack is not configured"),
    ] {
        slack.insert(code.to_string(), json!({"description": why}));
    }
    paths.insert("/api/v1/slack/actions".into(), json!({"post": {
        "summary": "A Slack button press (signed by Slack)",
        "requestBody": {"content": {"application/x-www-form-urlencoded": {"schema": any_object}}},
        "responses": slack,
    }}));
    paths.insert(
        "/".into(),
        get("The chat page", Map::new(), html("the page")),
    );
    paths.insert("/chatgate-client.mjs".into(), get("The page's client module", Map::new(), json!({
        "description": "JavaScript", "content": {"text/javascript": {"schema": {"type": "string"}}}})));
    let agui_event = json!({"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string"}, "code": {"$ref": "#/components/schemas/ErrorType"}}});
    let mut agui_responses: Map<String, Value> = [400, 401, 403, 408, 409, 413, 415, 421, 503]
        .iter()
        .map(|code| {
            (
                code.to_string(),
                events("refused: one RUN_ERROR event", agui_event.clone()),
            )
        })
        .collect();
    agui_responses.insert(
        "200".into(),
        events("AG-UI events, one per data: line", agui_event),
    );
    let user_text = json!({"type": "string", "minLength": 1, "maxLength": 8192, "pattern": "\\S"});
    let run_input = json!({
        "type": "object", "required": ["threadId", "runId", "messages"],
        "properties": {
            "threadId": {"$ref": "#/components/schemas/SessionId"},
            "runId": {"type": "string", "minLength": 1, "maxLength": 128},
            "messages": {"type": "array", "items": {"type": "object", "required": ["role"],
                "properties": {"role": {"type": "string"}, "content": {}}}},
            "resume": {"type": ["array", "null"], "maxItems": 64, "items": {"type": "object",
                "required": ["interruptId", "status"],
                "properties": {"interruptId": {"type": "string"},
                               "status": {"enum": ["resolved", "cancelled"]}, "payload": {}}}},
        },
        "description": "a run (the last user message is the chat message) or, with `resume`, answers to interrupts",
        "anyOf": [
            {"required": ["resume"], "properties": {"resume": {"type": "array", "minItems": 1}}},
            {"properties": {"messages": {"minItems": 1, "items": {
                "required": ["role", "content"],
                "properties": {"role": {"const": "user"}, "content": user_text}}}}},
        ],
    });
    paths.insert(super::agui::AGUI_PATH.into(), json!({
        "options": preflight,
        "post": {
        "summary": "The AG-UI face: a RunAgentInput (a message, or a resume of interrupts)",
        "requestBody": {"required": true, "content": {"application/json": {"schema": run_input}}},
        "responses": agui_responses,
    }}));
    paths.insert(
        super::agui::AGUI_CAPABILITIES_PATH.into(),
        get(
            "AG-UI capabilities",
            json_errors(&caller_errors),
            ok_json("AgentCapabilities", any_object.clone()),
        ),
    );
    let mut a2a = Map::new();
    a2a.insert("200".into(), json!({"description": "a JSON-RPC response, or (streaming methods) a stream of them",
        "content": {"application/json": {"schema": any_object}, "text/event-stream": {"schema": {"type": "string"}}}}));
    for code in [400, 401, 403, 408, 413, 415, 421] {
        a2a.insert(
            code.to_string(),
            ok_json("refused: a JSON-RPC error", any_object.clone()),
        );
    }
    paths.insert(
        super::a2a::A2A_PATH.into(),
        json!({"post": {
            "summary": "The A2A face: JSON-RPC 2.0 (A2A 1.0)",
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "required": ["jsonrpc", "method"],
                "properties": {"jsonrpc": {"const": "2.0"}, "method": {"type": "string"},
                               "params": {}, "id": {}}}}}},
            "responses": a2a,
        }}),
    );
    paths.insert(
        super::a2a::AGENT_CARD_PATH.into(),
        get(
            "The A2A agent card",
            Map::new(),
            ok_json(
                "AgentCard",
                json!({"type": "object", "required": ["name", "supportedInterfaces", "skills"]}),
            ),
        ),
    );
    paths.insert(
        OPENAPI_PATH.into(),
        get(
            "This document",
            Map::new(),
            ok_json("OpenAPI 3.1", any_object),
        ),
    );
    json!({
        "openapi": "3.1.0",
        "info": {"title": "chatgate", "version": version,
                 "description": "A human-in-the-loop gate for AI agents (docs/protocol.md)"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "a chatgate API key (needed when the server has keys)"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": paths,
    })
}
