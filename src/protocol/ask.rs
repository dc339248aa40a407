//! What a pause asked, by its kind, as one value: a plan's tasks, or
//! questions with their title. Kept with a stored paused record; on the
//! wire (the record's JSON) it is the fields every version wrote: `tasks`
//! always (empty for questions), `kind`, and a question pause's `title`
//! and `questions` (absent for an approval). A record without `kind` (an
//! older version's) is an approval.

use serde::de::Deserializer;
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::chunk::{PauseData, TaskSpec};
use super::names::PauseKind;
use super::question::Question;

#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// A plan to approve: its tasks.
    Approval { tasks: Vec<TaskSpec> },
    /// Questions, and the title they were put under.
    Question {
        title: String,
        questions: Vec<Question>,
    },
    /// Whether a call a crash cut short took effect (#44): its task.
    Reconcile { task: Box<TaskSpec> },
}

impl Ask {
    pub fn kind(&self) -> PauseKind {
        match self {
            Ask::Approval { .. } => PauseKind::Approval,
            Ask::Question { .. } => PauseKind::Question,
            Ask::Reconcile { .. } => PauseKind::Reconcile,
        }
    }

    /// What a pause's data asks.
    pub fn of(data: &PauseData) -> Ask {
        match data {
            PauseData::Approval(data) => Ask::Approval {
                tasks: data.tasks.clone(),
            },
            PauseData::Question(data) => Ask::Question {
                title: data.title.clone(),
                questions: data.questions.clone(),
            },
            PauseData::Reconcile(data) => Ask::Reconcile {
                task: data.task.clone(),
            },
        }
    }
}

impl Default for Ask {
    /// An approval of nothing (an ended run's record keeps no tasks).
    fn default() -> Ask {
        Ask::Approval { tasks: Vec::new() }
    }
}

/// The wire fields, read back (every one may be absent); also read as
/// fields of a stored record (`crate::store::PausedRecord`).
#[derive(Deserialize)]
pub(crate) struct Fields {
    #[serde(default)]
    pub(crate) tasks: Vec<TaskSpec>,
    #[serde(default)]
    pub(crate) kind: PauseKind,
    #[serde(default)]
    pub(crate) title: String,
    #[serde(default)]
    pub(crate) questions: Vec<Question>,
}

impl From<Fields> for Ask {
    fn from(fields: Fields) -> Ask {
        match fields.kind {
            PauseKind::Approval => Ask::Approval {
                tasks: fields.tasks,
            },
            PauseKind::Question => Ask::Question {
                title: fields.title,
                questions: fields.questions,
            },
            PauseKind::Reconcile => Ask::Reconcile {
                task: Box::new(fields.tasks.into_iter().next().unwrap_or_default()),
            },
        }
    }
}

impl Serialize for Ask {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("Ask", 4)?;
        match self {
            Ask::Approval { tasks } => {
                fields.serialize_field("tasks", tasks)?;
                fields.serialize_field("kind", &PauseKind::Approval)?;
                fields.skip_field("title")?;
                fields.skip_field("questions")?;
            }
            Ask::Question { title, questions } => {
                fields.serialize_field("tasks", &[] as &[TaskSpec])?;
                fields.serialize_field("kind", &PauseKind::Question)?;
                if title.is_empty() {
                    fields.skip_field("title")?;
                } else {
                    fields.serialize_field("title", title)?;
                }
                if questions.is_empty() {
                    fields.skip_field("questions")?;
                } else {
                    fields.serialize_field("questions", questions)?;
                }
            }
            Ask::Reconcile { task } => {
                fields.serialize_field("tasks", std::slice::from_ref(&**task))?;
                fields.serialize_field("kind", &PauseKind::Reconcile)?;
                fields.skip_field("title")?;
                fields.skip_field("questions")?;
            }
        }
        fields.end()
    }
}

impl<'de> Deserialize<'de> for Ask {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Ask, D::Error> {
        Fields::deserialize(deserializer).map(Ask::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn it_writes_and_reads_the_fields_every_version_wrote() {
        let question = Ask::Question {
            title: "t".into(),
            questions: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(&question).unwrap(),
            json!({"tasks": [], "kind": "question", "title": "t"})
        );
        let approval = Ask::default();
        assert_eq!(
            serde_json::to_string(&approval).unwrap(),
            r#"{"tasks":[],"kind":"approval"}"#
        );
        let old: Ask = serde_json::from_value(json!({"tasks": []})).unwrap();
        assert_eq!(old, approval, "no kind: an approval");
        let read: Ask =
            serde_json::from_value(json!({"tasks": [], "kind": "question", "title": "t"})).unwrap();
        assert_eq!(read, question);
    }
}
