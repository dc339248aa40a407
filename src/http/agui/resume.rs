//! An AG-UI `resume`: the thread's pause decided through the one decision
//! path, as a chat reply would decide it ([`crate::run::decide`]), here or
//! at the replica that holds the run. A decision that leaves tasks open
//! (some tasks decided, one approval of several) ends the AG-UI run with
//! the interrupts still open; a decided pause's run goes on as this AG-UI
//! run, from the pause's request on.

use actix_web::HttpResponse;
use serde_json::json;

use super::answer::{ended, streamed, Incoming};
use crate::confirmation::DecideError;
use crate::http::chat::{self, Route, Unrouted};
use crate::http::error::{ChatError, Refusal};
use crate::http::forward::{self, Forwarding};
use crate::protocol::agui::interrupts::{confirmation_id_of, reply_of};
use crate::protocol::agui::translate::{open_tasks, Translator};
use crate::protocol::agui::{Event, Outcome};
use crate::protocol::agui::{ResumeError, ResumeReply};
use crate::protocol::{parse_reply, ReplyPayload, Via};
use crate::run::decide::{Reply, ReplyError};
use crate::run::pending::WaitingPause;
use crate::session::SessionKey;

/// A `resume`: routed to the run that holds the pause its interrupts name.
pub(super) async fn resume(incoming: Incoming<'_>) -> Result<HttpResponse, Refusal> {
    let Incoming {
        req, state, input, ..
    } = &incoming;
    let thread = input.thread_id.as_str();
    crate::http::access_log::note_session(req, thread);
    let translator = Translator::new(thread, &input.run_id);
    let entries = input.resume.as_deref().unwrap_or_default();
    let cid = confirmation_id_of(&entries[0].interrupt_id).to_owned();
    if entries
        .iter()
        .any(|entry| confirmation_id_of(&entry.interrupt_id) != cid)
    {
        let why = "resume names the interrupts of more than one pause; a run waits on one";
        return Ok(refused(
            translator,
            ChatError::InvalidRequest(why.to_owned()),
        ));
    }
    let (caller, forwarded) = (incoming.caller, incoming.forwarded);
    let key = match chat::route(state, caller, thread, Some(&cid), forwarded).await {
        Ok(Route::Here(key)) => key,
        Ok(Route::Forward(key, peer)) => {
            let body = incoming.body.clone();
            return chat::forward_to(state, &peer, &key, req, body, Forwarding::Change)
                .await
                .map_err(|err| Refusal::new(err, thread));
        }
        Err(Unrouted::NoRun) => {
            let told = not_pending(&incoming, &cid, None).await;
            return Ok(refused(translator, told));
        }
        Err(Unrouted::OutOfScope(why)) => {
            let err = ChatError::Reply(DecideError::ForbiddenScope(why).into());
            return Ok(refused(translator, err));
        }
        Err(Unrouted::Refused(err)) => return Err(Refusal::new(err, thread)),
    };
    Ok(decide_here(&incoming, translator, &key, &cid).await)
}

/// The pause of `key` decided here by the resume, and the AG-UI run that
/// follows.
async fn decide_here(
    incoming: &Incoming<'_>,
    translator: Translator,
    key: &SessionKey,
    cid: &str,
) -> HttpResponse {
    let runs = &incoming.state.runs;
    let pause = match runs.waiting_pause(key) {
        Some(pause) if pause.confirmation_id == cid => pause,
        _ => return refused(translator, not_pending(incoming, cid, Some(key)).await),
    };
    let data = &pause.data;
    let entries = incoming.input.resume.as_deref().unwrap_or_default();
    let reply = match reply_of(data, &pause.pending, entries) {
        Ok(reply) => reply,
        Err(err) => return refused(translator, resume_error(err)),
    };
    let translator = translator.resuming(cid, &open_tasks(data));
    // The AG-UI run reads the run's stream from the pause's request on,
    // attached before the decision so nothing is missed; unless another
    // client holds the stream (the pause was asked on the chat endpoint):
    // that stream goes on showing the run.
    let held = runs
        .replays()
        .find(key)
        .is_some_and(|log| !log.is_detached());
    let attached = match held {
        true => None,
        false => runs.reattach(key.clone(), pause.sequence).ok(),
    };
    match take(incoming, key, cid, &reply).await {
        Err(err) => refused(translator, ChatError::Reply(err)),
        Ok(Taken::StillOpen) => match runs.waiting_pause(key) {
            Some(open) => interrupted_again(translator, &open),
            None => follow(translator, attached),
        },
        Ok(Taken::Decided) => follow(translator, attached),
    }
}

/// What the decision did to the pause.
enum Taken {
    /// It decided it: the run goes on.
    Decided,
    /// It decided some tasks, or was one approval of several.
    StillOpen,
}

/// The resume's reply, on the one decision path (`via: agui`).
async fn take(
    incoming: &Incoming<'_>,
    key: &SessionKey,
    cid: &str,
    reply: &ResumeReply,
) -> Result<Taken, ReplyError> {
    let message = match parse_reply(&reply.message) {
        Some(Ok(message)) => message,
        _ => return Err(DecideError::NoPending.into()),
    };
    let client = forward::client_address(incoming.req, incoming.forwarded.is_some());
    let decider = incoming.state.access.decider(incoming.caller);
    let reply = Reply {
        message: &message,
        confirmation_id: Some(cid),
        payload: ReplyPayload {
            decisions: reply.decisions.as_deref(),
            answers: reply.answers.as_ref(),
            grant: None,
        },
        client: client.as_deref(),
        decider: &decider,
        not_after: incoming.forwarded.and_then(|f| f.not_after),
        via: Via::Agui,
    };
    let decided = incoming.state.runs.decide(key, reply).await?;
    match decided.partial.is_some() || decided.progress.is_some() {
        true => Ok(Taken::StillOpen),
        false => Ok(Taken::Decided),
    }
}

/// The run goes on as this AG-UI run; or, when another client holds its
/// stream, the AG-UI run ends here, saying so.
fn follow(
    translator: Translator,
    attached: Option<crate::run::stream::Subscription>,
) -> HttpResponse {
    match attached {
        Some(subscription) => streamed(translator, Vec::new(), subscription),
        None => {
            let (thread_id, run_id) = translator.ids();
            let done = Event::RunFinished {
                thread_id,
                run_id,
                result: Some(json!({
                    "decided": true,
                    "summary": "decided; the run goes on on the stream that holds it",
                })),
                outcome: Outcome::Success,
                metadata: None,
            };
            ended(translator, vec![done])
        }
    }
}

/// The AG-UI run ends with the interrupts `pause` still has open.
fn interrupted_again(mut translator: Translator, pause: &WaitingPause) -> HttpResponse {
    let events = translator.interrupted(&pause.data, &pause.pending);
    ended(translator, events)
}

/// Why nothing of the thread's waits on the pause `cid`: decided (who and
/// what, while the run's log or its kept outcome says), else stale (the
/// run waits on another pause) or nothing pending.
async fn not_pending(incoming: &Incoming<'_>, cid: &str, key: Option<&SessionKey>) -> ChatError {
    let runs = &incoming.state.runs;
    let note = match key {
        Some(key) => runs.kept().decided_note(key, cid).await,
        None => {
            runs.kept()
                .decided_by_pause(&incoming.input.thread_id, cid)
                .await
        }
    };
    if let Some(note) = note {
        return ChatError::Reply(ReplyError::Decided(note));
    }
    let waits_on_another = key.is_some_and(|key| runs.waits(key));
    ChatError::Reply(match waits_on_another {
        true => DecideError::Stale.into(),
        false => DecideError::NoPending.into(),
    })
}

fn resume_error(err: ResumeError) -> ChatError {
    match err {
        ResumeError::Unknown(id) => ChatError::Reply(
            DecideError::InvalidDecision(format!("{id} is no interrupt of this pause")).into(),
        ),
        ResumeError::Decision(why) => ChatError::Reply(DecideError::InvalidDecision(why).into()),
        ResumeError::Answer(why) => ChatError::Reply(DecideError::InvalidAnswer(why).into()),
    }
}

/// The AG-UI run ends with `RUN_ERROR`, its `code` the refusal's
/// `error_type` (counted as the chat endpoint counts a refusal).
fn refused(translator: Translator, err: ChatError) -> HttpResponse {
    let code = err.error_type().as_str();
    ended(translator, vec![Event::error(code, err.to_string())])
}
