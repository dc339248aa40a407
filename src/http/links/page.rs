//! The pages of a decision link: small, legible on a phone (390 px wide),
//! working without JavaScript, every text escaped.

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::Value;

use serde::Deserialize;

use crate::notify::links::Token;
use crate::protocol::question::Question;
use crate::protocol::{PauseData, RiskLevel, TaskSpec, TaskState};
use crate::run::door::Outcome;
use crate::run::inbox::Interaction;
use crate::store::PauseNote;
use actix_web::http::header;

const STYLE: &str = "body{font:16px/1.45 system-ui,sans-serif;margin:0 auto;max-width:40rem;\
padding:1rem;color:#111}h1{font-size:1.25rem}ol{padding-left:1.2rem}li{margin:.6rem 0}\
code,pre{font:13px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;\
background:#f3f3f3;padding:.2rem .3rem;display:block}.risk{font-weight:600}\
.high{color:#a00}.medium{color:#a60}.meta{color:#555}\
button{font-size:1rem;padding:.7rem 1.1rem;margin:.3rem .4rem .3rem 0;min-width:8rem}\
.confirm{background:#0a5;color:#fff;border:0}.cancel{background:#fff;border:1px solid #999}\
.task{font-size:.9rem;padding:.4rem .7rem;min-width:0}\
label{display:block;margin:.3rem 0}input[type=text]{font-size:1rem;width:100%}\
pre.preview{white-space:pre;word-break:normal;overflow:auto;max-height:20rem;background:#fffbe6;\
border:1px solid #eee2b0}pre.preview.failed{background:#fdecec;border-color:#f3b9b9}";

/// Escapes `text` for HTML text and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page; `outcome` (one line) is also its `X-Chatgate-Outcome` header,
/// for a Slack button's reply and a replica that passed the request on.
fn document(status: StatusCode, title: &str, body: &str, outcome: &str) -> HttpResponse {
    let mut response = html(
        status,
        format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
             <title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>",
            escape(title)
        ),
    );
    let ascii: String = outcome
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .take(300)
        .collect();
    if let Ok(value) = header::HeaderValue::from_str(&ascii) {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static(OUTCOME), value);
    }
    response
}

/// The header that says, in one line, what a link's request did.
pub const OUTCOME: &str = "x-chatgate-outcome";

/// A token that is not one: nothing said about why.
pub fn not_found() -> HttpResponse {
    document(
        StatusCode::NOT_FOUND,
        "Not found",
        "<h1>Not found</h1>",
        "not found",
    )
}

pub fn gone(_token: &Token) -> HttpResponse {
    document(
        StatusCode::GONE,
        "No longer waiting",
        "<h1>This decision is no longer waiting</h1><p>It was decided, it expired, or its run \
         ended.</p>",
        "No longer waiting: it was decided, it expired, or its run ended",
    )
}

/// The page of what a decision did.
pub fn of(outcome: Outcome) -> HttpResponse {
    match outcome {
        Outcome::NotFound => not_found(),
        Outcome::Gone => document(
            StatusCode::GONE,
            "No longer waiting",
            "<h1>This decision is no longer waiting</h1><p>It was decided, it expired, or its \
             run ended.</p>",
            "No longer waiting: it was decided, it expired, or its run ended",
        ),
        Outcome::Refused(why) => refused(&why),
        Outcome::AlreadyApproved(label) => document(
            StatusCode::CONFLICT,
            "Already approved",
            &format!(
                "<h1>You approved it already</h1><p>{} approved this pause before; it waits \
                 for the other approvals. Nothing more was recorded.</p>",
                escape(&label)
            ),
            &format!("Already approved by {label}: it waits for the others"),
        ),
        Outcome::Unavailable => unavailable(),
        Outcome::Unknown => document(
            StatusCode::GATEWAY_TIMEOUT,
            "Not known yet",
            "<h1>Not known yet</h1><p>Whether your decision was taken is not known yet: it is \
             being settled. Open this link again in a few seconds to see what became of the \
             pause.</p>",
            "Not known yet: open the link again in a few seconds",
        ),
        Outcome::AlreadyDecided(note) => decided(&note),
        Outcome::Decided { label, decided } => match (&decided.progress, &decided.partial) {
            (Some(progress), _) => recorded(&label, progress.approvals.len(), progress.required),
            (None, Some(partial)) => tasks_recorded(&label, partial),
            (None, None) => done(decided.action.as_str(), &label),
        },
    }
}

/// Some tasks decided on their own (`decide`): which, and what is left;
/// the link (reloaded) shows the pause with the tasks still pending.
fn tasks_recorded(label: &str, partial: &crate::confirmation::quorum::Partial) -> HttpResponse {
    let mut named: Vec<String> = partial
        .now
        .0
        .iter()
        .map(|d| format!("task {}: {}", d.index, d.verdict.as_str()))
        .collect();
    named.extend(partial.approving.iter().map(|task| task.progress()));
    let pending: Vec<String> = partial.pending.iter().map(usize::to_string).collect();
    document(
        StatusCode::OK,
        "Decision recorded",
        &format!(
            "<h1>Recorded</h1><p>{} as {}. Still pending: task(s) {}. <a href=\"\">Back to the \
             pause</a></p>",
            escape(&named.join(", ")),
            escape(label),
            escape(&pending.join(", "))
        ),
        &format!(
            "Recorded: {} by {label}; pending {}",
            named.join(", "),
            pending.join(", ")
        ),
    )
}

pub fn unavailable() -> HttpResponse {
    document(
        StatusCode::SERVICE_UNAVAILABLE,
        "Try again",
        "<h1>Not available just now</h1><p>Try again in a few seconds.</p>",
        "Not available just now: try again",
    )
}

pub fn refused(why: &str) -> HttpResponse {
    document(
        StatusCode::FORBIDDEN,
        "Not decided",
        &format!("<h1>Nothing was decided</h1><p>{}</p>", escape(why)),
        &format!("Nothing was decided: {why}"),
    )
}

pub fn decided(note: &PauseNote) -> HttpResponse {
    let Some(decided) = &note.decided else {
        return document(
            StatusCode::CONFLICT,
            "Decided",
            "<h1>Already decided</h1>",
            "Already decided",
        );
    };
    let at = crate::clock::rfc3339_ms(decided.at_ms);
    document(
        StatusCode::CONFLICT,
        "Already decided",
        &format!(
            "<h1>Already decided</h1><p><b>{}</b> by <b>{}</b> at {}.</p><p>Nothing more was \
             decided.</p>",
            escape(decided.action.as_str()),
            escape(&decided.by),
            escape(&at)
        ),
        &format!(
            "Already decided: {} by {}",
            decided.action.as_str(),
            decided.by
        ),
    )
}

pub fn recorded(label: &str, count: usize, required: usize) -> HttpResponse {
    document(
        StatusCode::OK,
        "Approval recorded",
        &format!(
            "<h1>Your approval is recorded</h1><p>{} of {required} approvals, as {}. It waits \
             for the others.</p>",
            count,
            escape(label)
        ),
        &format!("Approval recorded: {count} of {required} ({label})"),
    )
}

pub fn done(action: &str, label: &str) -> HttpResponse {
    let what = match action {
        "confirm" => "Confirmed",
        "cancel" => "Cancelled",
        "answer" => "Answered",
        "skip" => "Skipped",
        other => other,
    };
    document(
        StatusCode::OK,
        what,
        &format!("<h1>{what}</h1><p>Decided as {}.</p>", escape(label)),
        &format!("{what} by {label}"),
    )
}

/// The pending pause `item`, decided as `label`: the card and its actions.
pub fn pause(item: &Interaction, label: &str) -> HttpResponse {
    let mut body = String::new();
    let heading = item
        .summary
        .as_deref()
        .or(item.title.as_deref())
        .unwrap_or("Decide");
    body.push_str(&format!("<h1>{}</h1>", escape(heading)));
    let mut meta = format!(
        "from {} · expires {}",
        escape(&item.key),
        escape(&item.expires_at)
    );
    if let Some(risk) = item.risk_level.as_ref().and_then(Value::as_str) {
        meta = format!(
            "<span class=\"risk {0}\">{0} risk</span> · {meta}",
            escape(risk)
        );
    }
    if let (Some(approvals), Some(required)) = (&item.approvals, item.required) {
        meta.push_str(&format!(
            " · {} of {required} approvals{}",
            approvals.len(),
            if approvals.is_empty() {
                String::new()
            } else {
                format!(" ({})", escape(&approvals.join(", ")))
            }
        ));
    }
    if let Some(group) = &item.escalated_to {
        meta.push_str(&format!(" · escalated to {}", escape(group)));
    }
    body.push_str(&format!("<p class=\"meta\">{meta}</p>"));
    body.push_str("<form method=\"post\">");
    // What the kind asks, and its buttons: read from its typed data.
    let (asked, buttons) = match PauseData::deserialize(&item.confirmation_data) {
        Ok(PauseData::Approval(plan)) => {
            let confirm = "<button class=\"confirm\" name=\"action\" value=\"confirm\">\
                           Confirm</button>";
            let may = item.may_approve != Some(false);
            // Task by task where the plan has several (#42: a task that
            // needs several approvals counts them on its own).
            let one_by_one = may && plan.tasks.len() > 1;
            (
                tasks(&plan.tasks, one_by_one),
                if may { confirm } else { "" },
            )
        }
        Ok(PauseData::Question(asked)) => (
            asked.questions.iter().map(question).collect(),
            "<button class=\"confirm\" name=\"action\" value=\"answer\">Answer</button>\
             <button class=\"cancel\" name=\"action\" value=\"skip\">Skip</button>",
        ),
        Ok(PauseData::Reconcile(call)) => {
            let args = call.task.args.as_ref().map(Value::to_string);
            let asked = format!(
                "<p>{}</p><ol><li value=\"{}\"><b>{}</b> <code>{}</code></li></ol>\
                 <p class=\"meta\">Idempotency key <code>{}</code> · attempt {} started {}</p>",
                escape(&call.message),
                call.task.index,
                escape(&call.task.tool),
                escape(args.as_deref().unwrap_or("")),
                escape(&call.idempotency_key),
                call.attempt,
                escape(&call.started_at),
            );
            let may = item.may_approve != Some(false);
            let buttons = if may {
                "<button class=\"confirm\" name=\"action\" value=\"run_again\">Run again</button>\
                 <button class=\"cancel\" name=\"action\" value=\"skip\">Skip</button>"
            } else {
                "<button class=\"cancel\" name=\"action\" value=\"skip\">Skip</button>"
            };
            (asked, buttons)
        }
        Err(_) => (String::new(), ""),
    };
    body.push_str(&asked);
    body.push_str(&format!(
        "<p class=\"meta\">You decide as <b>{}</b>.</p>",
        escape(label)
    ));
    body.push_str(buttons);
    if let Some(why) = &item.why_not {
        body.push_str(&format!("<p>You cannot confirm: {}.</p>", escape(why)));
    }
    body.push_str(
        "<button class=\"cancel\" name=\"action\" value=\"cancel\">Cancel the run</button></form>",
    );
    document(StatusCode::OK, heading, &body, "pending")
}

/// A plan's tasks: a pending one with a box to reject it (with the
/// confirm) and buttons to decide it alone (`decide`); one decided on its
/// own with its state.
fn tasks(tasks: &[TaskSpec], one_by_one: bool) -> String {
    let mut body = String::from("<ol>");
    for task in tasks {
        let index = task.index;
        let decide = match task.state {
            None | Some(TaskState::Pending) if !one_by_one => format!(
                "<label><input type=\"checkbox\" name=\"reject\" value=\"{index}\"> reject \
                 this task</label>"
            ),
            None | Some(TaskState::Pending) => format!(
                "<label><input type=\"checkbox\" name=\"reject\" value=\"{index}\"> reject \
                 this task</label> <button class=\"task\" name=\"task\" \
                 value=\"approve:{index}\">Approve only this</button><button class=\"task\" \
                 name=\"task\" value=\"reject:{index}\">Reject only this</button>"
            ),
            Some(state) => format!("<b>{}</b>", state.as_str()),
        };
        let risk = task.risk_level.map_or("", RiskLevel::as_str);
        let args = task
            .args
            .as_ref()
            .map(|a| serde_json::to_string_pretty(a).unwrap_or_default());
        // What it would do (#43), and the digest a decision here names.
        let pending = matches!(task.state, None | Some(TaskState::Pending));
        let preview = task.preview.as_ref().map_or_else(String::new, |p| {
            let digest = if pending {
                format!(
                    "<input type=\"hidden\" name=\"digest.{index}\" value=\"{}\">",
                    escape(&p.digest)
                )
            } else {
                String::new()
            };
            format!(
                "<div>{label}{cut}</div><pre class=\"preview{failed}\">{body}</pre>{digest}",
                label = if p.ok {
                    "Preview: what it would do"
                } else {
                    "The preview failed"
                },
                cut = if p.truncated {
                    " (cut: longer than shown)"
                } else {
                    ""
                },
                failed = if p.ok { "" } else { " failed" },
                body = escape(&p.body),
            )
        });
        body.push_str(&format!(
            "<li><b>{}</b> <span class=\"risk {1}\">({1} risk)</span><br>{2}{3}{preview}{decide}</li>",
            escape(&task.tool),
            escape(risk),
            escape(&task.description),
            args.map(|a| format!("<code>{}</code>", escape(&a)))
                .unwrap_or_default(),
        ));
    }
    body.push_str("</ol>");
    body
}

/// One question's inputs: its options (radio or checkboxes), and a text
/// field where it takes other text or has no options.
fn question(q: &Question) -> String {
    let id = escape(&q.id);
    let mut body = format!("<fieldset><legend>{}</legend>", escape(&q.question));
    for option in &q.options {
        body.push_str(&format!(
            "<label><input type=\"{}\" name=\"a.{id}\" value=\"{}\"> {}</label>",
            if q.multi_select { "checkbox" } else { "radio" },
            escape(&option.id),
            escape(&option.label)
        ));
    }
    if q.options.is_empty() || q.allow_other {
        body.push_str(&format!(
            "<label>{}<input type=\"text\" name=\"a.{id}\"></label>",
            if q.options.is_empty() { "" } else { "Other: " }
        ));
    }
    body.push_str("</fieldset>");
    body
}

/// The `Content-Security-Policy` of every link page: nothing but its own
/// inline style and a form posted to itself.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                       frame-ancestors 'none'; base-uri 'none'";

fn html(status: actix_web::http::StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("content-security-policy", CSP))
        .insert_header(("referrer-policy", "no-referrer"))
        .insert_header(("x-robots-tag", "noindex"))
        .body(body)
}
