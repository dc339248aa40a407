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

#[test]
fn a_preview_is_declared_in_the_form_of_its_tool_and_a_mistake_names_the_key() {
    let with = |keys: &str| {
        GOOD.replace(
            "command = [\"cat\"]",
            &format!("command = [\"cat\"]\n{keys}"),
        )
    };
    let tools = Tools::load(
        file(&with(
            "preview = [\"cat\"]\npreview_timeout = \"2s\"\nrecheck = true",
        ))
        .path(),
    )
    .unwrap();
    let tool = tools.get("echo_args").unwrap();
    let preview = tool.preview.as_ref().expect("a preview");
    assert_eq!(preview.timeout, std::time::Duration::from_secs(2));
    assert!(tool.recheck);
    let default = Tools::load(file(&with("preview = [\"cat\"]")).path()).unwrap();
    assert_eq!(
        default
            .get("echo_args")
            .unwrap()
            .preview
            .as_ref()
            .unwrap()
            .timeout,
        crate::tools::preview::DEFAULT_PREVIEW_TIMEOUT
    );
    for (keys, says) in [
        ("recheck = true", "key `recheck`: needs a preview"),
        ("preview = [\"no-such-program-x\"]", "key `preview`"),
        (
            "preview = [\"cat\"]\npreview_timeout = \"1h\"",
            "key `preview_timeout`",
        ),
        (
            "preview_http = \"http://127.0.0.1:1/p\"",
            "key `preview_http`: only for `http` tools",
        ),
        (
            "preview = [\"cat\"]\npreview_http = \"http://127.0.0.1:1/p\"",
            "keys `preview` and `preview_http`",
        ),
    ] {
        let err = Tools::load(file(&with(keys)).path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tool \"echo_args\"") && err.contains(says),
            "{keys}: {err}"
        );
    }
}
