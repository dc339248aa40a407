//! The question rules and answer normalization, case by case.

#[test]
fn a_typed_question_says_what_it_expects_in_words() {
    let cases = [
        (
            json!({"type": "integer", "minimum": 1, "maximum": 5}),
            "an integer from 1 to 5",
        ),
        (
            json!({"type": "number", "maximum": 1.5}),
            "a number of at most 1.5",
        ),
        (
            json!({"type": "string", "maxLength": 20, "pattern": "^[a-z]+$"}),
            "a text of at most 20 characters, matching ^[a-z]+$",
        ),
        (
            json!({"type": "string", "format": "email"}),
            "a text in the email format",
        ),
        (
            json!({"type": "string", "enum": ["a", "b"]}),
            "one of: a, b",
        ),
        (json!({"type": "boolean"}), "yes or no (true or false)"),
    ];
    for (schema, words) in cases {
        assert_eq!(in_words(&schema), words);
    }
}
use serde_json::json;

use super::*;

fn region() -> Question {
    serde_json::from_value(json!({
        "id": "region", "header": "Region", "question": "Where should it be deployed?",
        "options": [{"id": "eu-west", "label": "eu-west", "description": "Frankfurt"},
                    {"id": "us-east", "label": "US East"}],
        "allow_other": true, "required": true
    }))
    .unwrap()
}

fn checks() -> Question {
    serde_json::from_value(json!({
        "id": "checks", "question": "Which checks?", "multi_select": true,
        "options": [{"id": "lint", "label": "Lint"}, {"id": "test", "label": "Tests"},
                    {"id": "fuzz", "label": "Fuzz"}]
    }))
    .unwrap()
}

fn count() -> Question {
    serde_json::from_value(json!({
        "id": "count", "question": "How many?", "required": true,
        "schema": {"type": "integer", "minimum": 1, "maximum": 10}
    }))
    .unwrap()
}

fn note() -> Question {
    serde_json::from_value(json!({
        "id": "note", "question": "Anything to tell the team?",
        "schema": {"type": "string", "maxLength": 5}
    }))
    .unwrap()
}

#[test]
fn questions_within_the_bounds_pass_and_each_bound_is_checked() {
    assert_eq!(
        check_questions(&[region(), checks(), count(), note()]),
        Ok(())
    );

    let mut five = vec![region(), checks(), count(), note(), note()];
    five[4].id = "fifth".into();
    let mut twice = vec![region(), region()];
    twice[1].header = "Again".into();
    let mut one_option = region();
    one_option.options.truncate(1);
    let mut long_header = region();
    long_header.header = "x".repeat(25);
    let mut bad_id = region();
    bad_id.id = "no spaces".into();
    let mut remote = count();
    remote.schema = Some(json!({"type": "string", "$ref": "http://example.com/s"}));
    let mut object = count();
    object.schema = Some(json!({"type": "object"}));
    let mut huge = note();
    huge.question = "x".repeat(MAX_QUESTION_CHARS + 1);
    let cases: [(Vec<Question>, &str); 9] = [
        (vec![], "1 to 4"),
        (five, "1 to 4"),
        (twice, "used twice"),
        (vec![one_option], "none or 2 to 8"),
        (vec![long_header], "header"),
        (vec![bad_id], "A-Z a-z 0-9"),
        (vec![remote], "`$ref`"),
        (vec![object], "string, number, integer or boolean"),
        (vec![huge], "1-1000 characters"),
    ];
    for (questions, says) in cases {
        let err = check_questions(&questions).unwrap_err().to_string();
        assert!(err.contains(says), "{err} should say {says}");
    }
}

#[test]
fn a_text_matches_an_option_id_then_its_label_else_it_is_the_other_answer() {
    let q = [region()];
    let answer = |text| normalize_text(&q, text).map(|a| a["region"].clone());
    assert_eq!(answer("EU-WEST"), Ok(json!("eu-west")));
    assert_eq!(answer(" us east "), Ok(json!("US East")));
    assert_eq!(answer("us-east"), Ok(json!("US East")));
    assert_eq!(answer("ap-south, please"), Ok(json!("ap-south, please")));
    let mut closed = region();
    closed.allow_other = false;
    let err = normalize_text(&[closed], "ap-south")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("region") && err.contains("eu-west (eu-west)"),
        "{err}"
    );
}

#[test]
fn multi_select_takes_a_comma_list_and_answers_labels_in_option_order() {
    let q = [checks()];
    let answers = normalize_text(&q, "fuzz, lint").unwrap();
    assert_eq!(answers["checks"], json!(["Lint", "Fuzz"]));
    let given = json!({"checks": ["Tests", "lint", "test"]});
    let answers = normalize_answers(&q, given.as_object().unwrap()).unwrap();
    assert_eq!(answers["checks"], json!(["Lint", "Tests"]));
    assert!(
        normalize_text(&q, "lint, nope").is_err(),
        "no other text allowed"
    );
}

#[test]
fn typed_questions_parse_text_by_their_schema_and_check_it() {
    let q = [count()];
    assert_eq!(normalize_text(&q, "3").unwrap()["count"], json!(3));
    let err = normalize_text(&q, "11").unwrap_err().to_string();
    assert!(err.contains("count") && err.contains("integer"), "{err}");
    assert!(normalize_text(&q, "three").is_err());
    let given = json!({"count": 4});
    assert_eq!(
        normalize_answers(&q, given.as_object().unwrap()).unwrap()["count"],
        json!(4)
    );
    let q = [note()];
    assert!(normalize_text(&q, "too long").is_err(), "maxLength 5");
    assert_eq!(normalize_text(&q, "ok").unwrap()["note"], json!("ok"));
}

#[test]
fn answers_need_every_required_question_and_no_unknown_one() {
    let q = [region(), count(), note()];
    let ok = json!({"region": "eu-west", "count": "2"});
    let answers = normalize_answers(&q, ok.as_object().unwrap()).unwrap();
    assert_eq!(answers.get("note"), None, "an optional question left out");
    assert_eq!(answers["count"], json!(2));
    let missing = json!({"region": "eu-west"});
    let err = normalize_answers(&q, missing.as_object().unwrap()).unwrap_err();
    assert!(err.to_string().contains("`count` is required"), "{err}");
    let unknown = json!({"region": "eu-west", "count": 1, "colour": "red"});
    let err = normalize_answers(&q, unknown.as_object().unwrap()).unwrap_err();
    assert!(err.to_string().contains("no question `colour`"), "{err}");
    let err = normalize_text(&q, "eu-west").unwrap_err();
    assert!(err.to_string().contains("\"answers\""), "{err}");
}

#[test]
fn an_answer_over_its_bound_is_refused() {
    let q = [note()];
    let long = "x".repeat(MAX_ANSWER_BYTES + 1);
    let err = normalize_text(&q, &long).unwrap_err().to_string();
    assert!(err.contains("over 4096 bytes"), "{err}");
}
