//! Which replies a pause accepts: the offered options, the bounds of a
//! modify, the per-task decisions of a confirm, in the documented order.

use super::*;
use crate::protocol::Given;

#[tokio::test]
async fn per_task_decisions_are_checked_against_the_pending_tasks() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let tasks = Arc::new(PlanCheck {
        tasks: vec![
            TaskCheck {
                index: 1,
                task_id: Some("c1-t1".into()),
                tool: None,
                risk: crate::protocol::RiskLevel::Low,
                gate: Default::default(),
                preview_digest: None,
            },
            TaskCheck {
                index: 2,
                task_id: Some("c1-t2".into()),
                tool: None,
                risk: crate::protocol::RiskLevel::Low,
                gate: Default::default(),
                preview_digest: None,
            },
        ],
        ..PlanCheck::default()
    });
    let _pending = slot
        .pause(
            PauseSpec::new("c1".into(), 1, Action::ALL.to_vec(), Asking::Plan(tasks)),
            CancellationToken::new(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"));
    let request = |index: u64, decision: &str| TaskDecisionRequest {
        index: Some(index),
        task_id: None,
        decision: decision.into(),
        reason: None,
        args: None,
        result: None,
        preview_digest: None,
    };
    let refused = |reply_action: &str, decisions: Vec<TaskDecisionRequest>| match manager.decide(
        &key("s"),
        &reply(reply_action, None),
        None,
        Some(&decisions),
        None,
        ReplyFrom::plain(&Decider::requester("anonymous")),
    ) {
        Err(DecideError::InvalidDecision(why)) => why,
        other => panic!("refused as invalid: {other:?}"),
    };

    assert!(refused("confirm", vec![request(3, "approve")]).contains("no task 3"));
    assert!(refused("confirm", vec![request(0, "approve")]).contains("no task 0"));
    assert!(
        refused("confirm", vec![request(1, "reject"), request(1, "approve")]).contains("twice")
    );
    assert!(refused("confirm", vec![request(1, "skip")]).contains("`skip`"));
    assert!(refused("confirm", vec![request(1, "edit")]).contains("args"));
    let mut edit = request(1, "edit");
    edit.args = Some(serde_json::json!({"step": "changed"}));
    assert!(
        refused("confirm", vec![edit]).contains("calls no declared tool"),
        "an edit that would change nothing that runs is refused"
    );
    assert!(refused("confirm", vec![request(2, "respond")]).contains("result"));
    assert!(refused("cancel", vec![request(1, "reject")]).contains("confirm only"));
    // By task_id: an unknown one, one that names another task than its
    // index, one naming neither.
    let by_id = |index: Option<u64>, id: &str| TaskDecisionRequest {
        index,
        task_id: Some(id.into()),
        ..request(0, "reject")
    };
    assert!(refused("confirm", vec![by_id(None, "c1-t9")]).contains("no task with task_id"));
    assert!(refused("confirm", vec![by_id(Some(1), "c1-t2")]).contains("different tasks"));
    let mut neither = request(1, "reject");
    neither.index = None;
    assert!(refused("confirm", vec![neither]).contains("index or task_id"));
    assert!(
        refused("confirm", vec![by_id(None, "c1-t1"), request(1, "approve")]).contains("twice"),
        "a task named by its id and by its index is named twice"
    );

    let mut reject = by_id(Some(2), "c1-t2");
    reject.reason = Some("not now".into());
    let accepted = manager
        .decide(
            &key("s"),
            &reply("confirm", None),
            None,
            Some(&[reject]),
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();
    let decisions = accepted
        .given
        .as_ref()
        .and_then(Given::decisions)
        .unwrap()
        .clone();
    assert_eq!(decisions.verdict(1), &Verdict::Approve);
    assert_eq!(
        decisions.verdict(2),
        &Verdict::Reject {
            reason: Some("not now".into())
        }
    );
    accepted.ticket.deliver();
}

#[tokio::test]
async fn refused_replies_are_checked_in_the_documented_order_and_change_nothing() {
    let manager = ConfirmationManager::new();
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), None),
        Err(DecideError::NoPending)
    );
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    assert_eq!(
        decide(&manager, &key("s"), &reply("launch", None), Some("wrong")),
        Err(DecideError::NoPending),
        "a streaming run has nothing pending"
    );
    let pending = pause(&slot, "c1", 1);

    assert!(matches!(
        decide(&manager, &key("s"), &reply("launch", None), Some("wrong")),
        Err(DecideError::NotOffered { .. })
    ));
    let long = "x".repeat(MAX_MODIFY_TEXT_BYTES + 1);
    assert!(matches!(
        decide(
            &manager,
            &key("s"),
            &reply("modify", Some(&long)),
            Some("wrong")
        ),
        Err(DecideError::ModifyTooLong { .. })
    ));
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), Some("wrong")),
        Err(DecideError::Stale)
    );
    let accepted = decide(&manager, &key("s"), &reply("confirm", None), Some("c1")).unwrap();
    assert_eq!(accepted.1, 1);
    assert_eq!(
        decide(&manager, &key("s"), &reply("confirm", None), Some("wrong")),
        Err(DecideError::Stale)
    );
    assert_eq!(
        decide(&manager, &key("s"), &reply("cancel", None), None),
        Err(DecideError::AlreadyDecided)
    );
    assert_eq!(
        slot.wait(pending, LONG, pending_reason()).await,
        Decision::Confirm(Decisions::approve_all(0), None)
    );
}

#[tokio::test]
async fn only_the_offered_options_are_accepted() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let _pending = slot
        .pause(
            PauseSpec::new(
                "c1".into(),
                1,
                vec![Action::Confirm, Action::Cancel],
                Asking::Plan(Arc::default()),
            ),
            CancellationToken::new(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"));

    let refused = decide(&manager, &key("s"), &reply("modify", Some("x")), None);

    assert_eq!(
        refused,
        Err(DecideError::NotOffered {
            action: "modify".into(),
            options: vec![Action::Confirm, Action::Cancel]
        })
    );
}

#[tokio::test]
async fn a_modify_text_over_the_bound_is_refused_and_the_pause_stays() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("s"), RunLimits::UNLIMITED).unwrap();
    let _pending = pause(&slot, "c1", 1);
    let long = "x".repeat(MAX_MODIFY_TEXT_BYTES + 1);

    let refused = decide(&manager, &key("s"), &reply("modify", Some(&long)), None);
    let fits = "x".repeat(MAX_MODIFY_TEXT_BYTES);
    let accepted = decide(&manager, &key("s"), &reply("modify", Some(&fits)), None);

    assert!(matches!(refused, Err(DecideError::ModifyTooLong { .. })));
    assert!(accepted.is_ok());
}

#[tokio::test]
async fn an_approval_counts_only_once_kept_and_none_completes_a_quorum_with_one_in_flight() {
    let manager = ConfirmationManager::new();
    let slot = begin(&manager, key("q"), RunLimits::UNLIMITED).unwrap();
    let gate = crate::tools::gate::Gate {
        approvals: 2,
        ..Default::default()
    };
    let tasks = Arc::new(PlanCheck {
        tasks: vec![TaskCheck {
            index: 1,
            task_id: None,
            tool: None,
            risk: crate::protocol::RiskLevel::Low,
            gate,
            preview_digest: None,
        }],
        ..PlanCheck::default()
    });
    let _pending = slot
        .pause(
            PauseSpec::new("c1".into(), 1, Action::ALL.to_vec(), Asking::Plan(tasks)),
            CancellationToken::new(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"));
    let approver = |label: &str| Decider {
        label: label.to_owned(),
        groups: Vec::new(),
        max_risk: crate::protocol::RiskLevel::High,
        requester: false,
    };
    let confirm = |label: &str| {
        manager.decide(
            &key("q"),
            &reply("confirm", None),
            None,
            None,
            None,
            ReplyFrom::plain(&approver(label)),
        )
    };

    let first = confirm("a").unwrap();
    assert_eq!(first.progress.as_ref().unwrap().approvals, ["a"]);
    // a's approval is being kept: b's is not counted, not taken.
    assert_eq!(confirm("b").unwrap_err(), DecideError::Counting);
    // a's could not be kept: it is withdrawn, and b's is the first.
    manager.withdraw_approval(&key("q"), "c1", "a");
    let second = confirm("b").unwrap();
    assert_eq!(second.progress.as_ref().unwrap().approvals, ["b"]);
    manager.approval_kept(&key("q"), "c1");
    let third = confirm("a").unwrap();
    assert!(third.progress.is_none(), "two kept approvals decide");
    assert_eq!(third.approved_by, ["b", "a"]);
    third.ticket.deliver();
}

#[tokio::test]
async fn a_reply_to_a_run_being_restored_is_told_to_retry_until_its_pause_is_back() {
    let manager = ConfirmationManager::new();
    let Ok(Begun::Fresh(slot)) = manager.begin_restored_run(key("r")) else {
        panic!("the session is free");
    };
    assert_eq!(
        decide(&manager, &key("r"), &reply("confirm", None), None),
        Err(DecideError::Restoring),
        "not 404: the run is here, its pause on its way back"
    );
    let _pending = slot
        .pause(
            PauseSpec::new(
                "c1".into(),
                1,
                Action::ALL.to_vec(),
                Asking::Plan(Default::default()),
            ),
            CancellationToken::new(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"));
    let accepted = manager
        .decide(
            &key("r"),
            &reply("confirm", None),
            None,
            None,
            None,
            ReplyFrom::plain(&Decider::requester("anonymous")),
        )
        .unwrap();
    accepted.ticket.deliver();
}
