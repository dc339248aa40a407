//! The audit log (`--audit-log FILE`): JSON Lines, one record per event of a
//! confirmation's life, written and flushed to disk (fsync) before chatgate
//! acts on what it records.
//!
//! Records (docs/tools.md has the schema): `proposed` (a plan put to the
//! user), `decided` (the answer, per task, who and from where), `asked`
//! and `answered` (questions put to the user, and the reply), `executed`
//! (a tool call: the arguments actually used, its outcome, the size and
//! SHA-256 of its output, and what allowed it when no person did),
//! `policy` (a rule of the tools file matched a call, enforced or in
//! shadow mode), `granted` and `grant_revoked`, `ended` (how the run
//! ended). Each has `event`,
//! `at` (RFC 3339), `run_id` and `session_id` (as the client sent it).
//!
//! Fail closed, like an audit device that cannot write: a `proposed` record
//! (or `asked`) record that cannot be written ends the run before anything
//! is asked; a `decided` (or `answered`) record that cannot be written refuses the reply (503
//! `audit_unavailable`) and ends the run before any call runs. Until a write
//! succeeds again, `/readyz` answers 503 naming the audit log.
//!
//! The file is opened for each record (append, create): a log moved away by
//! rotation is written anew at its path, and a path that became unwritable
//! fails the next record rather than writing into a file nobody sees.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::protocol::question::Question;
use crate::protocol::{Action, ApprovedBy, ChunkType, Decisions, RiskLevel, TaskSpec};
use crate::tools::{RuleDecision, RuleMode};

pub mod chain;
pub mod verify;

pub use chain::sha256_hex;

/// The fields every record of a run carries. `run_id` counts runs in this
/// process; with a durable store `stored_run_id`, the run's id there (a
/// UUID), ties its records together across restarts and replicas.
#[derive(Debug, Clone, Serialize)]
pub struct RunFields {
    pub run_id: u64,
    pub session_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_run_id: Option<String>,
}

impl RunFields {
    pub fn new(run_id: u64, session_id: &str, stored: Option<&str>) -> RunFields {
        RunFields {
            run_id,
            session_id: session_id.to_owned(),
            stored_run_id: stored.map(str::to_owned),
        }
    }
}

/// The first rule of a rule set that matches a call, and what it decides.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyFirst {
    pub rule: String,
    pub decision: RuleDecision,
}

/// One record: `event` names its kind; `at` is added when it is written.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditRecord {
    /// A plan put to the user (before it is asked).
    Proposed {
        #[serde(flatten)]
        run: RunFields,
        /// Who asked: the API key's label.
        key: String,
        confirmation_id: String,
        round: u32,
        risk_level: RiskLevel,
        tasks: Vec<TaskSpec>,
    },
    /// Questions put to the user (an `input_request`), before they are asked.
    Asked {
        #[serde(flatten)]
        run: RunFields,
        /// Who asked: the API key's label.
        key: String,
        confirmation_id: String,
        title: String,
        questions: Vec<Question>,
    },
    /// A call a crash cut short put to a person (#44): whether it runs
    /// again, before it is asked.
    ReconcileAsked {
        #[serde(flatten)]
        run: RunFields,
        /// Whose run it is: the API key's label.
        key: String,
        confirmation_id: String,
        task: Box<TaskSpec>,
        idempotency_key: String,
        started_at: String,
        attempt: u32,
    },
    /// A reply to questions (before the run acts on it): `answer` with the
    /// normalized answers, `skip` or `cancel`.
    Answered {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        action: Action,
        #[serde(skip_serializing_if = "Option::is_none")]
        answers: Option<Map<String, Value>>,
        /// Who answered: the API key's label, and the client's address.
        key: String,
        client: Option<String>,
    },
    /// A reply's decision (before the run acts on it).
    Decided {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        round: u32,
        action: Action,
        decisions: Option<Decisions>,
        /// Who decided: the API key's label, and the client's address.
        key: String,
        client: Option<String>,
        /// A quorum's decision: every label that approved, in order (absent
        /// for a decision of one person).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        approved_by: Vec<String>,
    },
    /// Nobody answered a pause whose tasks say `on_timeout = "reject"`:
    /// every task rejected (`decisions`), before the run goes on. No key
    /// decided it.
    TimeoutRejected {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        round: u32,
        decisions: Decisions,
        timeout_seconds: u64,
    },
    /// One approval of several a pause needs (a quorum), before the reply
    /// is acknowledged: who, and the approvals so far.
    Approved {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        round: u32,
        /// The approving key's label, and the client's address.
        key: String,
        client: Option<String>,
        approvals: Vec<String>,
        required: usize,
        /// The task approved, when the quorum is a task's own (`decide`).
        #[serde(skip_serializing_if = "Option::is_none")]
        task: Option<usize>,
    },
    /// One task of an approval pause decided on its own (`decide`, #42):
    /// who, what; recorded before anything runs.
    DecidedTask {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        round: u32,
        key: String,
        client: Option<String>,
        #[serde(flatten)]
        decision: crate::protocol::TaskDecision,
    },
    /// A tool call that ran: the arguments actually used, its outcome, the
    /// size and SHA-256 of its output.
    Executed {
        #[serde(flatten)]
        run: RunFields,
        tool: String,
        args: Value,
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_status: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        http_status: Option<u16>,
        duration_ms: u64,
        output_bytes: usize,
        output_sha256: String,
        /// A call that ran without a person's yes: the rule or the grant
        /// that allowed it.
        #[serde(skip_serializing_if = "Option::is_none")]
        approved_by: Option<ApprovedBy>,
        /// The key the tool received (#44; absent for a call nobody cleared).
        #[serde(skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        /// Which attempt it was (absent for the first).
        #[serde(skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
    },
    /// A task of a decided pause continued after a crash (#44), before it
    /// goes on: `how` (`replayed`: it had finished, its output shown
    /// again; `reran`: called again with its key; `reconciled`: its
    /// `reconcile` said; `asked`: a person chose).
    Resumed {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        task: usize,
        tool: String,
        idempotency_key: String,
        how: crate::protocol::ResumedHow,
    },
    /// A call whose preview, run again just before it (`recheck`), no
    /// longer shows what was approved: it did not run.
    PreconditionChanged {
        #[serde(flatten)]
        run: RunFields,
        tool: String,
        args: Value,
        task: usize,
        approved_digest: String,
        current_digest: String,
    },
    /// A rule of the tools file matched a call: `mode` `enforce` (the rule
    /// decided: `decision` is what happened) or `shadow` (what it would
    /// have decided; `actual` is what happened instead).
    Policy {
        #[serde(flatten)]
        run: RunFields,
        /// The requester's key label.
        key: String,
        tool: String,
        args: Value,
        rule: String,
        mode: RuleMode,
        decision: RuleDecision,
        /// What happened to the call: `allow` (ran without asking), `ask`
        /// or `deny`.
        actual: RuleDecision,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// What the rule set as a whole would decide were every rule
        /// enforced: its first rule that matches the call (shadow or not).
        if_enforced: PolicyFirst,
    },
    /// A person's grant, kept (before any call uses it): the grant as
    /// `GET /api/v1/grants` lists it, and the pause it was given on.
    Granted {
        #[serde(flatten)]
        run: RunFields,
        confirmation_id: String,
        grant: Value,
    },
    /// A grant revoked (`DELETE /api/v1/grants/ID`), and by whom.
    GrantRevoked {
        session_id: String,
        grant_id: String,
        /// The revoking key's label.
        key: String,
        client: Option<String>,
    },
    /// How the run ended: its final chunk's type, and a cancel's reason or
    /// an error's type.
    Ended {
        #[serde(flatten)]
        run: RunFields,
        outcome: ChunkType,
        reason: Option<String>,
    },
}

/// The audit log could not be written.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the audit log {path} cannot be written: {reason}")]
pub struct AuditError {
    pub path: String,
    pub reason: String,
}

/// Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    healthy: AtomicBool,
    /// Keeps records whole and in order: one writer at a time.
    writing: Mutex<Writer>,
}

/// What the one writer keeps between records.
#[derive(Debug, Default)]
struct Writer {
    /// Where the file must be cut back to before the next record, when a
    /// failed record could not be rolled back at once.
    cut_back: Option<CutBack>,
    /// The chain's last line (`None` until one is known).
    tail: Option<chain::Tail>,
}

/// Where a file (this inode, not another one rotated in at the path) must
/// be cut back to.
#[derive(Debug, Clone, Copy)]
struct CutBack {
    dev: u64,
    ino: u64,
    len: u64,
}

impl AuditLog {
    /// Opens `path` for appending once, to refuse a bad path at start.
    pub fn open(path: &Path) -> Result<Arc<AuditLog>, AuditError> {
        let log = AuditLog {
            path: path.to_owned(),
            healthy: AtomicBool::new(true),
            writing: Mutex::new(Writer::default()),
        };
        log.find_tail().map_err(|reason| log.error(reason))?;
        Ok(Arc::new(log))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// False from a failed write until the next one succeeds.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Writes one record (with `at`, the time now) and syncs it to disk,
    /// off the async threads.
    pub async fn write(self: &Arc<Self>, record: &AuditRecord) -> Result<(), AuditError> {
        let mut value = serde_json::to_value(record).unwrap_or_default();
        if let Value::Object(fields) = &mut value {
            fields.insert(
                "at".to_owned(),
                Value::from(crate::clock::rfc3339_ms(crate::clock::now_ms())),
            );
        }
        let record = serde_json::to_vec(&value).unwrap_or_default();
        let log = self.clone();
        let written = tokio::task::spawn_blocking(move || log.append(&record))
            .await
            .unwrap_or_else(|err| Err(format!("the writer failed: {err}")));
        match written {
            Ok(()) => {
                self.healthy.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(reason) => {
                self.healthy.store(false, Ordering::Relaxed);
                let err = self.error(reason);
                log::error!("{err}");
                Err(err)
            }
        }
    }

    /// Opens (creates) the file and reads where its chain stands.
    fn find_tail(&self) -> Result<(), String> {
        let mut writer = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let file = self.open_file()?;
        let meta = file.metadata().map_err(|err| err.to_string())?;
        writer.tail = chain::last_line_hash(&file, meta.len())
            .map_err(|err| err.to_string())?
            .map(|hash| chain::Tail {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                hash,
            });
        Ok(())
    }

    fn open_file(&self) -> Result<std::fs::File, String> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&self.path)
            .map_err(|err| err.to_string())
    }

    /// Appends `record` (a JSON object), chained to the line before it
    /// ([`chain`]), whole or not at all: a record that cannot be written
    /// and synced (a full disk, an I/O error) is cut off again, so that every
    /// line of the file is one whole record, and a failed record (whose
    /// decision was refused) is not on the record.
    fn append(&self, record: &[u8]) -> Result<(), String> {
        // Plain data behind the lock; a panic elsewhere leaves nothing half-done.
        let mut writer = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut file = self.open_file()?;
        let meta = file.metadata().map_err(|err| err.to_string())?;
        if let Some(cut) = writer.cut_back.take() {
            if cut.dev == meta.dev() && cut.ino == meta.ino() && meta.len() > cut.len {
                file.set_len(cut.len)
                    .and_then(|()| file.sync_data())
                    .map_err(|err| {
                        writer.cut_back = Some(cut);
                        format!("cannot cut back a torn record: {err}")
                    })?;
            }
        }
        // Where this record starts: the end, once a torn record is cut off.
        let len = file.metadata().map_err(|err| err.to_string())?.len();
        let prev = chain::Tail::prev_hash(writer.tail.as_ref(), &file, meta.dev(), meta.ino(), len)
            .map_err(|err| format!("cannot read the chain's last line: {err}"))?;
        let (mut line, hash) = chain::seal(record, &prev);
        line.push(b'\n');
        let written = file
            .write_all(&line)
            .and_then(|()| file.sync_data())
            .map_err(|err| err.to_string());
        match written {
            Ok(()) => {
                writer.tail = Some(chain::Tail {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    len: len + line.len() as u64,
                    hash,
                });
            }
            Err(_) if file.set_len(len).and_then(|()| file.sync_data()).is_err() => {
                // Tried again first thing next time.
                writer.cut_back = Some(CutBack {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    len,
                });
            }
            Err(_) => {}
        }
        written
    }

    fn error(&self, reason: String) -> AuditError {
        AuditError {
            path: self.path.display().to_string(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(run_id: u64) -> AuditRecord {
        AuditRecord::Ended {
            run: RunFields::new(run_id, "s", None),
            outcome: ChunkType::Completion,
            reason: None,
        }
    }

    #[tokio::test]
    async fn records_are_json_lines_with_event_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        log.write(&ended(7)).await.unwrap();
        log.write(&ended(8)).await.unwrap();

        let text = std::fs::read_to_string(&path).unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0]["event"], "ended");
        assert_eq!(records[0]["run_id"], 7);
        assert_eq!(records[0]["outcome"], "completion");
        assert!(records[0].get("stored_run_id").is_none());
        assert!(records[0]["at"].as_str().unwrap().ends_with('Z'));
    }

    #[tokio::test]
    async fn a_path_that_becomes_unwritable_fails_and_health_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap(); // a directory where the file was

        let failed = log.write(&ended(1)).await;

        assert!(failed.is_err());
        assert!(!log.is_healthy());
        std::fs::remove_dir(&path).unwrap();
        log.write(&ended(1)).await.unwrap();
        assert!(log.is_healthy(), "recovers when writable again");
    }

    #[test]
    fn a_bad_path_is_refused_at_start() {
        let err = AuditLog::open(Path::new("/no/such/dir/audit.jsonl")).unwrap_err();
        assert!(err.to_string().contains("/no/such/dir/audit.jsonl"));
    }
}
