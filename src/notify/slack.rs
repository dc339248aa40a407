//! Slack, to its documented formats: the Block Kit message an incoming
//! webhook posts for a pause (`--slack-webhook`), and the check of an
//! interactivity request's signature (`--slack-signing-secret`):
//! `X-Slack-Signature` = `v0=` + hex HMAC-SHA256(secret, `v0:` + timestamp
//! + `:` + raw body), `X-Slack-Request-Timestamp` within 5 minutes.

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::protocol::{PauseData, RiskLevel};

/// How far an interactivity request's timestamp may be from now (Slack's
/// own advice: 5 minutes), in seconds.
pub const MAX_SKEW_SECS: u64 = 300;
/// Characters of a task's arguments a message shows (Slack's section text
/// is at most 3,000).
pub const ARGS_SHOWN: usize = 1_500;
/// Tasks a message lists (a message has at most 50 blocks).
pub const TASKS_SHOWN: usize = 20;
/// Most characters of a task's preview a message shows (#43); a longer
/// one is cut, and approved on the decision page, where it is whole.
pub const PREVIEW_SHOWN: usize = 1_000;

/// Whether `signature` signs `body` sent at `timestamp` with `secret`,
/// within [`MAX_SKEW_SECS`] of `now_secs` (compared in constant time).
pub fn verify(secret: &str, timestamp: &str, signature: &str, body: &[u8], now_secs: u64) -> bool {
    let Ok(at) = timestamp.parse::<u64>() else {
        return false;
    };
    if at.abs_diff(now_secs) > MAX_SKEW_SECS {
        return false;
    }
    let Some(hex) = signature.strip_prefix("v0=") else {
        return false;
    };
    let Ok(given) = hex::decode(hex) else {
        return false;
    };
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// The message for the approval pause whose `confirmation_data` is `data`
/// (asked by the requester labelled `key`): a header, the summary, one
/// section per task (tool, risk, arguments), the expiry, and Approve and
/// Reject buttons whose `value` is `token` (a decision token naming no
/// one: the button's presser is named by their Slack user id). When the
/// message cuts anything (more than [`TASKS_SHOWN`] tasks, arguments over
/// [`ARGS_SHOWN`] characters) there is no Approve: nobody approves what
/// they were not shown; a button opens the full pause on the page (`page`,
/// with `--public-url`) instead.
pub fn message(
    pause: &PauseData,
    key: &str,
    summary: &str,
    token: &str,
    page: Option<&str>,
) -> Value {
    let card = super::Card::of(Some(pause));
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": "Approval needed", "emoji": false}}),
        json!({"type": "section", "text": {"type": "mrkdwn",
            "text": format!("*{}*\nfrom {} · {} risk\n{}", escape(summary), escape(key), escape(card.risk),
                escape(&card.who_decides))}}),
    ];
    let tasks = card.tasks;
    let mut cut = tasks.len() > TASKS_SHOWN;
    // A plan of several tasks: each shown task has its own buttons, which
    // decide it alone (#42).
    let per_task = tasks.len() > 1;
    // The previews shown, by task: an Approve names what it showed
    // (`<token> <index>:<digest>,...` as its value).
    let mut digests = Vec::new();
    for task in tasks.iter().take(TASKS_SHOWN) {
        let args = task.args.as_ref().map(Value::to_string).unwrap_or_default();
        let mut task_cut = args.chars().count() > ARGS_SHOWN;
        let preview = task.preview.as_ref().map(|p| {
            let shown: String = p.body.chars().take(PREVIEW_SHOWN).collect();
            let short = p.truncated || shown.len() < p.body.len();
            task_cut |= short;
            digests.push(format!("{}:{}", task.index, p.digest));
            format!(
                "\n{}{}\n```{}```",
                if p.ok {
                    "Preview"
                } else {
                    "The preview failed"
                },
                if short {
                    " (cut: open the page for all of it)"
                } else {
                    ""
                },
                escape(&shown).replace("```", "'''"),
            )
        });
        cut |= task_cut;
        let args: String = if args.chars().count() > ARGS_SHOWN {
            args.chars().take(ARGS_SHOWN).collect::<String>() + "…"
        } else {
            args
        };
        blocks.push(
            json!({"type": "section", "text": {"type": "mrkdwn", "text": format!(
                "*{}. {}* ({} risk)\n{}\n```{}```{}",
                task.index,
                escape(&task.tool),
                escape(task.risk_level.map_or("", RiskLevel::as_str)),
                escape(&task.description),
                escape(&args).replace("```", "'''"),
                preview.unwrap_or_default(),
            )}}),
        );
        if per_task {
            blocks.push(task_buttons(task.index, task_cut, token, &digests));
        }
    }
    if tasks.len() > TASKS_SHOWN {
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn",
            "text": format!("and {} more task(s): open the page to see them", tasks.len() - TASKS_SHOWN)}]}));
    }
    blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn",
        "text": format!("Expires {}", escape(card.expires_at))}]}));
    let approve = json!({"type": "button", "action_id": "approve", "style": "primary",
        "text": {"type": "plain_text", "text": "Approve"}, "value": with_digests(token, &digests)});
    let reject = json!({"type": "button", "action_id": "reject", "style": "danger",
        "text": {"type": "plain_text", "text": "Reject"}, "value": token});
    let run_again = pause.kind().asks_run_again();
    let elements = if run_again {
        // Whether a call a crash cut short runs again (#44).
        if let Some(message) = pause.message() {
            blocks.insert(
                2,
                json!({"type": "section", "text": {"type": "mrkdwn", "text": escape(message)}}),
            );
        }
        vec![
            json!({"type": "button", "action_id": "run_again", "style": "primary",
                "text": {"type": "plain_text", "text": "Run again"}, "value": token}),
            json!({"type": "button", "action_id": "skip",
                "text": {"type": "plain_text", "text": "Skip"}, "value": token}),
            json!({"type": "button", "action_id": "reject", "style": "danger",
                "text": {"type": "plain_text", "text": "Cancel the run"}, "value": token}),
        ]
    } else if cut {
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn",
            "text": "Not all of this plan fits here: approve it where it is shown whole \
                     (the decision page, the inbox)"}]}));
        let mut elements = Vec::new();
        if let Some(page) = page {
            elements.push(json!({"type": "button", "action_id": "open",
                "text": {"type": "plain_text", "text": "Open the whole plan"}, "url": page}));
        }
        elements.push(reject);
        elements
    } else {
        vec![approve, reject]
    };
    blocks.push(json!({"type": "actions", "block_id": "chatgate_decision", "elements": elements}));
    let needed = match run_again {
        true => "Decision needed",
        false => "Approval needed",
    };
    blocks[0]["text"]["text"] = json!(needed);
    json!({"text": format!("{needed}: {summary}"), "blocks": blocks})
}

/// The buttons that decide task `index` alone: `approve_task_<index>` (not
/// when its arguments were `cut`: nobody approves what they were not
/// shown) and `reject_task_<index>`, each carrying `token`.
fn task_buttons(index: usize, cut: bool, token: &str, digests: &[String]) -> Value {
    let mut elements = Vec::new();
    if !cut {
        let own: Vec<String> = digests
            .iter()
            .filter(|d| {
                d.split_once(':')
                    .is_some_and(|(i, _)| i == index.to_string())
            })
            .cloned()
            .collect();
        elements.push(
            json!({"type": "button", "action_id": format!("{APPROVE_TASK}{index}"),
            "text": {"type": "plain_text", "text": format!("Approve {index}")},
            "value": with_digests(token, &own)}),
        );
    }
    elements.push(
        json!({"type": "button", "action_id": format!("{REJECT_TASK}{index}"),
        "text": {"type": "plain_text", "text": format!("Reject {index}")}, "value": token}),
    );
    json!({"type": "actions", "block_id": format!("chatgate_task_{index}"), "elements": elements})
}

/// An Approve button's value: the decision token, then the previews it
/// showed (`<index>:<digest>`, comma-separated) after a space.
fn with_digests(token: &str, digests: &[String]) -> String {
    if digests.is_empty() {
        token.to_owned()
    } else {
        format!("{token} {}", digests.join(","))
    }
}

/// A button's value read back: the token, and the preview digests it
/// showed by task index.
pub fn read_value(value: &str) -> (&str, Vec<(usize, &str)>) {
    let (token, digests) = value.split_once(' ').unwrap_or((value, ""));
    let digests = digests
        .split(',')
        .filter_map(|d| {
            let (index, digest) = d.split_once(':')?;
            Some((index.parse().ok()?, digest))
        })
        .collect();
    (token, digests)
}

/// What a task's buttons' `action_id` starts with (then its index).
pub const APPROVE_TASK: &str = "approve_task_";
pub const REJECT_TASK: &str = "reject_task_";

/// What a pressed button asks: the whole pause (`approve`: confirm;
/// `reject`: cancel), or one task (`approve_task_<i>`, `reject_task_<i>`:
/// a `decide` of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Button {
    Approve,
    Reject,
    /// A reconcile pause's `run_again` and `skip` (#44).
    RunAgain,
    Skip,
    ApproveTask(usize),
    RejectTask(usize),
}

impl Button {
    pub fn of(action_id: &str) -> Option<Button> {
        let task = |prefix: &str| action_id.strip_prefix(prefix)?.parse::<usize>().ok();
        match action_id {
            "approve" => Some(Button::Approve),
            "reject" => Some(Button::Reject),
            "run_again" => Some(Button::RunAgain),
            "skip" => Some(Button::Skip),
            _ => task(APPROVE_TASK)
                .map(Button::ApproveTask)
                .or_else(|| task(REJECT_TASK).map(Button::RejectTask)),
        }
    }
}

/// The `blocks` of a message chatgate posted (`message`, as a
/// `block_actions` payload carries it) with `text` as its progress line
/// (a context block `chatgate_progress`, replaced on each approval), its
/// buttons kept; `None` when the payload carries no blocks.
pub fn with_progress(message: &Value, text: &str) -> Option<Vec<Value>> {
    let mut blocks: Vec<Value> = message
        .get("blocks")?
        .as_array()?
        .iter()
        .filter(|block| block["block_id"] != PROGRESS_BLOCK)
        .cloned()
        .collect();
    let progress = json!({"type": "context", "block_id": PROGRESS_BLOCK,
        "elements": [{"type": "mrkdwn", "text": escape(text)}]});
    // Just above the buttons, where the presser looks.
    let at = blocks
        .iter()
        .position(|block| block["type"] == "actions")
        .unwrap_or(blocks.len());
    blocks.insert(at, progress);
    Some(blocks)
}

/// The `block_id` of a message's progress line.
const PROGRESS_BLOCK: &str = "chatgate_progress";

/// Escapes `&`, `<` and `>` as Slack's text formatting asks.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("v0:{timestamp}:").as_bytes());
        mac.update(body);
        format!("v0={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn a_signature_is_checked_with_its_timestamp() {
        let body = b"payload=%7B%7D";
        let good = sign("s3cret", "1000", body);
        assert!(verify("s3cret", "1000", &good, body, 1000));
        assert!(verify("s3cret", "1000", &good, body, 1300));
        assert!(!verify("s3cret", "1000", &good, body, 1301), "stale");
        assert!(
            !verify("s3cret", "1000", &good, b"payload=x", 1000),
            "altered"
        );
        assert!(
            !verify("other", "1000", &good, body, 1000),
            "another secret"
        );
        assert!(
            !verify("s3cret", "1001", &good, body, 1000),
            "another timestamp"
        );
        assert!(!verify("s3cret", "1000", &good[3..], body, 1000), "no v0=");
        assert!(!verify("s3cret", "soon", &good, body, 1000));
    }

    fn plan(risk: &str, tasks: Value) -> PauseData {
        serde_json::from_value(json!({"confirmation_id": "c-1", "confirmation_round": 1,
            "options": ["confirm", "cancel"], "timeout_seconds": 60,
            "expires_at": "2026-11-27T18:00:00Z", "risk_level": risk, "tasks": tasks}))
        .unwrap()
    }

    #[test]
    fn a_reconcile_pause_has_run_again_skip_and_cancel_buttons() {
        let data: PauseData = serde_json::from_value(json!({"kind": "reconcile",
            "confirmation_id": "c-2", "title": "Did task 1 (mark) take effect?",
            "message": "The server stopped while task 1 (mark) was running",
            "task": {"index": 1, "tool": "mark", "description": "mark", "args": {},
                     "risk_level": "high"},
            "idempotency_key": "k", "started_at": "2026-11-27T17:00:00Z", "attempt": 1,
            "options": ["run_again", "skip", "cancel"], "risk_level": "high",
            "required": 2, "approvers": ["leads"],
            "timeout_seconds": 60, "expires_at": "2026-11-27T18:00:00Z"}))
        .unwrap();
        let message = message(&data, "ci-bot", "Did task 1 take effect?", "tok", None);
        let blocks = message["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["text"]["text"], "Decision needed");
        let text = message["blocks"].to_string();
        assert!(text.contains("The server stopped while task 1"), "{text}");
        assert!(text.contains("Needs 2 approvals of leads"), "{text}");
        let actions = &blocks.last().unwrap()["elements"];
        let ids: Vec<&str> = (0..3)
            .map(|i| actions[i]["action_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["run_again", "skip", "reject"]);
        assert!((0..3).all(|i| actions[i]["value"] == "tok"));
        assert_eq!(Button::of("run_again"), Some(Button::RunAgain));
        assert_eq!(Button::of("skip"), Some(Button::Skip));
    }

    #[test]
    fn a_message_has_the_tasks_and_two_buttons_carrying_the_token() {
        let data = plan(
            "high",
            json!([{"index": 1, "tool": "deploy", "risk_level": "high",
                    "description": "deploy <web>", "args": {"step": "deploy web"}}]),
        );
        let message = message(&data, "ci-bot", "Confirm the plan?", "tok", None);
        let blocks = message["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "header");
        let task = blocks[2]["text"]["text"].as_str().unwrap();
        assert!(
            task.starts_with("*1. deploy* (high risk)\ndeploy &lt;web&gt;"),
            "{task}"
        );
        let actions = &blocks.last().unwrap()["elements"];
        assert_eq!(actions[0]["action_id"], "approve");
        assert_eq!(actions[1]["action_id"], "reject");
        assert_eq!(actions[0]["value"], "tok");
        assert_eq!(actions[1]["value"], "tok");
    }

    #[test]
    fn a_preview_is_shown_and_approve_names_its_digest_unless_it_is_cut() {
        let task = |body: &str| {
            json!([{"index": 1, "tool": "put", "description": "", "risk_level": "low",
            "args": {}, "preview": {"ok": true, "body": body, "truncated": false, "digest": "d1"}}])
        };
        let message = message(&plan("low", task("old <b>")), "ci-bot", "s", "tok", None);
        let blocks = message["blocks"].as_array().unwrap();
        let text = blocks[2]["text"]["text"].as_str().unwrap();
        assert!(text.contains("Preview\n```old &lt;b&gt;```"), "{text}");
        let actions = &blocks.last().unwrap()["elements"];
        assert_eq!(actions[0]["value"], "tok 1:d1");
        assert_eq!(read_value("tok 1:d1"), ("tok", vec![(1, "d1")]));
        assert_eq!(read_value("tok"), ("tok", vec![]));

        let long = "x".repeat(PREVIEW_SHOWN + 1);
        let cut = super::message(
            &plan("low", task(&long)),
            "ci-bot",
            "s",
            "tok",
            Some("https://gate/d/t"),
        );
        let blocks = cut["blocks"].as_array().unwrap();
        let actions = blocks.last().unwrap()["elements"].as_array().unwrap();
        assert!(
            actions.iter().all(|a| a["action_id"] != "approve"),
            "{actions:?}"
        );
        assert!(actions.iter().any(|a| a["url"] == "https://gate/d/t"));
    }

    #[test]
    fn a_message_that_cuts_anything_offers_no_approve() {
        let task = |index: usize, args: Value| json!({"index": index, "tool": "deploy", "description": "", "risk_level": "low", "args": args});
        let long = plan(
            "low",
            json!([task(1, json!({"step": "x".repeat(ARGS_SHOWN)}))]),
        );
        let many = plan(
            "low",
            (1..=TASKS_SHOWN + 1)
                .map(|i| task(i, json!({})))
                .collect::<Value>(),
        );
        for data in [long, many] {
            let message = message(&data, "ci-bot", "s", "tok", Some("https://gate/#session=s"));
            let blocks = message["blocks"].as_array().unwrap();
            let actions = blocks.last().unwrap()["elements"].as_array().unwrap();
            let ids: Vec<&str> = actions
                .iter()
                .map(|a| a["action_id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["open", "reject"], "{message}");
            assert_eq!(actions[0]["url"], "https://gate/#session=s");
        }
    }

    #[test]
    fn a_plan_of_several_tasks_has_buttons_for_each_task() {
        let task = |index: usize, args: Value| json!({"index": index, "tool": "deploy", "description": "", "risk_level": "low", "args": args});
        let data = plan(
            "low",
            json!([
                task(1, json!({})),
                task(2, json!({"step": "x".repeat(ARGS_SHOWN)}))
            ]),
        );
        let message = message(&data, "ci-bot", "s", "tok", None);
        let blocks = message["blocks"].as_array().unwrap();
        let ids = |block_id: &str| -> Vec<String> {
            let block = blocks.iter().find(|b| b["block_id"] == block_id).unwrap();
            let elements = block["elements"].as_array().unwrap();
            assert!(elements.iter().all(|e| e["value"] == "tok"));
            elements
                .iter()
                .map(|e| e["action_id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids("chatgate_task_1"), ["approve_task_1", "reject_task_1"]);
        // Task 2's arguments were cut: it may be rejected, not approved.
        assert_eq!(ids("chatgate_task_2"), ["reject_task_2"]);
        assert_eq!(Button::of("approve_task_12"), Some(Button::ApproveTask(12)));
        assert_eq!(Button::of("reject_task_1"), Some(Button::RejectTask(1)));
        assert_eq!(Button::of("approve"), Some(Button::Approve));
        assert_eq!(Button::of("approve_task_x"), None);
        assert_eq!(Button::of("open"), None);
    }
}
