use super::*;
use crate::protocol::RiskLevel;
use crate::tools::DEFAULT_TIMEOUT;
use std::io::Write;

/// The tools file `text`, removed when dropped.
fn file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

const GOOD: &str = r#"
[[tool]]
name = "echo_args"
description = "Prints its arguments"
risk = "low"
command = ["cat"]
parameters = { type = "object", properties = { step = { type = "string" } }, required = ["step"] }
"#;

#[test]
fn a_good_file_loads_and_arguments_are_checked_against_the_schema() {
    let f = file(GOOD);
    let tools = Tools::load(f.path()).unwrap();
    let tool = tools.get("echo_args").unwrap();

    assert_eq!(tool.risk, RiskLevel::Low);
    assert!(tool.confirm);
    assert_eq!(tool.timeout, DEFAULT_TIMEOUT);
    assert!(tool.check_args(&serde_json::json!({"step": "x"})).is_ok());
    let wrong = tool
        .check_args(&serde_json::json!({"step": 3}))
        .unwrap_err();
    assert!(wrong.contains("/step"), "{wrong}");
    assert!(tool.check_args(&serde_json::json!({})).is_err());
}

#[test]
fn every_mistake_is_one_line_naming_the_file_the_tool_and_the_key() {
    let cases = [
        (
            GOOD.replace("risk = \"low\"", "risk = \"low\"\ncolour = \"red\""),
            "tool \"echo_args\"",
            "colour",
        ),
        (
            GOOD.replace(
                "type = \"object\", properties",
                "type = \"objekt\", properties",
            ),
            "tool \"echo_args\"",
            "parameters",
        ),
        (
            GOOD.replace(
                "command = [\"cat\"]",
                "command = [\"cat\"]\nhttp = \"http://127.0.0.1:1/\"",
            ),
            "tool \"echo_args\"",
            "http",
        ),
        (format!("{GOOD}{GOOD}"), "tool \"echo_args\"", "name"),
        (
            GOOD.replace("[\"cat\"]", "[\"no-such-program-here\"]"),
            "tool \"echo_args\"",
            "command",
        ),
        (
            GOOD.replace("name = \"echo_args\"\n", ""),
            "tool #1",
            "name",
        ),
        (
            GOOD.replace("risk = \"low\"", "risk = \"severe\""),
            "tool \"echo_args\"",
            "risk",
        ),
        (
            GOOD.replace(
                "properties = { step = { type = \"string\" } }",
                "properties = { step = { type = 5 } }",
            ),
            "tool \"echo_args\"",
            "parameters",
        ),
        ("[[tool]\n".to_owned(), "the file", "not a tools file"),
    ];
    for (text, place, key) in cases {
        let f = file(&text);
        let err = Tools::load(f.path()).expect_err(&text);
        let line = err.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(line.starts_with(&f.path().display().to_string()), "{line}");
        assert_eq!(err.place, place, "{line}");
        assert!(line.contains(key), "{key} in {line}");
    }
    let _ = std::io::stdout().flush();
}
