//! The run side of the kinds of pause, listed once: each row maps a
//! [`PauseKind`] (its wire row in `protocol/kinds.rs`) to the type that
//! asks it ([`Kind`]: its request, how its decision is taken, how a stored
//! pause of it is restored). What a run does with a pause restored from a
//! store dispatches here, and nowhere else on the run side names a kind.
//! Each kind's run side is a file under `kinds/`.

mod plan;
mod questions;
pub(super) mod reconcile;

use self::reconcile::Reconcile;
use super::asked::Asked;
use super::asked::Received;
use super::pause::Kind;
use super::RunContext;
use crate::confirmation::slot::PendingDecision;
use crate::confirmation::Decision;
use crate::pause::Asking;
use crate::protocol::{Ask, Chunk, PauseKind};
use crate::run::outcome::RunError;
use crate::run::plan::{Plan, Questions, Resumed};

/// Generates the dispatch from the rows: `Variant => Type`.
macro_rules! run_kinds {
    ($($variant:ident => $kind:ty),* $(,)?) => {
        /// The `confirmation_received` chunk that acknowledges `decided`
        /// (a reply to a pause of `kind`) on the reply's own stream, as its
        /// kind writes it.
        pub(crate) fn received(kind: PauseKind, decided: &Received<'_>) -> Chunk {
            match kind {
                $(PauseKind::$variant => <$kind as Kind>::received(decided)),*
            }
        }

        impl RunContext {
            /// What a pause restored from its record (`asked`) asks, to
            /// check replies against.
            pub(super) fn restore_asking(&mut self, asked: &Ask) -> Asking {
                match asked {
                    $(Ask::$variant(asked) => <$kind as Kind>::restore_asking(self, asked)),*
                }
            }

            /// Waits on a restored pause of `kind` (see
            /// [`RunContext::resume_pause`]) and takes its decision, as
            /// [`RunContext::confirm_as_decided`] and [`RunContext::ask`] do.
            pub(super) async fn wait_restored(
                &mut self,
                kind: PauseKind,
                pending: PendingDecision,
                asked: Asked,
            ) -> Result<Resumed, RunError> {
                match kind {
                    $(PauseKind::$variant => <$kind as Kind>::wait_restored(self, pending, asked).await),*
                }
            }

            /// Takes `decision`, recorded before a crash, of a restored
            /// pause of `kind` as if it had just come (see
            /// [`RunContext::resume_decided`]).
            pub(super) async fn take_decided(
                &mut self,
                kind: PauseKind,
                decision: Decision,
                asked: Asked,
            ) -> Result<Resumed, RunError> {
                match kind {
                    $(PauseKind::$variant => <$kind as Kind>::take_decided(self, decision, asked).await),*
                }
            }
        }
    };
}

run_kinds! {
    Approval => Plan,
    Question => Questions,
    Reconcile => Reconcile,
}
