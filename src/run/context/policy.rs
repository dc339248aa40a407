//! The rules of the tools file applied to a call an engine is about to
//! make, with the exact arguments that would run: whether it is asked,
//! runs without asking, or never runs. Every rule that matches is
//! recorded before the call goes on (a `policy` audit record, fail
//! closed, and `chatgate_policy_decisions_total`).

use crate::run::journal::CallEvent;
use crate::session::run_log;
use serde_json::Value;

use super::RunContext;
use crate::pause::plan_check::{PlanCheck, TaskCheck};
use crate::protocol::{meta, ApprovedBy, ErrorType, TaskSpec};
use crate::run::outcome::RunError;
use crate::tools::gate::Gate;
use crate::tools::rules::Ruling;
use crate::tools::{RuleDecision, Tool, ToolOutcome};

/// What happens to a call once the rules have spoken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// It runs without asking: a rule allowed it (`Some`), or its tool
    /// needs no confirmation and no rule says otherwise (`None`).
    Allow(Option<ApprovedBy>),
    /// A person decides.
    Ask,
    /// A `deny` rule: never run, never asked.
    Deny {
        rule: String,
        reason: Option<String>,
    },
}

impl Route {
    /// The decision word the `policy` record's `actual` gives.
    fn as_decision(&self) -> RuleDecision {
        match self {
            Route::Allow(_) => RuleDecision::Allow,
            Route::Ask => RuleDecision::Ask,
            Route::Deny { .. } => RuleDecision::Deny,
        }
    }

    /// The rule that allowed it, for a task entry or an `executed` record.
    pub fn approved_by(&self) -> Option<ApprovedBy> {
        match self {
            Route::Allow(by) => by.clone(),
            _ => None,
        }
    }
}

impl RunContext {
    /// What a reply's decisions on `tasks` are checked against: their
    /// tools, the rules an edit must pass, `--explicit-decisions`.
    pub(super) fn plan_check(&self, tasks: &[TaskSpec]) -> PlanCheck {
        PlanCheck::of(tasks, &self.settings.tools)
            .with_rules(tasks, &self.settings.tools, self.key_label())
            .explicit(self.settings.explicit_decisions)
            .max_grant_ttl(self.settings.max_grant_ttl)
    }

    /// What the tools file says of waiting on `checks`: how long the pause
    /// waits (until its first task that cancels expires, else its last
    /// task, each task's own `timeout` or `--confirm-timeout`), and (when
    /// every task's tool says `on_timeout = "reject"`) the tasks silence
    /// rejects then. A task that rejects and expires sooner is rejected
    /// alone when it does (see `expiry.rs`).
    pub(super) fn waiting_of(
        &self,
        checks: &PlanCheck,
    ) -> (std::time::Duration, Option<Box<[usize]>>) {
        let own = |task: &&TaskCheck| self.task_timeout(task);
        let cancels = checks
            .tasks
            .iter()
            .filter(|task| !task.gate.rejects_on_timeout())
            .map(|task| own(&task))
            .min();
        let last = checks.tasks.iter().map(|task| own(&task)).max();
        let timeout = cancels.or(last).unwrap_or(self.settings.confirm_timeout);
        let tasks = checks
            .rejects_on_timeout()
            .then(|| checks.tasks.iter().map(|task| task.index).collect());
        (timeout, tasks)
    }

    /// How long `task` waits for its decision: its tool's or rule's
    /// `timeout`, else `--confirm-timeout`.
    pub(super) fn task_timeout(&self, task: &TaskCheck) -> std::time::Duration {
        task.gate.timeout.unwrap_or(self.settings.confirm_timeout)
    }

    /// The requester's key label, as rules (`keys`) and records name it.
    pub(crate) fn key_label(&self) -> String {
        self.settings.namespaces.label(self.session_key().owner)
    }

    /// Where a call of `tool` with `args` goes: the first enforcing rule
    /// that matches decides; with none, `asks` (the engine's default for
    /// the tool). Nothing is recorded: for a decision taken again (a run
    /// restored after its pause).
    pub fn route_quietly(&self, tool: &Tool, args: &Value, asks: bool) -> Route {
        let key = self.key_label();
        let ruling = self.tools().rules().evaluate(&tool.name, args, &key);
        route_of(&ruling, asks)
    }

    /// [`RunContext::route_quietly`], then a live grant for a call that
    /// would be asked (one of its calls spent: `approved_by` the grant),
    /// with every matching rule recorded first: a `policy` audit record (an unwritable log ends the run
    /// before the call goes anywhere) and a metric, shadow rules with what
    /// they would have decided.
    /// `risk`: the call's own risk (a grant covers no call above what its
    /// granting key may decide).
    pub async fn route(
        &mut self,
        tool: &Tool,
        args: &Value,
        asks: bool,
        risk: crate::protocol::RiskLevel,
    ) -> Result<Route, RunError> {
        self.route_with(tool, args, asks, Some(risk)).await
    }

    /// An edited call routed again with its new arguments, after the
    /// person decided it: its rules recorded and a `deny` found, but no
    /// grant spent (the person's yes, not a grant, lets it run; the grant
    /// that routed it before the edit spent its call then).
    pub async fn route_edited(&mut self, tool: &Tool, args: &Value) -> Result<Route, RunError> {
        self.route_with(tool, args, true, None).await
    }

    /// `spends`: a grant may route the call, for a call of this risk.
    async fn route_with(
        &mut self,
        tool: &Tool,
        args: &Value,
        asks: bool,
        spends: Option<crate::protocol::RiskLevel>,
    ) -> Result<Route, RunError> {
        let key = self.key_label();
        let tools = self.tools().clone();
        let ruling = tools.rules().evaluate(&tool.name, args, &key);
        let mut route = route_of(&ruling, asks);
        // A person's grant covers what would be asked; never a denial.
        // ... and never a call more than one person, or a group, decides.
        let gated = tool.gate.needs_people()
            || ruling
                .enforced
                .and_then(|rule| rule.gate.as_ref())
                .is_some_and(Gate::needs_people);
        if let (Route::Ask, false, Some(risk)) = (&route, gated, spends) {
            if let Some(by) = self.spend_grant(tool, args, risk).await {
                route = Route::Allow(Some(by));
            }
        }
        let actual = route.as_decision();
        let matched = ruling.shadowed.iter().chain(ruling.enforced.iter());
        let first = ruling.shadowed.first().copied().or(ruling.enforced);
        for rule in matched {
            self.metrics
                .policy_decision(&rule.name, rule.decision.as_str(), rule.mode.as_str());
            run_log!(
                Info,
                self.tag(),
                "rule \"{}\" ({}) would {} {}; it goes to {}",
                rule.name,
                rule.mode.as_str(),
                rule.decision.as_str(),
                tool.name,
                actual.as_str()
            );
            let policy = CallEvent::Policy {
                tool: &tool.name,
                args,
                rule,
                actual,
                first: first.unwrap_or(rule),
            };
            let record = self.settings.journal().call(self.subject(), policy);
            Box::pin(self.audit(record.as_ref())).await?;
        }
        Ok(route)
    }

    /// Reports a call a `deny` rule left out: a `tool_output` chunk with
    /// `ok: false`, `error_type: "denied_by_rule"`, the rule and its
    /// reason. Returns what the model is told.
    pub async fn denied(
        &mut self,
        index: usize,
        tool: &str,
        rule: &str,
        reason: Option<&str>,
    ) -> Result<String, RunError> {
        let text = match reason {
            Some(reason) => format!("{tool} was not run: denied by rule \"{rule}\" ({reason})"),
            None => format!("{tool} was not run: denied by rule \"{rule}\""),
        };
        let outcome = ToolOutcome::skipped(false, None, Some(text.clone()));
        let mut chunk = self
            .tool_output(index, tool, &outcome, Some(text.clone()))
            .with_meta(meta::ERROR_TYPE, ErrorType::DeniedByRule.as_str())
            .with_meta(meta::RULE, rule);
        if let Some(reason) = reason {
            chunk = chunk.with_meta(meta::REASON, reason);
        }
        self.send(chunk).await?;
        Ok(text)
    }
}

fn route_of(ruling: &Ruling<'_>, asks: bool) -> Route {
    match ruling.enforced {
        Some(rule) => match rule.decision {
            RuleDecision::Allow => Route::Allow(Some(ApprovedBy::Rule(rule.name.clone()))),
            RuleDecision::Ask => Route::Ask,
            RuleDecision::Deny => Route::Deny {
                rule: rule.name.clone(),
                reason: rule.reason.clone(),
            },
        },
        None if asks => Route::Ask,
        None => Route::Allow(None),
    }
}
