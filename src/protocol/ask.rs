//! What a pause asked, by its kind, as one value ([`Ask`], generated from
//! the table of kinds): kept with a stored paused record; on the wire (the
//! record's JSON) it is the fields every version wrote: `tasks` always
//! (empty for questions), `kind`, and a question pause's `title` and
//! `questions` (absent for an approval). A record without `kind` (an older
//! version's) is an approval.

use serde::de::Deserializer;
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use super::kinds::contract::Fields;
use super::kinds::Ask;
use super::task_spec::TaskSpec;

impl Ask {
    /// A plan's tasks, whose gates (timers, what silence does) hold while
    /// it waits; `None` for the kinds whose wait has no such gates.
    pub fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        self.asked().plan_tasks()
    }

    /// The tasks whose tools say who decides it (a plan's, a reconcile
    /// pause's call); `None` when one reply from anyone who may decide the
    /// session does (questions).
    pub fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        self.asked().deciding_tasks()
    }
}

impl Serialize for Ask {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.asked().fields().write(self.kind(), serializer)
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
    use crate::protocol::kinds::question_data::Asked;
    use serde_json::json;

    #[test]
    fn it_writes_and_reads_the_fields_every_version_wrote() {
        let question = Ask::Question(Asked {
            title: "t".into(),
            questions: Vec::new(),
        });
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
        let task = TaskSpec {
            index: 1,
            tool: "t".into(),
            ..TaskSpec::default()
        };
        let reconcile = Ask::Reconcile(Box::new(task.clone()));
        let written = serde_json::to_value(&reconcile).unwrap();
        assert_eq!(written["kind"], "reconcile");
        assert_eq!(written["tasks"], json!([task]));
        assert_eq!(serde_json::from_value::<Ask>(written).unwrap(), reconcile);
    }
}
