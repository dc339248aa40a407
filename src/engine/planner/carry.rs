//! Carrying out a decided plan, step by step and in order: a step runs as
//! soon as it and every step before it are decided (#42), so a `decide` of
//! step 1 runs it while the pause waits on for the rest, and the whole
//! decision runs what is left. [`Carried`] is where that stands between
//! two decisions.

use serde_json::{Map, Value};

use super::steps::{call_of, has_word, step_of, tool_for};
use crate::protocol::{meta, ChunkType, Decisions, ErrorType, Verdict};
use crate::run::context::policy::Route;
use crate::run::context::{Cleared, RunContext};
use crate::run::outcome::{Completion, RunError};
use crate::run::NOT_RUN_AGAIN;
use crate::tools::ToolOutcome;

/// The decisions a round of carrying out goes by.
pub(super) struct Decided<'a> {
    pub(super) decisions: &'a Decisions,
    /// The pause is decided (every task has its verdict); else only the
    /// tasks `decisions` names are, the others still pending.
    pub(super) whole: bool,
}

/// How far a plan is carried out, and what came of its steps.
#[derive(Debug, Default)]
pub(super) struct Carried {
    /// The index (0-based) of the next step to carry out.
    next: usize,
    done: usize,
    rejected: usize,
    denied: usize,
    /// Steps started before a restart and not run again.
    not_again: usize,
    /// Something was carried out since the pause was last waited on.
    ran: bool,
    /// The pause waits on for the steps still pending.
    pub(super) waiting: bool,
    /// A step to put to the person again, with the steps after it, in a
    /// new round (#43): its effect changed since it was approved, or it
    /// was edited and has a preview. Nothing after it runs meanwhile.
    pub(super) reask: Option<Reask>,
    /// Steps carried out (or decided) in earlier rounds of this plan, no
    /// longer among its steps.
    pub(super) base: usize,
}

/// A step put to the person again: its place (0-based) and, for an edit,
/// the edited step.
#[derive(Debug)]
pub(super) struct Reask {
    pub(super) from: usize,
    pub(super) edited: Option<String>,
}

impl Carried {
    /// Whether something was carried out since the last wait (and from now
    /// on, not).
    pub(super) fn take_ran(&mut self) -> bool {
        std::mem::take(&mut self.ran)
    }

    /// The steps from `from` on become the plan of a new round: what ran
    /// before them stays counted.
    pub(super) fn again(&mut self, from: usize) {
        self.base += from;
        self.next = 0;
        self.ran = false;
        self.waiting = false;
        self.reask = None;
    }

    /// The run's completion once every one of its `total` steps is through.
    pub(super) fn completion(&self, total: usize) -> Completion {
        let Carried {
            done,
            rejected,
            denied,
            not_again,
            ..
        } = *self;
        let mut metadata = Map::new();
        metadata.insert(meta::TASKS_COMPLETED.to_owned(), Value::from(done));
        metadata.insert(meta::TASKS_REJECTED.to_owned(), Value::from(rejected));
        if denied > 0 {
            metadata.insert(meta::TASKS_DENIED.to_owned(), Value::from(denied));
        }
        metadata.insert(meta::TOTAL_TASKS.to_owned(), Value::from(total));
        let answered = total - done - rejected - denied - not_again;
        let mut others = String::new();
        if denied > 0 {
            others.push_str(&format!(", {denied} denied by rules"));
        }
        if not_again > 0 {
            others.push_str(&format!(", {not_again} not run again after a restart"));
        }
        let text = if done == total {
            format!("Completed {total} task(s).")
        } else if done == 0 {
            format!(
                "Nothing ran: {rejected} of {total} task(s) rejected{others}, {answered} \
                 answered for."
            )
        } else {
            format!(
                "Completed {done} of {total} task(s); {rejected} rejected{others}, {answered} \
                 answered for, as decided."
            )
        };
        Completion { text, metadata }
    }
}

/// Carries out the steps from where `at` stands, as `decided`, in order,
/// up to the first step still pending (all of them once the pause is
/// decided). A step a rule denied is not run (it was reported before
/// anything was asked).
pub(super) async fn execute(
    ctx: &mut RunContext,
    steps: &[String],
    decided: Decided<'_>,
    routes: &[Route],
    at: &mut Carried,
) -> Result<(), RunError> {
    let total = steps.len();
    let Decided { decisions, whole } = decided;
    while let Some(step) = steps.get(at.next) {
        if at.reask.is_some() {
            // Nothing after a step put to the person again runs before it.
            return Ok(());
        }
        let index = at.next + 1;
        let (name, called) = call_of(step, ctx.tools());
        let mut approved_by = None;
        if let Some(route) = routes.get(at.next) {
            if matches!(route, Route::Deny { .. }) {
                at.denied += 1;
                at.next += 1;
                continue;
            }
            approved_by = route.approved_by();
        }
        // A task the decision does not name was not in the pause (a rule
        // left it out): it runs only if a rule or a grant allows it now,
        // never on a yes that did not see it (a plan restored after the
        // rules changed).
        let unseen = Verdict::Reject {
            reason: Some("it was not in the confirmation that was decided".to_owned()),
        };
        let verdict = match decisions.named(index) {
            Some(verdict) => verdict,
            // Still pending: the pause waits on for it.
            None if !whole => return Ok(()),
            None if approved_by.is_some() || decisions.0.is_empty() => &Verdict::Approve,
            None => &unseen,
        };
        at.next += 1;
        at.ran = true;
        if !ctx.start_task(index).await? {
            let skipped = ToolOutcome::skipped(false, None, Some(NOT_RUN_AGAIN.to_owned()));
            Box::pin(ctx.record_tool(index, &name, None, &skipped)).await?;
            at.not_again += 1;
            continue;
        }
        let args = match verdict {
            Verdict::Reject { reason } => {
                let why = reason.as_deref().unwrap_or("rejected by the user");
                let skipped = ToolOutcome::skipped(false, None, Some(format!("rejected: {why}")));
                Box::pin(ctx.record_tool(index, &name, None, &skipped)).await?;
                at.rejected += 1;
                continue;
            }
            Verdict::Respond { result } => {
                let answered = ToolOutcome::skipped(true, Some(result.clone()), None);
                Box::pin(ctx.record_tool(index, &name, None, &answered)).await?;
                continue;
            }
            Verdict::Edit { args } if previewed(ctx, &name) => {
                // Never run unseen: the edited call is asked again, its
                // own preview on the card.
                at.reask = Some(Reask {
                    from: index - 1,
                    edited: Some(step_of(&name, args, ctx.tools())),
                });
                return Ok(());
            }
            Verdict::Edit { args } => {
                // The person decided what runs; the rules see it again.
                approved_by = None;
                if let Some(tool) = ctx.tools().get(&name).cloned() {
                    if let Route::Deny { rule, reason } = ctx.route_edited(&tool, args).await? {
                        ctx.denied(index, &name, &rule, reason.as_deref()).await?;
                        at.denied += 1;
                        continue;
                    }
                }
                args.clone()
            }
            Verdict::Approve => called,
        };
        // What runs, as it runs: an edited step shows its new arguments.
        let shown = match verdict {
            Verdict::Edit { args } => match args.get("step").and_then(Value::as_str) {
                Some(text) => format!("{text} (edited)"),
                None => format!("{name} {args} (edited)"),
            },
            _ => step.clone(),
        };
        let status = ctx
            .chunk(ChunkType::Status, format!("Step {index}/{total}: {shown}"))
            .with_meta(meta::STEP, index)
            .with_meta(meta::TOTAL_TASKS, total);
        ctx.send(status).await?;
        let outcome = match ctx.tools().get(&name).cloned() {
            // A declared tool: the real call, once, after the yes.
            Some(tool) => {
                Box::pin(ctx.run_tool(index, &tool, &args, Cleared::or_person(approved_by))).await?
            }
            None => simulate(ctx, index, step).await?,
        };
        if outcome.changed.is_some() {
            // Not run: put to the person again, with what follows.
            at.reask = Some(Reask {
                from: index - 1,
                edited: None,
            });
            return Ok(());
        }
        if !outcome.ok {
            return Err(RunError::Failed {
                error_type: ErrorType::TaskFailed,
                message: format!(
                    "Step {index} failed: {}",
                    outcome.error.as_deref().unwrap_or(step)
                ),
            });
        }
        at.done += 1;
    }
    Ok(())
}

/// Whether `name` is a declared tool with a preview.
fn previewed(ctx: &RunContext, name: &str) -> bool {
    ctx.tools()
        .get(name)
        .is_some_and(|tool| tool.preview.is_some())
}

/// A step without a declared tool: `--step-delay` of pretend work; the word
/// `fail` fails it.
async fn simulate(ctx: &mut RunContext, index: usize, step: &str) -> Result<ToolOutcome, RunError> {
    let started = std::time::Instant::now();
    ctx.sleep(ctx.step_delay()).await?;
    let failed = has_word(step, |w| w == "fail");
    let text = if failed {
        format!("Step {index} failed: {step}")
    } else {
        format!("Step {index} done: {step}")
    };
    let mut outcome = ToolOutcome::skipped(!failed, None, None);
    outcome.skipped = false;
    outcome.duration_ms = started.elapsed().as_millis() as u64;
    if failed {
        outcome.error = Some(step.to_owned());
    } else {
        outcome.result = Some(text.clone());
    }
    // Nothing real ran: said on the chunk, so a client never takes it for a call.
    let chunk = ctx
        .tool_output(index, &tool_for(step), &outcome, Some(text))
        .with_meta(meta::SIMULATED, true);
    ctx.send(chunk).await?;
    Ok(outcome)
}
