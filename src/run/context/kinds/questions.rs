//! Questions put to the user, as a run asks them (how a reply's answers
//! are checked: `crate::pause::questions`): checked against their bounds,
//! recorded as asked, built into an `input_request`; the reply
//! acknowledged with `confirmation_received` (its answers) and turned into
//! [`Answers`].

use std::sync::Arc;
use std::time::SystemTime;

use crate::confirmation::slot::PendingDecision;
use crate::confirmation::Decision;
use crate::pause::Asking;
use crate::protocol::kinds::question_data;
use crate::protocol::question::{check_questions, MAX_QUESTION_CHARS};
use crate::protocol::{Action, CancelReason, Chunk, ErrorType, Given, PauseKind, QuestionData};
use crate::run::context::asked::{Asked, Received, Request};
use crate::run::context::pause::{timeout_seconds, Kind};
use crate::run::context::RunContext;
use crate::run::journal::PauseEvent;
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Questions, Resumed};

impl Kind for Questions {
    type Answer = Answers;
    type Wire = QuestionData;

    /// Checked against their bounds and recorded as asked.
    async fn request(self, ctx: &mut RunContext) -> Result<Option<Request>, RunError> {
        let Questions {
            title,
            questions,
            state,
        } = self;
        check_questions(&questions).map_err(|err| RunError::Failed {
            error_type: ErrorType::InvalidQuestions,
            message: format!("the questions cannot be asked: {err}"),
        })?;
        let title = match title.trim() {
            "" => "Questions for you".to_owned(),
            title => title.chars().take(MAX_QUESTION_CHARS).collect(),
        };
        let confirmation_id = uuid::Uuid::new_v4().to_string();
        if ctx.durable() && ctx.stored_id.is_none() {
            ctx.stored_id = Some(Arc::from(uuid::Uuid::new_v4().to_string()));
        }
        let asked = PauseEvent::Asked {
            confirmation_id: &confirmation_id,
            title: &title,
            questions: &questions,
        };
        ctx.audit_first(asked).await?;
        let timeout = ctx.settings.confirm_timeout;
        let expires_at = SystemTime::now() + timeout;
        let options = Action::QUESTION.to_vec();
        let data = QuestionData {
            kind: PauseKind::Question,
            confirmation_id: confirmation_id.clone(),
            title,
            questions: questions.clone(),
            options: options.clone(),
            timeout_seconds: timeout_seconds(timeout),
            expires_at: crate::clock::rfc3339(expires_at),
        };
        let request = Request {
            chunk: Chunk::input_request(ctx.session_id(), data),
            asking: Asking::Questions(questions.into()),
            options,
            confirmation_id,
            // Questions are not a round of the plan: the round stays.
            round: ctx.round,
            state,
            expires_at,
            timeout: ctx.settings.confirm_timeout,
            rejects_on_timeout: None,
            timers: None,
            frame: None,
        };
        Ok(Some(request))
    }

    /// Sends `confirmation_received` with the answers.
    async fn take(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> Result<Answers, RunError> {
        let (action, answers) = match decision {
            Decision::Answer(answers) => (Action::Answer, Answers::Given(answers)),
            Decision::Skip => (Action::Skip, Answers::Skipped),
            Decision::Cancel(_) => (Action::Cancel, Answers::Skipped),
            // Not offered on questions: the manager never takes it.
            _ => return Err(RunError::unacted(ErrorType::Internal)),
        };
        let given = match &answers {
            Answers::Given(given) => Some(given),
            Answers::Skipped => None,
        };
        let received = Chunk::questions_answered(
            ctx.session_id(),
            format!("Received {}", action.as_str()),
            action,
            &asked.confirmation_id,
            given,
        );
        // Written even after a stop, as for a plan.
        ctx.replay.push(received);
        match action {
            Action::Cancel => Err(RunError::Cancelled(CancelReason::User)),
            _ => Ok(answers),
        }
    }

    fn received(decided: &Received<'_>) -> Chunk {
        Chunk::questions_answered(
            decided.session_id,
            format!("Received {}", decided.action.as_str()),
            decided.action,
            decided.confirmation_id,
            decided.given.and_then(Given::answers),
        )
    }

    fn restore_asking(_ctx: &mut RunContext, asked: &question_data::Asked) -> Asking {
        Asking::Questions(asked.questions.clone().into())
    }

    async fn wait_restored(
        ctx: &mut RunContext,
        pending: PendingDecision,
        asked: Asked,
    ) -> Result<Resumed, RunError> {
        let decision = ctx.wait_for(pending, &asked).await?;
        Self::take_decided(ctx, decision, asked).await
    }

    async fn take_decided(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> Result<Resumed, RunError> {
        ctx.settled(Self::KIND, &decision, &asked)?;
        Questions::take(ctx, decision, asked)
            .await
            .map(Resumed::Answers)
    }
}
