//! The handshake's rules, one test each, with tokio's paused clock where
//! time matters; which replies are accepted is in [`replies`].

mod replies;

use super::*;
use std::future::{pending, Future};
use std::time::Duration;

use super::slot::{PauseSpec, PendingDecision};
use crate::pause::plan_check::{PlanCheck, TaskCheck};
use crate::protocol::{TaskDecisionRequest, Verdict};

/// Begins a run, completing a supersede at once (nothing to record here).
fn begin(
    manager: &ConfirmationManager,
    key: SessionKey,
    limits: RunLimits,
) -> Result<RunSlot, BeginError> {
    manager.begin_run(key, limits).map(Begun::now)
}

fn key(session_id: &str) -> SessionKey {
    SessionKey::new(None, session_id)
}

#[tokio::test]
async fn sessions_of_different_owners_never_meet() {
    let manager = ConfirmationManager::new();
    let mine = begin(
        &manager,
        SessionKey::new(Some(1), "s"),
        RunLimits::UNLIMITED,
    )
    .unwrap();
    let _pending = pause(&mine, "c1", 1);

    let theirs = decide(
        &manager,
        &SessionKey::new(Some(2), "s"),
        &reply("confirm", None),
        None,
    );
    let their_run = begin(
        &manager,
        SessionKey::new(Some(2), "s"),
        RunLimits::UNLIMITED,
    );

    assert_eq!(theirs, Err(DecideError::NoPending));
    assert!(their_run.is_ok(), "another owner's run lives beside mine");
    assert_eq!(manager.paused_runs(), 1, "mine is untouched");
}

/// Decides as the reply handler does without an audit log: the
/// decision is delivered at once. Returns the action and round.
fn decide(
    manager: &ConfirmationManager,
    key: &SessionKey,
    reply: &ReplyMessage,
    confirmation_id: Option<&str>,
) -> Result<(Action, u32), DecideError> {
    manager
        .decide(
            key,
            reply,
            confirmation_id,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .map(|accepted| {
            let seen = (accepted.action, accepted.confirmation_round);
            accepted.ticket.deliver();
            seen
        })
}

fn reply(action: &str, text: Option<&str>) -> ReplyMessage {
    ReplyMessage {
        action: action.to_owned(),
        text: text.map(str::to_owned),
    }
}

fn pause(slot: &RunSlot, id: &str, round: u32) -> PendingDecision {
    slot.pause(
        PauseSpec::new(
            id.to_owned(),
            round,
            Action::ALL.to_vec(),
            Asking::Plan(Arc::default()),
        ),
        CancellationToken::new(),
    )
    .unwrap_or_else(|_| panic!("slot owns its session"))
}

const LONG: Duration = Duration::from_secs(300);

#[tokio::test]
async fn a_reply_that_lands_before_the_wait_is_not_lost() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

    let decision = slot.wait(pending, LONG, pending_reason()).await;

    assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0), None));
    assert_eq!(manager.paused_runs(), 0);
}

#[tokio::test]
async fn a_run_is_paused_until_its_pause_is_decided() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    assert!(!manager.is_paused(&key("s")), "working");
    let _pending = pause(&slot, "c1", 1);
    assert!(manager.is_paused(&key("s")));
    assert!(!manager.is_paused(&key("other")));

    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

    assert!(!manager.is_paused(&key("s")), "decided: at work again");
    assert!(manager.holds(&key("s")));
}

#[tokio::test]
async fn a_run_waits_on_its_own_round_only() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let _first = pause(&slot, "c1", 1);
    assert!(manager.waits_on(&key("s"), "c1") && !manager.waits_on(&key("s"), "c2"));
    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();
    assert!(!manager.waits_on(&key("s"), "c1"), "decided");
    let _second = pause(&slot, "c2", 2);
    assert!(manager.waits_on(&key("s"), "c2"));
    assert!(
        !manager.waits_on(&key("s"), "c1"),
        "a new round is not the old one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_decision_does_not_leak_into_the_next_round() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let first = pause(&slot, "c1", 1);
    decide(&manager, &key("s"), &reply("modify", Some("more")), None).unwrap();
    assert_eq!(
        slot.wait(first, LONG, pending_reason()).await,
        Decision::Modify("more".into())
    );

    let second = pause(&slot, "c2", 2);
    // The round-1 decision must not wake round 2: with nothing sent it times out.
    let decision = slot
        .wait(second, Duration::from_secs(5), pending_reason())
        .await;

    assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
}

#[tokio::test(start_paused = true)]
async fn timeout_cancels_and_later_replies_find_nothing_pending() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);

    let decision = slot
        .wait(pending, Duration::from_secs(300), pending_reason())
        .await;

    assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
    assert_eq!(manager.paused_runs(), 0);
    drop(slot); // the run ends
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), None),
        Err(DecideError::NoPending)
    );
}

#[tokio::test(start_paused = true)]
async fn a_reply_just_before_the_deadline_wins() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    let replier = {
        let manager = manager.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(9_999)).await;
            decide(&manager, &key("s"), &reply("confirm", None), None)
        })
    };

    let decision = slot
        .wait(pending, Duration::from_secs(10), pending_reason())
        .await;

    assert!(replier.await.unwrap().is_ok());
    assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0), None));
}

#[tokio::test]
async fn a_decision_already_sent_stands_against_a_stop() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

    // The stop is already there when the run waits: the decision taken
    // first still stands.
    let decision = slot
        .wait(pending, LONG, async { CancelReason::Shutdown })
        .await;

    assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0), None));
}

#[tokio::test]
async fn a_decision_in_flight_to_the_run_stands_against_a_stop_that_fires_meanwhile() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    // Taken (an audit record being written), not delivered yet.
    let accepted = manager
        .decide(
            &key("s"),
            &reply("cancel", None),
            None,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();
    let deliverer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        accepted.ticket.deliver();
    });

    let decision = slot
        .wait(pending, LONG, async { CancelReason::Shutdown })
        .await;

    deliverer.await.unwrap();
    assert_eq!(
        decision,
        Decision::Cancel(CancelReason::User),
        "the reply stands"
    );
}

#[tokio::test]
async fn a_failed_ticket_ends_the_run_with_its_error() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    let accepted = manager
        .decide(
            &key("s"),
            &reply("confirm", None),
            None,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();

    accepted.ticket.fail(ErrorType::AuditUnavailable);

    let decision = slot.wait(pending, LONG, pending_reason()).await;
    assert_eq!(decision, Decision::Failed(ErrorType::AuditUnavailable));
}

#[tokio::test]
async fn a_withdrawn_decision_leaves_the_pause_to_the_next_reply() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    let first = manager
        .decide(
            &key("s"),
            &reply("confirm", None),
            None,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();
    let meanwhile = decide(&manager, &key("s"), &reply("cancel", None), None);

    first.ticket.withdraw();
    assert_eq!(manager.paused_runs(), 1, "undecided again");
    let next = decide(&manager, &key("s"), &reply("cancel", None), None);
    let decision = slot.wait(pending, LONG, pending_reason()).await;

    assert_eq!(meanwhile, Err(DecideError::AlreadyDecided));
    assert_eq!(next, Ok((Action::Cancel, 1)));
    assert_eq!(decision, Decision::Cancel(CancelReason::User));
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_decision_yields_to_the_timeout_that_came_due_meanwhile() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    let accepted = manager
        .decide(
            &key("s"),
            &reply("confirm", None),
            None,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();
    let withdrawer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        accepted.ticket.withdraw();
    });

    let decision = slot
        .wait(pending, Duration::from_secs(1), pending_reason())
        .await;

    withdrawer.await.unwrap();
    assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
}

#[tokio::test]
async fn a_stop_decides_an_undecided_pause_and_refuses_later_replies() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);

    let decision = slot
        .wait(pending, LONG, async { CancelReason::ClientGone })
        .await;

    assert_eq!(decision, Decision::Cancel(CancelReason::ClientGone));
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), None),
        Err(DecideError::AlreadyDecided),
        "the stop was the decision"
    );
    drop(slot);
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), None),
        Err(DecideError::NoPending)
    );
}

#[tokio::test]
async fn a_second_reply_after_the_run_resumed_is_already_decided() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();
    assert_eq!(
        slot.wait(pending, LONG, pending_reason()).await,
        Decision::Confirm(Decisions::approve_all(0), None)
    );

    // The run is executing now; the pause it came from is decided.
    let second = decide(&manager, &key("s"), &reply("confirm", None), Some("c1"));

    assert_eq!(second, Err(DecideError::AlreadyDecided));
    assert_eq!(manager.paused_runs(), 0);
    assert_eq!(manager.active_runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replies_yield_exactly_one_decision() {
    for round in 0..200 {
        let manager = ConfirmationManager::new();
        let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let replies: Vec<_> = (0..16)
            .map(|i| {
                let (manager, barrier) = (manager.clone(), barrier.clone());
                let action = ["confirm", "cancel"][i % 2];
                tokio::spawn(async move {
                    barrier.wait().await;
                    decide(&manager, &key("s"), &reply(action, None), None)
                })
            })
            .collect();

        let mut accepted = Vec::new();
        for handle in replies {
            match handle.await.unwrap() {
                Ok((action, _)) => accepted.push(action),
                Err(err) => assert_eq!(err, DecideError::AlreadyDecided, "round {round}"),
            }
        }
        let decision = slot.wait(pending, LONG, pending_reason()).await;

        assert_eq!(accepted.len(), 1, "round {round}");
        let expected = match accepted[0] {
            Action::Confirm => Decision::Confirm(Decisions::approve_all(0), None),
            _ => Decision::Cancel(CancelReason::User),
        };
        assert_eq!(decision, expected, "round {round}");
    }
}

#[tokio::test]
async fn a_chat_message_supersedes_a_paused_run_but_not_a_streaming_one() {
    let manager = ConfirmationManager::new();
    let old = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    assert_eq!(
        begin(&manager, key("s"), RunLimits::UNLIMITED).err(),
        Some(BeginError::SessionBusy)
    );
    let pending = pause(&old, "c1", 1);

    let new = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();

    assert_eq!(
        old.wait(pending, LONG, pending_reason()).await,
        Decision::Cancel(CancelReason::Superseded)
    );
    drop(old);
    assert_eq!(
        manager.active_runs(),
        1,
        "the old run must not free the new run's entry"
    );
    drop(new);
    assert_eq!(manager.active_runs(), 0);
}

#[tokio::test]
async fn a_decided_but_not_yet_resumed_run_is_busy_not_superseded() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let pending = pause(&slot, "c1", 1);
    decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

    assert_eq!(
        begin(&manager, key("s"), RunLimits::UNLIMITED).err(),
        Some(BeginError::SessionBusy)
    );
    assert_eq!(
        slot.wait(pending, LONG, pending_reason()).await,
        Decision::Confirm(Decisions::approve_all(0), None)
    );
}

#[tokio::test]
async fn every_ending_frees_the_registry() {
    let manager = ConfirmationManager::new();
    for (i, stop) in [CancelReason::ClientGone, CancelReason::Shutdown]
        .into_iter()
        .enumerate()
    {
        let slot = begin(&manager, key(&format!("s{i}")), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c", 1);
        slot.wait(pending, LONG, async move { stop }).await;
        drop(slot);
    }
    let slot = begin(&manager, key("done"), RunLimits::UNLIMITED).unwrap();
    drop(slot);

    assert_eq!(manager.active_runs(), 0);
    tokio::time::timeout(Duration::from_secs(1), manager.wait_until_empty())
        .await
        .expect("an empty registry resolves at once");
}

#[tokio::test]
async fn wait_until_empty_wakes_when_the_last_run_ends() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move { manager.wait_until_empty().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());

    drop(slot);

    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken")
        .unwrap();
}

#[tokio::test]
async fn a_run_still_writing_its_end_holds_the_drain_but_not_its_session() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::total(1)).unwrap();
    let writing = slot.into_ending();
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move { manager.wait_until_empty().await }
    });

    // The session is free at once: its next run starts.
    let next = begin(&manager, key("s"), RunLimits::total(1)).unwrap();
    drop(next);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "the end is still being written");

    drop(writing);

    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken")
        .unwrap();
}

#[tokio::test]
async fn a_full_registry_refuses_new_sessions_but_still_supersedes() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("a"), RunLimits::total(1)).unwrap();
    let _pending = pause(&slot, "c1", 1);

    assert_eq!(
        begin(&manager, key("b"), RunLimits::total(1)).err(),
        Some(BeginError::Overloaded)
    );
    assert!(
        begin(&manager, key("a"), RunLimits::total(1)).is_ok(),
        "a supersede does not grow the registry"
    );
}

#[tokio::test]
async fn a_reply_after_the_stop_fired_is_refused_and_the_stop_decides() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let stop = CancellationToken::new();
    let pending = slot
        .pause(
            PauseSpec::new(
                "c1".into(),
                1,
                Action::ALL.to_vec(),
                Asking::Plan(Arc::default()),
            ),
            stop.clone(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"));

    // The stop fires; the run has not polled yet when the reply lands.
    stop.cancel();
    let reply = decide(&manager, &key("s"), &reply("confirm", None), None);
    let decision = slot
        .wait(pending, LONG, async { CancelReason::ClientGone })
        .await;

    assert_eq!(reply, Err(DecideError::AlreadyDecided));
    assert_eq!(decision, Decision::Cancel(CancelReason::ClientGone));
    assert_eq!(manager.paused_runs(), 0);
}

#[test]
fn one_key_may_hold_a_quarter_of_the_runs_unless_told_otherwise() {
    assert_eq!(RunLimits::for_keys(100, None, false).per_owner, 100);
    assert_eq!(RunLimits::for_keys(100, None, true).per_owner, 25);
    assert_eq!(RunLimits::for_keys(100, Some(60), true).per_owner, 60);
    assert_eq!(RunLimits::for_keys(100, Some(600), true).per_owner, 100);
}

#[tokio::test]
async fn one_owner_cannot_take_the_runs_of_the_others() {
    let manager = ConfirmationManager::new();
    let limits = RunLimits {
        max_runs: 10,
        per_owner: 2,
    };
    let owned = |owner, session: &str| SessionKey::new(Some(owner), session);
    let _a1 = begin(&manager, owned(1, "a1"), limits).unwrap();
    let a2 = begin(&manager, owned(1, "a2"), limits).unwrap();
    let _pending = pause(&a2, "c", 1);

    assert_eq!(
        begin(&manager, owned(1, "a3"), limits).err(),
        Some(BeginError::KeyOverloaded { limit: 2 })
    );
    assert!(
        begin(&manager, owned(1, "a2"), limits).is_ok(),
        "a supersede"
    );
    assert!(
        begin(&manager, owned(2, "b1"), limits).is_ok(),
        "another key"
    );
    drop(_a1);
    assert!(begin(&manager, owned(1, "a3"), limits).is_ok(), "freed");
}

fn pending_reason() -> impl Future<Output = CancelReason> {
    pending()
}
