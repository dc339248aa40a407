//! The seam between a run and whatever produces its answer: the [`Engine`]
//! trait an engine implements, and the types it speaks with its
//! [`RunContext`]: the [`Plan`](super::plan::Plan) it puts to the
//! user, the [`Approval`](super::plan::Approval) it gets back, how it ends ([`Completion`] or
//! [`RunError`]).
//!
//! An engine drives one run: it streams chunks (token by token if it likes),
//! asks for confirmation as many times as it needs, and returns how the run
//! ended. It knows nothing of HTTP; the context knows nothing of a particular
//! engine. Conversation state across runs belongs to the engine, keyed by
//! [`RunContext::session_key`](super::context::RunContext::session_key).

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::context::RunContext;
use super::outcome::{Completion, RunError};
use super::plan::Resumed;

/// A chat engine. One instance serves every run; it is shared across threads.
pub trait Engine: Send + Sync + 'static {
    /// Drives one run to its end. Returning is the only way to end a run: the
    /// caller turns the result into the stream's final chunk.
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>>;

    /// The engine's name in stored records (`--store`).
    fn name(&self) -> &'static str {
        "custom"
    }

    /// `Err` (what to say on `/readyz`) while the engine cannot answer:
    /// its model server cannot be reached.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }

    /// Goes on with a run restored from a store: `state` is what the engine
    /// put in [`Plan::state`](crate::run::Plan::state) (or
    /// [`Questions::state`](crate::run::plan::Questions::state)) when it
    /// paused, `resumed` the decision taken since. `None`: this engine cannot restore a run (then its paused runs
    /// are not stored, and end at shutdown as without a store).
    fn resume<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        state: Value,
        resumed: Resumed,
    ) -> Option<BoxFuture<'a, Result<Completion, RunError>>> {
        let _ = (ctx, state, resumed);
        None
    }
}
