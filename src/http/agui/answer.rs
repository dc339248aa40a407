//! What every AG-UI answer that follows a run is made of: the request as
//! it came ([`Incoming`]), a run known at once ([`ended`]), and a run
//! followed on its stream ([`streamed`]).

use std::convert::Infallible;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::http::access::Caller;
use crate::http::event_stream;
use crate::http::forward::Forwarded;
use crate::http::state::AppState;
use crate::protocol::agui::translate::Translator;
use crate::protocol::agui::{Event, RunAgentInput};
use crate::protocol::Chunk;
use crate::run::stream::Subscription;

/// An AG-UI request as it came: who sent it, from where, its input, and
/// its body as it came (a replica forwards it).
pub(super) struct Incoming<'a> {
    pub req: &'a HttpRequest,
    pub state: &'a AppState,
    pub caller: Caller,
    pub forwarded: Option<Forwarded>,
    pub body: Bytes,
    pub input: RunAgentInput,
}

/// A whole AG-UI run, known at once: `RUN_STARTED`, then `events`.
pub(super) fn ended(translator: Translator, events: Vec<Event>) -> HttpResponse {
    let mut all = vec![translator.started()];
    all.extend(events);
    event_stream::frames(StatusCode::OK, framed(&all))
}

/// An AG-UI run that follows a chatgate run: `RUN_STARTED`, `first`, then
/// the run's chunks as events, until the run ends or pauses.
pub(super) fn streamed(
    translator: Translator,
    first: Vec<Event>,
    subscription: Subscription,
) -> HttpResponse {
    let mut head = vec![translator.started()];
    head.extend(first);
    let subscription = subscription.typed();
    event_stream::stream_response(translated(framed(&head), translator, subscription))
}

fn framed(events: &[Event]) -> Bytes {
    let mut out = Vec::new();
    for event in events {
        out.extend(event.frame());
    }
    Bytes::from(out)
}

/// The run's frames as AG-UI event frames: the keep-alive comments pass
/// through, the end (or the stream's) closes the AG-UI run, and the
/// stream ends there: the subscription is dropped, so a paused run is
/// left detached, waiting for its decision.
fn translated(
    head: Bytes,
    translator: Translator,
    subscription: Subscription,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let tail = futures_util::stream::unfold(Some((subscription, translator)), |state| async move {
        let (mut subscription, mut translator) = state?;
        loop {
            let Some(Ok(frame)) = subscription.next().await else {
                return Some((Ok(framed(&translator.cut_short())), None));
            };
            // The chunk as the run pushed it, when the log kept it for
            // this subscription; else parsed back from its frame.
            let typed = subscription.chunk();
            if frame.starts_with(b":") {
                return Some((Ok(frame), Some((subscription, translator))));
            }
            let chunk = typed.or_else(|| {
                let data = crate::sse::data_of(&frame)?;
                serde_json::from_slice::<Chunk>(data).ok().map(Box::new)
            });
            let events = match chunk {
                Some(chunk) => translator.chunk(&chunk),
                None => Vec::new(),
            };
            if events.is_empty() {
                continue;
            }
            let bytes = framed(&events);
            let next = (!translator.ended()).then_some((subscription, translator));
            return Some((Ok(bytes), next));
        }
    });
    futures_util::stream::once(async move { Ok(head) }).chain(tail)
}
