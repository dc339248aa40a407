//! Declared tools: what a confirmed plan may really do.
//!
//! `--tools FILE` is a TOML file with one `[[tool]]` table per tool (see
//! docs/tools.md). [`Tools::load`] checks all of it at start (unknown keys,
//! schemas, executors, names, programs) and refuses to start with one line
//! naming the file, the tool and the key. Arguments are checked against a
//! tool's JSON Schema before anyone is asked ([`Tool::check_args`]).
//!
//! [`Tool::run`] runs one call with its executor ([`command`]: a child
//! process with no shell; [`http`]: a POST) and reports a [`ToolOutcome`];
//! it never runs a call twice and never runs one by itself: the engine calls
//! it once, after a yes.

pub mod command;
pub mod declared;
pub mod gate;
#[cfg(feature = "openai")]
pub mod http;
pub mod keeper;
pub mod mcp;
pub mod outcome;
pub mod preview;
pub mod rules;
pub mod stamp;
pub mod tool;

pub use declared::{Tools, ToolsFileError};
pub use outcome::{ToolOutcome, MAX_OUTPUT_BYTES, MAX_STDERR_TAIL};
pub use rules::{RuleDecision, RuleMode, Rules};
pub use stamp::Stamp;
pub use tool::{Executor, Tool, DEFAULT_TIMEOUT, MAX_TIMEOUT};
