//! The docs say what the code does: every error type the server sends is
//! documented, every error type and flag the docs name exists, every flag
//! is documented, and `--help` gives the range of every numeric flag.

use std::collections::BTreeSet;
use std::path::Path;

use chatgate::config::Settings;
use chatgate::protocol::ErrorType;
use clap::CommandFactory;
use strum::IntoEnumIterator;

const DOCS: [&str; 6] = [
    "README.md",
    "docs/protocol.md",
    "docs/operations.md",
    "docs/tools.md",
    "docs/benchmarks.md",
    "clients/README.md",
];

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The `` `name` `` spans of `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn error_types() -> BTreeSet<&'static str> {
    ErrorType::iter().map(ErrorType::as_str).collect()
}

/// Every long flag and alias of the server, without the dashes.
fn flags() -> BTreeSet<String> {
    let command = Settings::command();
    let mut names = BTreeSet::new();
    for arg in command.get_arguments() {
        if let Some(long) = arg.get_long() {
            names.insert(long.to_owned());
        }
        for alias in arg.get_all_aliases().into_iter().flatten() {
            names.insert(alias.to_owned());
        }
    }
    names
}

#[test]
fn every_error_type_is_in_the_protocol_doc() {
    let protocol = read("docs/protocol.md");
    let documented: BTreeSet<&str> = code_spans(&protocol).into_iter().collect();
    let missing: Vec<_> = error_types()
        .into_iter()
        .filter(|name| !documented.contains(name))
        .collect();
    assert!(missing.is_empty(), "not in docs/protocol.md: {missing:?}");
}

/// `error`/`name` (how the docs write a run's end) and the `error_type`
/// column of the error tables (`| 503 | `name` |`) name real error types.
#[test]
fn every_error_type_the_docs_name_exists() {
    let known = error_types();
    let mut unknown = Vec::new();
    for path in DOCS {
        let text = read(path);
        for (i, _) in text.match_indices("`error`/`") {
            let name = text[i + 9..].split('`').next().unwrap();
            if !known.contains(name) {
                unknown.push(format!("{path}: `error`/`{name}`"));
            }
        }
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let status = cells.get(1).copied().unwrap_or("");
            let is_status = status.len() == 3 && status.chars().all(|c| c.is_ascii_digit());
            if !is_status {
                continue;
            }
            if let Some(name) = cells.get(2).and_then(|c| c.strip_prefix('`')) {
                let name = name.split('`').next().unwrap();
                if !known.contains(name) {
                    unknown.push(format!("{path}: | {status} | `{name}`"));
                }
            }
        }
    }
    assert!(unknown.is_empty(), "{unknown:#?}");
}

/// A flag in a table row (`| `--name` ...`) of the docs is the server's;
/// every flag of the server is documented somewhere.
#[test]
fn the_documented_flags_are_the_server_s_flags() {
    let flags = flags();
    let mut unknown = Vec::new();
    let mut mentioned = BTreeSet::new();
    for path in DOCS {
        let text = read(path);
        for span in code_spans(&text) {
            if let Some(flag) = span.strip_prefix("--") {
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                mentioned.insert(name);
            }
        }
        if !["README.md", "docs/operations.md"].contains(&path) {
            continue;
        }
        for line in text.lines() {
            let Some(row) = line.strip_prefix("| `--") else {
                continue;
            };
            let name: String = row
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !flags.contains(&name) {
                unknown.push(format!("{path}: --{name}"));
            }
        }
    }
    let undocumented: Vec<_> = Settings::command()
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| !["help", "version"].contains(long) && !mentioned.contains(*long))
        .map(str::to_owned)
        .collect();
    assert!(unknown.is_empty(), "documented but not a flag: {unknown:?}");
    assert!(
        undocumented.is_empty(),
        "flags no doc mentions: {undocumented:?}"
    );
}

/// README promises that `--help` gives every flag's range: each flag that
/// takes a number or a duration says its bounds.
#[test]
fn help_gives_the_range_of_every_numeric_flag() {
    let without_default = ["workers", "max-runs-per-key"];
    let mut missing = Vec::new();
    for arg in Settings::command().get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let default = arg
            .get_default_values()
            .first()
            .and_then(|d| d.to_str())
            .unwrap_or("");
        let digits = default.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let numeric = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit());
        if !numeric && !without_default.contains(&long) {
            continue;
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let says_range =
            help.contains(" to ") || help.contains("up to") || help.contains("at most");
        if !says_range {
            missing.push(format!("--{long}: {help}"));
        }
    }
    assert!(missing.is_empty(), "no range in --help: {missing:#?}");
}

/// The OpenAPI document's `chunk_type` values are the chunk table's of
/// docs/protocol.md, row for row, and its `error_type` enum is every error
/// type, each one documented.
#[test]
fn the_openapi_document_s_enums_are_the_docs_tables() {
    let protocol = read("docs/protocol.md");
    let table: BTreeSet<String> = protocol
        .lines()
        .skip_while(|line| !line.starts_with("| `chunk_type` | when |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| line.split('`').nth(1).map(str::to_owned))
        .collect();
    let document = chatgate::protocol::openapi::document("test");
    let schemas = &document["components"]["schemas"];
    let enum_of = |value: &serde_json::Value| -> BTreeSet<String> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let chunk_types = enum_of(&schemas["ChunkFields"]["properties"]["chunk_type"]["enum"]);
    assert_eq!(
        chunk_types, table,
        "the document's chunk types and the docs' table"
    );
    let one_of = schemas["Chunk"]["oneOf"].as_array().unwrap().len();
    assert_eq!(one_of, table.len(), "one event schema per chunk type");

    let documented: BTreeSet<&str> = code_spans(&protocol).into_iter().collect();
    let in_document = enum_of(&schemas["ErrorType"]["enum"]);
    let all: BTreeSet<String> = error_types().into_iter().map(str::to_owned).collect();
    assert_eq!(in_document, all);
    let missing: Vec<&String> = in_document
        .iter()
        .filter(|t| !documented.contains(t.as_str()))
        .collect();
    assert!(missing.is_empty(), "not in docs/protocol.md: {missing:?}");
}
