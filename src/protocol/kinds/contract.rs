//! What every kind of pause says of itself, and the macro that turns the
//! table of kinds (`protocol/kinds.rs`) into [`PauseData`](super::PauseData)
//! and [`Ask`](super::Ask) with their dispatch. A kind's wire type
//! implements [`KindWire`] (and so [`KindData`]) in its own file; what a
//! stored record keeps of it implements [`KindAsked`].

use serde::de::DeserializeOwned;
use serde::ser::{SerializeStruct, Serializer};
use serde::Deserialize;

use crate::protocol::agui::face::AguiFace;
use crate::protocol::names::{Action, PauseKind, RiskLevel};
use crate::protocol::question::Question;
use crate::protocol::task_spec::TaskSpec;

/// Who decides a pause and what silence does, as its data says (mail,
/// Slack and the page word it).
pub struct Deciding<'a> {
    pub required: usize,
    pub groups: &'a [String],
    pub on_timeout: Option<&'a str>,
    pub expires_at: &'a str,
    pub escalate_to: Option<&'a str>,
    pub escalates_at: Option<&'a str>,
}

impl<'a> Deciding<'a> {
    /// One reply from anyone who may decide, by `expires_at`; silence
    /// cancels.
    pub fn one_reply(expires_at: &'a str) -> Deciding<'a> {
        Deciding {
            required: 1,
            groups: &[],
            on_timeout: None,
            expires_at,
            escalate_to: None,
            escalates_at: None,
        }
    }
}

/// What the faces read of a pause's data, whatever its kind: the inbox,
/// the link page and its form, mail, Slack, the waiting pauses, AG-UI and
/// A2A ask these (through [`PauseData`](super::PauseData)'s methods of the
/// same names) instead of matching its kinds.
pub trait KindData {
    /// The id of the pause it asks.
    fn confirmation_id(&self) -> &str;
    /// When it expires (RFC 3339, UTC).
    fn expires_at(&self) -> &str;
    /// Who decides it, and what silence does.
    fn deciding(&self) -> Deciding<'_>;
    /// The tasks decided one by one, each its own pending entry.
    fn tasks_one_by_one(&self) -> &[TaskSpec];
    /// The tasks its decision is about.
    fn tasks(&self) -> &[TaskSpec];
    /// The questions it asks.
    fn questions(&self) -> &[Question];
    /// Its risk, where it decides on tasks.
    fn risk_level(&self) -> Option<RiskLevel>;
    /// Its title, where it has one of its own.
    fn title(&self) -> Option<&str>;
    /// What it says of itself beside its tasks.
    fn message(&self) -> Option<&str>;
    /// What an inbox line sums it up with (`request`: the text of the
    /// request that asked it).
    fn summary<'a>(&'a self, request: &'a str) -> Option<&'a str>;
    /// Whether people other than one requester must decide it.
    fn needs_others(&self) -> bool;
}

/// A kind's wire type, as the table names it.
pub trait KindWire: KindData + AguiFace + DeserializeOwned {
    /// Which kind it is.
    const KIND: PauseKind;
    /// The actions a pause of this kind may offer (its `options` are
    /// these, or some of them): what its card's buttons and forms are.
    const OFFERS: &'static [Action];
    /// What a stored paused record keeps of a pause of this kind.
    type Asked: KindAsked;
    /// What a stored paused record keeps of it.
    fn asked(&self) -> Self::Asked;
    /// Its `kind` field, set to [`KindWire::KIND`] once read.
    fn kind_mut(&mut self) -> &mut PauseKind;
}

/// What a stored paused record keeps of a pause of one kind.
pub trait KindAsked: Sized {
    /// Read back from the record's fields.
    fn from_fields(fields: Fields) -> Self;
    /// Written as the record's fields (`kind` aside).
    fn fields(&self) -> WrittenAsk<'_>;
    /// The tasks whose gates (timers, what silence does) hold while it
    /// waits; `None` for the kinds whose wait has no such gates.
    fn plan_tasks(&self) -> Option<&[TaskSpec]>;
    /// The tasks whose tools say who decides it; `None` when one reply
    /// from anyone who may decide the session does.
    fn deciding_tasks(&self) -> Option<&[TaskSpec]>;
}

/// A stored record's fields, read back (every one may be absent); also
/// read as fields of a stored record (`crate::protocol::record`).
#[derive(Deserialize)]
pub struct Fields {
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    #[serde(default)]
    pub kind: PauseKind,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub questions: Vec<Question>,
}

/// The fields a kind writes its stored record as: `tasks` always, `title`
/// and `questions` where not empty.
pub struct WrittenAsk<'a> {
    pub tasks: &'a [TaskSpec],
    pub title: &'a str,
    pub questions: &'a [Question],
}

impl WrittenAsk<'_> {
    /// Writes them, with `kind`, in the order every version wrote.
    pub(crate) fn write<S: Serializer>(
        &self,
        kind: PauseKind,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("Ask", 4)?;
        fields.serialize_field("tasks", self.tasks)?;
        fields.serialize_field("kind", &kind)?;
        if self.title.is_empty() {
            fields.skip_field("title")?;
        } else {
            fields.serialize_field("title", self.title)?;
        }
        if self.questions.is_empty() {
            fields.skip_field("questions")?;
        } else {
            fields.serialize_field("questions", self.questions)?;
        }
        fields.end()
    }
}

/// Generates [`PauseData`](super::PauseData) and [`Ask`](super::Ask) with
/// their dispatch from the table of kinds: `Variant(Payload) [as Data]`,
/// one row per [`PauseKind`] (the matches on it are exhaustive: the
/// compiler names a missing or unknown row), the first row the kind of a
/// record without one (an older version's: an approval). `Payload` is what
/// `PauseData` holds (`Data`, or `Box<Data>` for a large one).
macro_rules! pause_kinds {
    (@generate $first:ident; $($(#[$doc:meta])* $variant:ident($payload:ty, $data:ty)),*) => {
        /// Whatever pause a chunk's `confirmation_data` holds, written with
        /// its `kind` and read back by it (no `kind`, an older version's:
        /// the table's first row).
        #[derive(Debug, Clone, PartialEq, ::serde::Serialize)]
        #[serde(untagged)]
        pub enum PauseData {
            $($(#[$doc])* $variant($payload)),*
        }

        impl PauseKind {
            /// The actions a pause of this kind may offer.
            pub fn offers(self) -> &'static [$crate::protocol::names::Action] {
                match self {
                    $(PauseKind::$variant => <$data as $crate::protocol::kinds::contract::KindWire>::OFFERS),*
                }
            }
        }

        impl PauseData {
            /// `kind`'s data, read from `rest` (which may lack the `kind`).
            pub(crate) fn of_kind<'de, D: ::serde::Deserializer<'de>>(
                kind: PauseKind,
                rest: D,
            ) -> Result<PauseData, D::Error> {
                use ::serde::Deserialize;
                Ok(match kind {
                    $(PauseKind::$variant => {
                        let mut data = <$data>::deserialize(rest)?;
                        *$crate::protocol::kinds::contract::KindWire::kind_mut(&mut data) = kind;
                        PauseData::$variant(data.into())
                    })*
                })
            }

            /// The kind of pause it asks.
            pub fn kind(&self) -> PauseKind {
                match self {
                    $(PauseData::$variant(_) => PauseKind::$variant),*
                }
            }

            /// What the faces read of it.
            pub fn view(&self) -> &dyn $crate::protocol::kinds::contract::KindData {
                match self {
                    $(PauseData::$variant(data) => ::std::borrow::Borrow::<$data>::borrow(data)),*
                }
            }

            /// How AG-UI shows it and reads a `resume` of it.
            pub fn agui(&self) -> &dyn $crate::protocol::agui::face::AguiFace {
                match self {
                    $(PauseData::$variant(data) => ::std::borrow::Borrow::<$data>::borrow(data)),*
                }
            }
        }

        $(impl From<$data> for PauseData {
            fn from(data: $data) -> PauseData {
                PauseData::$variant(data.into())
            }
        })*

        /// What a pause asked, by its kind, as one value: kept with a stored
        /// paused record, written as the fields every version wrote (`tasks`
        /// always, `kind`, a `title` and `questions` where a kind keeps them).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Ask {
            $($variant(<$data as $crate::protocol::kinds::contract::KindWire>::Asked)),*
        }

        impl Ask {
            /// What a pause's data asks.
            pub fn of(data: &PauseData) -> Ask {
                match data {
                    $(PauseData::$variant(data) => Ask::$variant(
                        $crate::protocol::kinds::contract::KindWire::asked(
                            ::std::borrow::Borrow::<$data>::borrow(data),
                        ),
                    )),*
                }
            }

            pub fn kind(&self) -> PauseKind {
                match self {
                    $(Ask::$variant(_) => PauseKind::$variant),*
                }
            }

            pub(crate) fn asked(&self) -> &dyn $crate::protocol::kinds::contract::AskedView {
                match self {
                    $(Ask::$variant(asked) => asked),*
                }
            }
        }

        impl Default for Ask {
            /// The first row's, of nothing (an ended run's record keeps no
            /// tasks).
            fn default() -> Ask {
                Ask::$first(Default::default())
            }
        }

        impl From<$crate::protocol::kinds::contract::Fields> for Ask {
            fn from(fields: $crate::protocol::kinds::contract::Fields) -> Ask {
                match fields.kind {
                    $(PauseKind::$variant => Ask::$variant(<
                        <$data as $crate::protocol::kinds::contract::KindWire>::Asked
                        as $crate::protocol::kinds::contract::KindAsked
                    >::from_fields(fields))),*
                }
            }
        }
    };
    (
        $(#[$first_doc:meta])* $first:ident($first_payload:ty $(as $first_data:ty)?),
        $($(#[$doc:meta])* $variant:ident($payload:ty $(as $data:ty)?)),* $(,)?
    ) => {
        $crate::protocol::kinds::contract::pause_kinds!(@generate $first;
            $(#[$first_doc])*
            $first($first_payload, $crate::protocol::kinds::contract::data_ty!($first_payload $(, $first_data)?)),
            $($(#[$doc])* $variant($payload, $crate::protocol::kinds::contract::data_ty!($payload $(, $data)?))),*
        );
    };
}

/// The data type of a table row: its `as` type, else its payload.
macro_rules! data_ty {
    ($payload:ty) => {
        $payload
    };
    ($payload:ty, $data:ty) => {
        $data
    };
}

pub(crate) use {data_ty, pause_kinds};

/// [`KindAsked`] as an object, for [`Ask`](super::Ask)'s dispatch.
pub trait AskedView {
    fn fields(&self) -> WrittenAsk<'_>;
    fn plan_tasks(&self) -> Option<&[TaskSpec]>;
    fn deciding_tasks(&self) -> Option<&[TaskSpec]>;
}

impl<T: KindAsked> AskedView for T {
    fn fields(&self) -> WrittenAsk<'_> {
        KindAsked::fields(self)
    }
    fn plan_tasks(&self) -> Option<&[TaskSpec]> {
        KindAsked::plan_tasks(self)
    }
    fn deciding_tasks(&self) -> Option<&[TaskSpec]> {
        KindAsked::deciding_tasks(self)
    }
}
