//! `planner`: the embedded, deterministic default engine.
//!
//! - A message ending in `?` is a question: the answer streams as `content`
//!   chunks (one per word), then `completion`. No confirmation.
//! - Anything else is a task: `task_init`, a plan (the message split into
//!   steps), a confirmation; on confirm every step gives a `status` and a
//!   `tool_output` chunk, then `completion`. On modify the plan gains the step
//!   `Apply feedback: <text>` and is put to the user again (a modify without
//!   text puts the same plan again).
//! - A step that mentions delete/remove/drop/rm makes the plan `high` risk.
//! - A step containing the word `fail` fails, and the run ends with an
//!   `error` chunk of type `task_failed`.
//! - With `--tools`, a step whose first word (lower-cased) names a declared
//!   tool calls it, after the confirm, with `{"step": <description>}` (checked
//!   against the tool's schema before anything is asked: `invalid_tool_args`
//!   otherwise); its risk counts towards the plan's. Other steps stay
//!   simulated. A reply's per-task decisions skip (reject), replace (respond)
//!   or change the arguments of (edit) single steps.
//! - A plan that starts with `ask` steps (see [`ask`]) asks them first, as
//!   one `input_request`: the answers replace `{<id>}` in the later steps
//!   (a skip drops the steps that mention a question, with a `status`
//!   chunk saying which), and the plan that results is confirmed as usual.
//!   An `ask` step is never a tool call.
//!
//! It keeps no state between runs.

pub mod ask;
mod carry;
mod steps;

use self::carry::{Carried, Decided};
pub use self::steps::plan_steps;
use self::steps::{call_of, has_word, refuse_lookalike};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};

use crate::protocol::{meta, ChunkType, ErrorType, RiskLevel, TaskSpec, MAX_CONFIRMATION_BYTES};
use crate::run::context::policy::Route;
use crate::run::context::RunContext;
use crate::run::engine::Engine;
use crate::run::outcome::{Completion, RunError};
use crate::run::plan::{Answers, Approval, Plan, Questions, Resumed};
use crate::tools::Tools;

/// The planner engine; stateless, so one value serves every run.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlannerEngine;

impl Engine for PlannerEngine {
    fn name(&self) -> &'static str {
        "planner"
    }

    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let steps = plan_steps(ctx.message().trim());
            let asked = ask::leading_questions(&steps).map_err(|why| RunError::Failed {
                error_type: ErrorType::InvalidQuestions,
                message: format!("the plan's questions cannot be asked: {why}"),
            })?;
            if let Some(asked) = asked {
                // Only the steps are held through the pause (besides what
                // the pause itself holds): the questions are read from
                // them again once answered.
                let asking = questions(asked, &steps, ctx.durable());
                let answers = Box::pin(ctx.ask(asking)).await?;
                return Box::pin(after_answers(ctx, &steps, answers)).await;
            }
            let message = ctx.message().trim().to_owned();
            if message.ends_with('?') {
                answer(ctx, &message).await
            } else {
                plan_and_carry_out(ctx, steps).await
            }
        }
        .boxed()
    }

    /// The planner's state at a pause is its steps; it goes on from the
    /// decision as if it had never stopped.
    fn resume<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        state: Value,
        resumed: Resumed,
    ) -> Option<BoxFuture<'a, Result<Completion, RunError>>> {
        let steps: Vec<String> = serde_json::from_value(state.get("steps")?.clone()).ok()?;
        match resumed {
            Resumed::Approval(approval) => {
                Some(async move { carry_out(ctx, steps, Some(approval)).await }.boxed())
            }
            // Paused on its leading questions: `steps` are the message's.
            Resumed::Answers(answers) => {
                Some(async move { after_answers(ctx, &steps, answers).await }.boxed())
            }
        }
    }
}

/// The `input_request` of a plan's leading questions; its state (kept by a
/// durable store) is the message's steps, questions included.
fn questions(asked: ask::Asked, steps: &[String], durable: bool) -> Questions {
    let title = match asked.questions.as_slice() {
        [one] => one.question.clone(),
        many => format!("{} questions before the plan", many.len()),
    };
    Questions {
        title,
        questions: asked.questions,
        state: durable.then(|| json!({ "steps": steps })),
    }
}

/// Goes on after the questions `steps` (the message's) start with: the
/// answers put into the later steps (a skip drops the steps that need
/// one), then the plan as usual.
async fn after_answers(
    ctx: &mut RunContext,
    steps: &[String],
    answers: Answers,
) -> Result<Completion, RunError> {
    let asked = match ask::leading_questions(steps) {
        Ok(Some(asked)) => asked,
        // They were asked, so they read the same again; a stored state
        // that does not is not this planner's.
        _ => {
            return Err(RunError::failed(
                ErrorType::Interrupted,
                "the stored steps do not start with the questions that were asked",
            ))
        }
    };
    let given = match &answers {
        Answers::Given(given) => Some(given),
        Answers::Skipped => None,
    };
    let ask::Applied {
        kept: steps,
        dropped,
    } = ask::apply_answers(
        &asked.steps,
        &asked.questions,
        given,
        MAX_CONFIRMATION_BYTES,
    )
    .map_err(|ask::TooLarge| RunError::Failed {
        error_type: ErrorType::PlanTooLarge,
        message: format!(
            "the steps with their answers are over {MAX_CONFIRMATION_BYTES} bytes; \
                 at most that can be confirmed"
        ),
    })?;
    if !dropped.is_empty() {
        let text = format!(
            "Dropped {} step(s) that needed an answer: {}",
            dropped.len(),
            dropped.join("; ")
        );
        ctx.emit(ChunkType::Status, text).await?;
    }
    if steps.is_empty() {
        let mut metadata = Map::new();
        metadata.insert(meta::TASKS_COMPLETED.to_owned(), Value::from(0));
        return Ok(Completion {
            text: "Nothing left to do: no step remains to carry out.".to_owned(),
            metadata,
        });
    }
    plan_and_carry_out(ctx, steps).await
}

/// Announces the plan of `steps` (`task_init`), then asks for it and
/// carries it out.
async fn plan_and_carry_out(
    ctx: &mut RunContext,
    steps: Vec<String>,
) -> Result<Completion, RunError> {
    let init = ctx
        .chunk(
            ChunkType::TaskInit,
            format!("Planning {} step(s)", steps.len()),
        )
        .with_meta(meta::TOTAL_TASKS, steps.len());
    ctx.send(init).await?;
    carry_out(ctx, steps, None).await
}

async fn answer(ctx: &mut RunContext, question: &str) -> Result<Completion, RunError> {
    let text = format!(
        "You asked: \"{question}\". I am chatgate's built-in planner: I answer questions \
         directly and ask for your confirmation before carrying out any task. Send a task, \
         such as \"create a report; then email it\", to see a plan."
    );
    // Token-by-token, the way a model streams; a tenth of the step delay apart.
    let token_delay = ctx.step_delay() / 10;
    for (i, word) in text.split_inclusive(' ').enumerate() {
        if i > 0 && !token_delay.is_zero() {
            ctx.sleep(token_delay).await?;
        }
        ctx.emit(ChunkType::Content, word).await?;
    }
    Ok(Completion {
        text: "Answered.".to_owned(),
        metadata: Map::new(),
    })
}

/// Asks for `steps` (unless `answered`, the decision on them taken before a
/// restart) until confirmed, carrying out each step as soon as it and
/// every step before it are decided (#42: a `decide` of step 1 runs it
/// while the pause waits on for the rest). Each round the rules of the
/// tools file route every call first: denied calls are reported and left
/// out, allowed ones are listed as such, and a plan with nothing left to
/// ask pauses nowhere.
async fn carry_out(
    ctx: &mut RunContext,
    mut steps: Vec<String>,
    mut answered: Option<Approval>,
) -> Result<Completion, RunError> {
    // Each round's routes (a grant's call is spent when it is routed, so
    // they are kept through the pause, not worked out again).
    let mut routes = Vec::new();
    let mut carried = Carried::default();
    loop {
        let approval = match answered.take() {
            Some(approval) => {
                // Restored after its pause: the rules route as they did.
                routes = routes_of(ctx, &steps);
                approval
            }
            None if carried.waiting => Box::pin(ctx.confirm_rest(carried.take_ran())).await?,
            None => {
                let plan = Box::pin(prepare(ctx, &steps, &mut routes)).await?;
                ctx.confirm_as_decided(plan).await?
            }
        };
        let (decisions, whole) = match approval {
            Approval::Confirm(decisions) => (decisions, true),
            Approval::Partly(decisions) => (decisions, false),
            Approval::Modify(feedback) if feedback.trim().is_empty() => {
                // A modify without text: the same plan, asked again.
                carried = Carried::default();
                ctx.emit(ChunkType::Status, "No change given; asking again")
                    .await?;
                continue;
            }
            Approval::Modify(feedback) => {
                carried = Carried::default();
                steps.push(format!("Apply feedback: {}", feedback.trim()));
                ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                    .await?;
                continue;
            }
        };
        // Boxed: what carrying out needs is allocated when it starts, not
        // held in this future (and so in every paused run) for the whole
        // pause.
        let decided = Decided {
            decisions: &decisions,
            whole,
        };
        Box::pin(carry::execute(ctx, &steps, decided, &routes, &mut carried)).await?;
        if whole {
            if let Some(reask) = carried.reask.take() {
                // #43: a step whose effect changed, or an edit of a
                // previewed step, goes to the person again with the steps
                // after it, in a new round showing its preview now.
                let mut rest = steps.split_off(reask.from);
                let why = match reask.edited {
                    Some(edited) => {
                        rest[0] = edited;
                        "an edited task is not run unseen"
                    }
                    None => "a task's effect changed since it was approved",
                };
                steps = rest;
                carried.again(reask.from);
                ctx.emit(ChunkType::Status, format!("Asking again: {why}"))
                    .await?;
                continue;
            }
            return Ok(carried.completion(steps.len() + carried.base));
        }
        carried.waiting = true;
    }
}

/// Every step's route, worked out again without recording anything (a
/// step without a declared tool is asked: the planner always asks).
fn routes_of(ctx: &RunContext, steps: &[String]) -> Vec<Route> {
    steps
        .iter()
        .map(|step| {
            let (name, args) = call_of(step, ctx.tools());
            match ctx.tools().get(&name) {
                Some(tool) => ctx.route_quietly(tool, &args, true),
                None => Route::Ask,
            }
        })
        .collect()
}

/// The plan of `steps` as it is put to the person, once the rules have
/// routed (and recorded) every call: with nothing in it that needs a yes,
/// [`RunContext::confirm`] asks nothing.
async fn prepare(
    ctx: &mut RunContext,
    steps: &[String],
    routes: &mut Vec<Route>,
) -> Result<Plan, RunError> {
    let plan = plan(steps, ctx.tools(), ctx.durable())?;
    *routes = route_plan(ctx, &plan).await?;
    Ok(asked(plan, routes))
}

/// Routes the calls of `plan` through the rules, recording every match
/// and reporting every denied call (before anything is asked).
async fn route_plan(ctx: &mut RunContext, plan: &Plan) -> Result<Vec<Route>, RunError> {
    let mut routes = Vec::with_capacity(plan.tasks.len());
    for task in &plan.tasks {
        let Some(tool) = ctx.tools().get(&task.tool).cloned() else {
            routes.push(Route::Ask);
            continue;
        };
        let args = task.args.clone().unwrap_or_default();
        let risk = task.risk_level.unwrap_or(tool.risk);
        let route = ctx.route(&tool, &args, true, risk).await?;
        if let Route::Deny { rule, reason } = &route {
            ctx.denied(task.index, &tool.name, rule, reason.as_deref())
                .await?;
        }
        routes.push(route);
    }
    Ok(routes)
}

/// What of `plan` is put to the person: the tasks no rule denied, those a
/// rule allowed marked so.
fn asked(mut plan: Plan, routes: &[Route]) -> Plan {
    let total = plan.tasks.len();
    let route = |index: usize| &routes[index - 1];
    plan.tasks
        .retain(|task| !matches!(route(task.index), Route::Deny { .. }));
    for task in &mut plan.tasks {
        task.approved_by = route(task.index).approved_by();
    }
    let denied = total - plan.tasks.len();
    if denied > 0 {
        plan.risk_level = plan
            .tasks
            .iter()
            .filter_map(|task| task.risk_level)
            .max()
            .unwrap_or(RiskLevel::Low);
        plan.summary = format!(
            "Confirm {} of the plan's {total} task(s)? ({denied} denied by rules)",
            plan.tasks.len()
        );
    }
    plan
}

/// The plan of `steps`; a step that calls a declared tool with arguments
/// that do not fit it ends the run here, before anything is asked.
fn plan(steps: &[String], tools: &Tools, durable: bool) -> Result<Plan, RunError> {
    let mut risk = RiskLevel::Low;
    let mut tasks = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        refuse_lookalike(i + 1, step, tools)?;
        let (tool, args) = call_of(step, tools);
        let mut own = if has_word(step, |w| {
            ["delet", "remov", "drop"].iter().any(|p| w.starts_with(p)) || w == "rm"
        }) {
            RiskLevel::High
        } else {
            RiskLevel::Low
        };
        if let Some(declared) = tools.get(&tool) {
            declared.check_args(&args).map_err(|why| RunError::Failed {
                error_type: ErrorType::InvalidToolArgs,
                message: format!(
                    "step {} (`{step}`) does not fit the tool `{tool}`: {why}",
                    i + 1
                ),
            })?;
            own = own.max(declared.risk);
        }
        risk = risk.max(own);
        tasks.push(TaskSpec {
            index: i + 1,
            description: step.clone(),
            tool,
            args: Some(args),
            risk_level: Some(own),
            ..TaskSpec::default()
        });
    }
    Ok(Plan {
        summary: format!("Confirm the plan of {} task(s)?", steps.len()),
        tasks,
        risk_level: risk,
        // Only a durable store keeps it (and then the planner can resume).
        state: durable.then(|| json!({ "steps": steps })),
    })
}

#[cfg(test)]
mod tests {
    use super::steps::tool_for;
    use super::*;

    #[test]
    fn risk_is_high_only_when_a_step_mentions_removal() {
        let risk = |m: &str| {
            plan(&plan_steps(m), &Tools::default(), false)
                .unwrap()
                .risk_level
        };
        assert_eq!(risk("create a file; email it"), RiskLevel::Low);
        assert_eq!(risk("back up; Delete old logs"), RiskLevel::High);
        assert_eq!(risk("rm -rf build"), RiskLevel::High);
        assert_eq!(risk("drop the table"), RiskLevel::High);
        assert_eq!(risk("removing cache"), RiskLevel::High);
        assert_eq!(risk("confirm the form"), RiskLevel::Low);
    }

    #[test]
    fn tasks_carry_index_tool_and_args() {
        let plan = plan(
            &plan_steps("Create a file; then email it"),
            &Tools::default(),
            false,
        )
        .unwrap();
        assert_eq!(plan.tasks.len(), 2);
        assert_eq!(plan.tasks[1].index, 2);
        assert_eq!(plan.tasks[1].description, "email it");
        assert_eq!(plan.tasks[1].tool, "email");
        assert_eq!(plan.tasks[0].tool, "create");
        assert_eq!(tool_for("write_note: buy milk"), "write_note");
        assert_eq!(tool_for("Deploy-Web now"), "deploy-web");
        assert_eq!(tool_for("rm -rf build"), "rm");
        assert_eq!(tool_for("-- ..."), "task");
        assert_eq!(plan.tasks[0].args, Some(json!({"step": "Create a file"})));
    }
}

#[cfg(test)]
mod size {
    use super::*;
    use crate::confirmation::{ConfirmationManager, RunLimits};
    use crate::run::replay::{Replay, ReplayLimits};
    use crate::run::settings::RunSettings;
    use crate::run::stop::RunStop;
    use crate::session::SessionKey;
    use std::sync::Arc;

    /// The planner's future is what a paused planner run holds for the whole
    /// pause (around the 600-byte `confirm` future): carrying out and the
    /// records at the end are boxed so that they do not enlarge it (a tool
    /// call inline made it 2.2 KiB more per paused run; docs/benchmarks.md).
    #[tokio::test]
    async fn the_future_a_paused_planner_run_holds_stays_small() {
        let manager = ConfirmationManager::new();
        let slot = manager
            .begin_run(SessionKey::new(None, "s"), RunLimits::total(1))
            .unwrap()
            .now();
        let stop = RunStop::default();
        let limits = ReplayLimits {
            frames: 8,
            bytes: 1 << 20,
        };
        let log = Replay::new(limits, stop.clone());
        let settings = Arc::new(RunSettings::default());
        let mut ctx = RunContext::new("a".into(), slot, settings, log, stop, Arc::default());

        let paused = carry_out(&mut ctx, vec![], None);

        let size = std::mem::size_of_val(&paused);
        println!("carry_out future is {size} bytes");
        assert!(size <= 960, "carry_out future is {size} bytes");
    }
}
