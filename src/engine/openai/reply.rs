//! One answer of the model, assembled from its streamed deltas.
//!
//! Tool calls arrive in pieces, and servers differ in how they send them:
//! - pieces of one call share an `index`; the server's index values are
//!   mapped to calls in order of first appearance (a first index of 1 makes
//!   one call, not an empty one before it); an index of [`MAX_TOOL_CALLS`] or
//!   more is refused before anything is allocated;
//! - pieces without `index` continue the last call, unless they carry a new
//!   `id`: then they start the next call (two parallel calls never merge);
//! - a function name repeated in every piece is kept once;
//! - `arguments` sent as a JSON object (not a string) count as the whole
//!   arguments;
//! - the legacy `function_call` delta is one call.
//!
//! The names and arguments of all calls together are bounded by
//! [`MAX_TOOL_ARGUMENT_BYTES`], checked before a piece is kept.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::upstream::{FunctionPart, ToolCallPart};

/// Tool calls one answer of the model may make (indexes 0 to 15).
pub const MAX_TOOL_CALLS: usize = 16;
/// Bytes of arguments of all tool calls of one answer.
pub const MAX_TOOL_ARGUMENT_BYTES: usize = 64 * 1024;

/// What one model call produced.
#[derive(Debug, Default)]
pub struct ModelReply {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// The last `finish_reason` the server sent.
    pub finish_reason: Option<String>,
    /// The server's `index` values, to positions in `tool_calls`.
    positions: HashMap<usize, usize>,
}

#[derive(Debug, Default, Clone)]
pub struct ToolCall {
    pub id: String,
    /// The id came from the server (not made up here).
    pub server_id: bool,
    pub name: String,
    pub arguments: String,
}

impl ModelReply {
    /// Adds one streamed piece of a tool call. An index or arguments past
    /// the bounds are refused before anything grows.
    pub fn add_tool_call_part(&mut self, part: ToolCallPart) -> Result<(), String> {
        let added = part.function.as_ref().map_or(0, |f| {
            f.name.as_ref().map_or(0, String::len)
                + f.arguments.as_ref().map_or(0, |a| match a {
                    Value::String(text) => text.len(),
                    other => other.to_string().len(),
                })
        });
        let held: usize = self
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum();
        if held + added > MAX_TOOL_ARGUMENT_BYTES {
            return Err(format!(
                "the model's tool calls are longer than {MAX_TOOL_ARGUMENT_BYTES} bytes"
            ));
        }
        let position = match part.index {
            Some(index) if index >= MAX_TOOL_CALLS => {
                return Err(format!(
                    "the model sent a tool call with index {index}; at most {MAX_TOOL_CALLS} calls"
                ))
            }
            Some(index) => match self.positions.get(&index) {
                Some(&position) => position,
                None => {
                    let position = self.new_call()?;
                    self.positions.insert(index, position);
                    position
                }
            },
            None => {
                let starts_another = match (&part.id, self.tool_calls.last()) {
                    (_, None) => true,
                    (Some(id), Some(last)) => last.server_id && last.id != *id,
                    (None, Some(_)) => false,
                };
                if starts_another {
                    self.new_call()?
                } else {
                    self.tool_calls.len() - 1
                }
            }
        };
        let call = &mut self.tool_calls[position];
        if let Some(id) = part.id.filter(|id| !id.is_empty()) {
            call.id = id;
            call.server_id = true;
        }
        if let Some(function) = part.function {
            call.add(function);
        }
        Ok(())
    }

    /// The legacy `function_call` delta: one call, in pieces.
    pub fn add_function_call_part(&mut self, function: FunctionPart) -> Result<(), String> {
        self.add_tool_call_part(ToolCallPart {
            index: Some(0),
            id: None,
            function: Some(function),
        })
    }

    fn new_call(&mut self) -> Result<usize, String> {
        let n = self.tool_calls.len();
        if n >= MAX_TOOL_CALLS {
            return Err(format!(
                "the model made more than {MAX_TOOL_CALLS} tool calls in one answer"
            ));
        }
        self.tool_calls.push(ToolCall {
            id: format!("call_{n}"),
            ..ToolCall::default()
        });
        Ok(n)
    }

    /// The assistant message that goes back into the conversation.
    pub fn as_message(&self) -> Value {
        let mut message = json!({ "role": "assistant", "content": self.content });
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": { "name": call.name, "arguments": call.arguments },
                    })
                })
                .collect();
        }
        message
    }
}

impl ToolCall {
    fn add(&mut self, function: FunctionPart) {
        if let Some(name) = function.name.filter(|name| !name.is_empty()) {
            // Some servers repeat the whole name in every piece.
            if self.name.is_empty() {
                self.name = name;
            } else if name != self.name {
                self.name.push_str(&name);
            }
        }
        match function.arguments {
            Some(Value::String(piece)) => self.arguments.push_str(&piece),
            // Arguments as an object: that is all of them.
            Some(Value::Null) | None => {}
            Some(whole) => self.arguments = whole.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(
        index: Option<usize>,
        id: Option<&str>,
        name: Option<&str>,
        args: Value,
    ) -> ToolCallPart {
        ToolCallPart {
            index,
            id: id.map(str::to_owned),
            function: Some(FunctionPart {
                name: name.map(str::to_owned),
                arguments: Some(args),
            }),
        }
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    #[test]
    fn pieces_are_joined_by_index_and_interleaved_calls_stay_apart() {
        let mut reply = ModelReply::default();
        for piece in [
            part(Some(0), Some("a"), Some("write"), s("{\"x\":")),
            part(Some(1), Some("b"), Some("read"), s("{\"y\":")),
            part(Some(0), None, None, s("1}")),
            part(Some(1), None, None, s("2}")),
        ] {
            reply.add_tool_call_part(piece).unwrap();
        }
        let calls: Vec<(&str, &str, &str)> = reply
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [("a", "write", "{\"x\":1}"), ("b", "read", "{\"y\":2}")]
        );
    }

    #[test]
    fn a_name_repeated_in_every_piece_is_kept_once() {
        let mut reply = ModelReply::default();
        reply
            .add_tool_call_part(part(Some(0), Some("a"), Some("propose_plan"), s("{")))
            .unwrap();
        reply
            .add_tool_call_part(part(Some(0), None, Some("propose_plan"), s("}")))
            .unwrap();
        assert_eq!(reply.tool_calls[0].name, "propose_plan");
        assert_eq!(reply.tool_calls[0].arguments, "{}");
    }

    #[test]
    fn without_index_a_new_id_starts_a_new_call() {
        let mut reply = ModelReply::default();
        reply
            .add_tool_call_part(part(None, Some("a"), Some("one"), s("{}")))
            .unwrap();
        reply
            .add_tool_call_part(part(None, Some("b"), Some("two"), s("{")))
            .unwrap();
        reply
            .add_tool_call_part(part(None, None, None, s("}")))
            .unwrap();
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(reply.tool_calls[1].name, "two");
        assert_eq!(reply.tool_calls[1].arguments, "{}");
    }

    #[test]
    fn a_first_index_of_one_makes_one_call() {
        let mut reply = ModelReply::default();
        reply
            .add_tool_call_part(part(Some(1), Some("a"), Some("x"), s("{}")))
            .unwrap();
        assert_eq!(reply.tool_calls.len(), 1);
    }

    #[test]
    fn arguments_as_an_object_are_the_whole_arguments() {
        let mut reply = ModelReply::default();
        reply
            .add_tool_call_part(part(Some(0), Some("a"), Some("x"), json!({"step": "s"})))
            .unwrap();
        assert_eq!(reply.tool_calls[0].arguments, "{\"step\":\"s\"}");
    }

    #[test]
    fn the_legacy_function_call_is_one_call() {
        let mut reply = ModelReply::default();
        for piece in [("x", "{\"a\""), ("", ":1}")] {
            let function = FunctionPart {
                name: Some(piece.0.to_owned()),
                arguments: Some(s(piece.1)),
            };
            reply.add_function_call_part(function).unwrap();
        }
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0].arguments, "{\"a\":1}");
    }

    #[test]
    fn indexes_counts_and_bytes_are_bounded_before_anything_grows() {
        let mut reply = ModelReply::default();
        let huge = reply.add_tool_call_part(part(Some(500_000), Some("c"), Some("x"), s("{}")));
        assert!(huge.unwrap_err().contains("500000"));
        assert!(reply.tool_calls.is_empty(), "nothing allocated");
        assert!(reply
            .add_tool_call_part(part(Some(usize::MAX), None, None, s("")))
            .is_err());
        for i in 0..MAX_TOOL_CALLS {
            reply
                .add_tool_call_part(part(None, Some(&format!("id{i}")), Some("x"), s("")))
                .unwrap();
        }
        assert!(reply
            .add_tool_call_part(part(None, Some("one-more"), Some("x"), s("")))
            .is_err());

        let mut long = ModelReply::default();
        let piece = "a".repeat(MAX_TOOL_ARGUMENT_BYTES / 4);
        let mut grown = Ok(());
        for _ in 0..5 {
            grown = grown.and(long.add_tool_call_part(part(Some(0), None, None, s(&piece))));
        }
        assert!(grown.unwrap_err().contains("longer than"));
        assert!(long.tool_calls[0].arguments.len() <= MAX_TOOL_ARGUMENT_BYTES);
    }
}
