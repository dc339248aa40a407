use serde_json::json;

use super::*;

fn rules(text: &str) -> Result<Rules, RuleError> {
    #[derive(serde::Deserialize)]
    struct File {
        rule: Vec<toml::Value>,
    }
    let file: File = toml::from_str(text).unwrap();
    Rules::parse(file.rule)
}

/// The decision of the enforcing rule, by name, for a call.
fn decided(rules: &Rules, tool: &str, args: Value, key: &str) -> Option<(String, RuleDecision)> {
    rules
        .evaluate(tool, &args, key)
        .enforced
        .map(|rule| (rule.name.clone(), rule.decision))
}

#[test]
fn the_first_enforcing_match_decides_and_shadows_before_it_are_recorded() {
    let rules = rules(
        r#"
[[rule]]
name = "watch"
tool = "deploy"
decision = "deny"
mode = "shadow"

[[rule]]
name = "staging deploys"
tool = "deploy"
args = { "/env" = "staging-*", "/replicas" = { max = 5 } }
decision = "allow"
reason = "staging is ours"

[[rule]]
name = "no prod"
tool = "dep*"
args = { "/env" = "prod" }
decision = "deny"

[[rule]]
name = "after"
tool = "*"
decision = "ask"
mode = "shadow"
"#,
    )
    .unwrap();

    let ruling = rules.evaluate("deploy", &json!({"env": "staging-eu", "replicas": 3}), "k");
    assert_eq!(ruling.enforced.unwrap().name, "staging deploys");
    let shadows: Vec<&str> = ruling.shadowed.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        shadows,
        ["watch"],
        "a shadow after the decision never decided"
    );

    assert_eq!(
        decided(
            &rules,
            "deploy",
            json!({"env": "staging-eu", "replicas": 6}),
            "k"
        ),
        None,
        "every entry must match"
    );
    assert_eq!(
        decided(&rules, "deploy", json!({"env": "prod"}), "k"),
        Some(("no prod".to_owned(), RuleDecision::Deny))
    );
    assert_eq!(
        decided(&rules, "deploy", json!({"env": "production"}), "k"),
        None,
        "a glob without wildcards is equality"
    );
    let none = rules.evaluate("other", &json!({}), "k");
    assert!(none.enforced.is_none());
    assert_eq!(none.shadowed.len(), 1, "`*` matches every tool");
}

#[test]
fn every_matcher_kind_matches_what_it_says() {
    let rules = rules(
        r#"
[[rule]]
name = "m"
tool = "t"
decision = "allow"
args = { "/n" = { min = 2, max = 4.5 }, "/s" = { regex = "ab+c" }, "/o" = { one_of = ["x", 1] }, "/e" = { equals = { a = [1, 2] } }, "/gone" = { exists = false }, "/here" = { exists = true }, "/g" = "a?c*" }
"#,
    )
    .unwrap();
    let good =
        json!({"n": 4.5, "s": "abbc", "o": 1.0, "e": {"a": [1, 2.0]}, "here": null, "g": "abc-d"});
    assert!(decided(&rules, "t", good.clone(), "k").is_some());
    let changes = [
        ("/n", json!(1.99)),
        ("/n", json!("3")),
        ("/s", json!("xabbc")),
        ("/s", json!("abbcx")),
        ("/o", json!("y")),
        ("/e", json!({"a": [1]})),
        ("/g", json!("xbc")),
    ];
    for (pointer, value) in changes {
        let mut args = good.clone();
        *args.pointer_mut(pointer).unwrap() = value.clone();
        assert!(
            decided(&rules, "t", args, "k").is_none(),
            "{pointer} = {value} must not match"
        );
    }
    let mut args = good.clone();
    args.as_object_mut().unwrap().remove("here");
    assert!(decided(&rules, "t", args, "k").is_none(), "exists = true");
    let mut args = good.clone();
    args.as_object_mut()
        .unwrap()
        .insert("gone".into(), json!(0));
    assert!(decided(&rules, "t", args, "k").is_none(), "exists = false");
    // A glob sees a number's JSON form.
    let rules2 = self::rules(
        "[[rule]]\nname = \"n\"\ntool = \"t\"\ndecision = \"deny\"\nargs = { \"/a/0\" = \"1*\" }\n",
    )
    .unwrap();
    assert!(decided(&rules2, "t", json!({"a": [15]}), "k").is_some());
    assert!(decided(&rules2, "t", json!({"a": [25]}), "k").is_none());
    assert!(
        decided(&rules2, "t", json!({"a": []}), "k").is_none(),
        "unresolved"
    );
}

#[test]
fn keys_limit_a_rule_to_their_labels() {
    let rules = rules(
        "[[rule]]\nname = \"bots\"\ntool = \"t\"\ndecision = \"allow\"\nkeys = [\"ci-bot\", \"key-2\"]\n",
    )
    .unwrap();
    assert!(decided(&rules, "t", json!({}), "key-2").is_some());
    assert!(decided(&rules, "t", json!({}), "ci-bot").is_some());
    assert!(decided(&rules, "t", json!({}), "key-1").is_none());
    assert!(
        rules.denies("t", &json!({}), "key-2").is_none(),
        "it allows"
    );
}

#[test]
fn every_mistake_names_the_rule_and_the_key() {
    let base = "[[rule]]\nname = \"r\"\ntool = \"t\"\ndecision = \"allow\"\n";
    let cases = [
        (format!("{base}colour = \"red\"\n"), "rule \"r\"", "colour"),
        (base.replace("name = \"r\"\n", ""), "rule #1", "name"),
        (base.replace("\"r\"", "\"r/1\""), "rule \"r/1\"", "name"),
        (format!("{base}{base}"), "rule \"r\"", "name"),
        (
            base.replace("\"allow\"", "\"maybe\""),
            "rule \"r\"",
            "decision",
        ),
        (
            base.replace("decision = \"allow\"\n", ""),
            "rule \"r\"",
            "decision",
        ),
        (format!("{base}mode = \"dry\"\n"), "rule \"r\"", "mode"),
        (format!("{base}keys = []\n"), "rule \"r\"", "keys"),
        (
            format!("{base}args = {{ env = \"x\" }}\n"),
            "rule \"r\"",
            "args",
        ),
        (
            format!("{base}args = {{ \"/a~2\" = \"x\" }}\n"),
            "rule \"r\"",
            "args",
        ),
        (
            format!("{base}args = {{ \"/a\" = {{ regex = \"(\" }} }}\n"),
            "rule \"r\"",
            "regex",
        ),
        (
            format!("{base}args = {{ \"/a\" = {{ regex = \"\\\\w{{1000}}\" }} }}\n"),
            "rule \"r\"",
            "size limit",
        ),
        (
            format!("{base}args = {{ \"/a\" = {{ like = 1 }} }}\n"),
            "rule \"r\"",
            "like",
        ),
        (
            format!("{base}args = {{ \"/a\" = {{ equals = 1, exists = true }} }}\n"),
            "rule \"r\"",
            "exactly one",
        ),
        (
            format!("{base}args = {{ \"/a\" = {{ min = \"1\" }} }}\n"),
            "rule \"r\"",
            "min",
        ),
        (
            format!("{base}args = {{ \"/a\" = 5 }}\n"),
            "rule \"r\"",
            "args",
        ),
    ];
    for (text, place, key) in cases {
        let err = rules(&text).expect_err(&text);
        assert_eq!(err.place, place, "{text}: {}", err.message);
        assert!(err.message.contains(key), "{key} in {}", err.message);
        assert!(err.message.contains("`"), "{}", err.message);
    }
}

#[test]
fn the_bounds_hold() {
    let many: String = (0..=MAX_RULES)
        .map(|i| format!("[[rule]]\nname = \"r{i}\"\ntool = \"t\"\ndecision = \"allow\"\n"))
        .collect();
    let err = rules(&many).unwrap_err();
    assert!(err.message.contains("at most 256"), "{}", err.message);
    let at_most: String = (0..MAX_RULES)
        .map(|i| format!("[[rule]]\nname = \"r{i}\"\ntool = \"t\"\ndecision = \"allow\"\n"))
        .collect();
    assert_eq!(rules(&at_most).unwrap().len(), MAX_RULES);

    let matchers: Vec<String> = (0..=MAX_MATCHERS)
        .map(|i| format!("\"/a{i}\" = \"x\""))
        .collect();
    let text = format!(
        "[[rule]]\nname = \"r\"\ntool = \"t\"\ndecision = \"allow\"\nargs = {{ {} }}\n",
        matchers.join(", ")
    );
    let err = rules(&text).unwrap_err();
    assert!(err.message.contains("at most 16"), "{}", err.message);
}

#[test]
fn a_rule_whose_tool_matches_nothing_is_refused() {
    let rules = rules(
        "[[rule]]\nname = \"fs\"\ntool = \"fs__*\"\ndecision = \"deny\"\n\n[[rule]]\nname = \"typo\"\ntool = \"deplyo\"\ndecision = \"deny\"\n",
    )
    .unwrap();
    let err = rules
        .check_tools(["deploy", "fs__read"].into_iter())
        .unwrap_err();
    assert_eq!(err.place, "rule \"typo\"");
    assert!(err.message.contains("key `tool`"), "{}", err.message);
    assert!(rules
        .check_tools(["deplyo", "fs__read"].into_iter())
        .is_ok());
}

#[test]
fn the_example_rules_file_loads_and_decides_as_it_says() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules.toml");
    let tools = crate::tools::Tools::load(&path).unwrap();
    let rules = tools.rules();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    rules.check_tools(names.into_iter()).unwrap();
    let step = |text: &str| json!({ "step": text });
    assert_eq!(
        decided(rules, "write_note", step("write_note todo: buy milk"), "k"),
        Some(("todo notes".to_owned(), RuleDecision::Allow))
    );
    assert_eq!(
        decided(
            rules,
            "write_note",
            step("write_note my Password is x"),
            "k"
        ),
        Some(("no secrets in notes".to_owned(), RuleDecision::Deny))
    );
    assert_eq!(
        decided(rules, "write_note", step("write_note call mum"), "k"),
        None
    );
    let echo = rules.evaluate("http_echo", &step("hi"), "k");
    assert!(echo.enforced.is_none());
    assert_eq!(echo.shadowed[0].name, "echo watch");
}

#[test]
fn a_regex_and_a_glob_match_across_lines() {
    let rules = rules(
        r#"
[[rule]]
name = "no prod regex"
tool = "deploy"
args = { "/env" = { regex = "prod.*" } }
decision = "deny"

[[rule]]
name = "no prod glob"
tool = "ship"
args = { "/env" = "prod*" }
decision = "deny"
"#,
    )
    .unwrap();
    for (tool, name) in [("deploy", "no prod regex"), ("ship", "no prod glob")] {
        assert_eq!(
            decided(&rules, tool, json!({"env": "prod\nx"}), "k"),
            Some((name.to_owned(), RuleDecision::Deny)),
            "{tool}"
        );
    }
}
