//! Who a session belongs to: the session id within the namespace of the API
//! key that started it ([`SessionKey`]), and how a store names that
//! namespace so that it survives a change of the keys' order
//! ([`Namespaces`]). Plain data, no I/O.

use std::sync::Arc;

/// Identifies a session: the session id within the
/// namespace of the API key that started it (`None` when keys are off).
/// Runs of one key are invisible to every other key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub owner: Option<u32>,
    /// Shared: a run's key is held by the registry, the run, its log and its
    /// client stream, and every copy of a held run costs memory.
    pub session_id: Arc<str>,
}

impl SessionKey {
    pub fn new(owner: Option<u32>, session_id: &str) -> SessionKey {
        SessionKey {
            owner,
            session_id: Arc::from(session_id),
        }
    }
}

/// How a record names who acted: the API key's label (`key-2`, its place in
/// the list, never the key), or `anonymous` without keys.
pub fn owner_label(owner: Option<u32>) -> String {
    Owner(owner).to_string()
}

/// Who a log line is about: the session, the run (its number in this
/// process, when known), the API key, and the pause where there is one.
/// Every line about a run is written with `run_log!`,
/// which gives these as the record's key-values (`log`'s `kv`); the
/// server's log format writes them first, one way:
/// `session="demo-1" run=7 key=key-1 pause=c-9: <message>` (the session
/// as a JSON string, as the access log writes it).
///
/// Owned (shared strings), so a call in flight can keep its run's tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTag {
    session: Quoted,
    owner: Owner,
    run: Option<u64>,
    pause: Option<Arc<str>>,
}

/// A session id as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Quoted(Arc<str>);

impl std::fmt::Display for Quoted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&serde_json::Value::from(self.0.as_ref()), f)
    }
}

/// An API key by its label ([`owner_label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner(Option<u32>);

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(i) => write!(f, "key-{}", i + 1),
            None => f.write_str("anonymous"),
        }
    }
}

impl RunTag {
    pub fn of(key: &SessionKey, run: u64) -> RunTag {
        RunTag {
            run: Some(run),
            ..RunTag::session(key)
        }
    }

    /// A session's, before (or without) a run of this process.
    pub fn session(key: &SessionKey) -> RunTag {
        RunTag {
            session: Quoted(key.session_id.clone()),
            owner: Owner(key.owner),
            run: None,
            pause: None,
        }
    }

    /// The same, about the pause `confirmation_id`.
    pub fn pause(mut self, confirmation_id: &str) -> RunTag {
        self.pause = Some(Arc::from(confirmation_id));
        self
    }
}

impl log::kv::Source for RunTag {
    fn visit<'kvs>(
        &'kvs self,
        visitor: &mut dyn log::kv::VisitSource<'kvs>,
    ) -> Result<(), log::kv::Error> {
        use log::kv::{Key, Value};
        visitor.visit_pair(Key::from_str("session"), Value::from_display(&self.session))?;
        if let Some(run) = self.run {
            visitor.visit_pair(Key::from_str("run"), Value::from(run))?;
        }
        visitor.visit_pair(Key::from_str("key"), Value::from_display(&self.owner))?;
        if let Some(pause) = &self.pause {
            visitor.visit_pair(Key::from_str("pause"), Value::from(pause.as_ref()))?;
        }
        Ok(())
    }

    fn count(&self) -> usize {
        2 + usize::from(self.run.is_some()) + usize::from(self.pause.is_some())
    }
}

/// What a log line may be about: a run ([`RunTag`]), or maybe one (a
/// tool's call outside a run has none).
pub trait About {
    fn about(&self) -> Option<&RunTag>;
}

impl About for RunTag {
    fn about(&self) -> Option<&RunTag> {
        Some(self)
    }
}

impl About for Option<&RunTag> {
    fn about(&self) -> Option<&RunTag> {
        *self
    }
}

impl<T: About + ?Sized> About for &T {
    fn about(&self) -> Option<&RunTag> {
        (**self).about()
    }
}

/// Writes one log line about a run: `tag`'s key-values and the message
/// (a plain line when it names none). Use `run_log!`, which fills in the
/// caller's module.
pub fn log_about(level: log::Level, target: &str, tag: &dyn About, args: std::fmt::Arguments<'_>) {
    let logger = log::logger();
    let metadata = log::Metadata::builder().level(level).target(target).build();
    if level > log::max_level() || !logger.enabled(&metadata) {
        return;
    }
    let mut record = log::Record::builder();
    record
        .metadata(metadata)
        .module_path(Some(target))
        .args(args);
    match tag.about() {
        Some(tag) => logger.log(&record.key_values(tag).build()),
        None => logger.log(&record.build()),
    }
}

/// A log line about a run, written one way: `run_log!(Warn, tag, "...")`
/// (the level as [`log::Level`] names it, a [`RunTag`] or an
/// `Option<&RunTag>`, then what `format!` takes).
macro_rules! run_log {
    ($level:ident, $tag:expr, $($arg:tt)+) => {
        $crate::session::log_about(
            ::log::Level::$level,
            module_path!(),
            &$tag,
            format_args!($($arg)+),
        )
    };
}
pub(crate) use run_log;

/// The stored names of the API keys' namespaces.
///
/// In memory a run's owner is its key's place in this process's list (see
/// [`SessionKey`]); that place changes when keys are added, removed or
/// reordered, between restarts or between replicas. What is stored names
/// the key instead: `k` and 32 hex digits of a SHA-256 of the key (the key
/// itself is never stored). So a stored run is only ever restored into its
/// own key's namespace, and one whose key is no longer configured is
/// reachable by nobody.
#[derive(Debug, Clone, Default)]
pub struct Namespaces {
    names: Arc<[String]>,
    /// Each key's `label=` from the keys file, if it has one.
    labels: Arc<[Option<String>]>,
}

impl Namespaces {
    /// The namespaces of `keys`, in their order (the owners' indices).
    pub fn of_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Namespaces {
        use sha2::{Digest, Sha256};
        let names = keys
            .into_iter()
            .map(|key| {
                let digest = Sha256::new()
                    .chain_update(b"chatgate namespace\0")
                    .chain_update(key.as_bytes())
                    .finalize();
                format!("k{}", hex::encode(&digest[..16]))
            })
            .collect();
        Namespaces {
            names,
            labels: Arc::from(Vec::new()),
        }
    }

    /// The keys' labels (`label=`), in the keys' order.
    pub fn with_labels(mut self, labels: Vec<Option<String>>) -> Namespaces {
        self.labels = labels.into();
        self
    }

    /// What records name `owner`'s key by: its `label=`, else `key-N`
    /// (`anonymous` without keys).
    pub fn label(&self, owner: Option<u32>) -> String {
        owner
            .and_then(|i| self.labels.get(i as usize).cloned().flatten())
            .unwrap_or_else(|| owner_label(owner))
    }

    /// The stored name of `owner`'s namespace (`None`: no keys). An owner
    /// this table does not know (no server makes one) gets a name no key's
    /// namespace has, never another key's or the keyless one.
    pub fn name(&self, owner: Option<u32>) -> Option<String> {
        owner.map(|i| {
            self.names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| format!("unknown-{i}"))
        })
    }

    /// Every owner: each key's place, or `None` without keys.
    pub fn owners(&self) -> Vec<Option<u32>> {
        if self.names.is_empty() {
            vec![None]
        } else {
            (0..self.names.len() as u32).map(Some).collect()
        }
    }

    /// The owner a stored `namespace` belongs to in this process, or
    /// `None` when no client can reach it now (its key is not configured;
    /// or it was stored without keys and keys are required now, or the
    /// other way round).
    pub fn owner(&self, namespace: Option<&str>) -> Option<Option<u32>> {
        match namespace {
            None if self.names.is_empty() => Some(None),
            None => None,
            Some(name) => self
                .names
                .iter()
                .position(|n| n == name)
                .map(|i| Some(i as u32)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_its_key_whatever_the_keys_order() {
        let before = Namespaces::of_keys(["alpha-key", "beta-key"]);
        let after = Namespaces::of_keys(["gamma-key", "beta-key"]);

        let beta = before.name(Some(1)).unwrap();
        assert_eq!(after.name(Some(1)).as_deref(), Some(beta.as_str()));
        assert_eq!(after.owner(Some(&beta)), Some(Some(1)));
        // alpha-key was removed: its runs are nobody's, not gamma-key's.
        let alpha = before.name(Some(0)).unwrap();
        assert_eq!(after.owner(Some(&alpha)), None);
        assert_ne!(alpha, beta);
        assert!(beta.starts_with('k') && beta.len() == 33);
        assert!(!beta.contains("beta"), "the key is never stored");
    }

    #[test]
    fn keyless_runs_belong_to_a_server_without_keys_only() {
        let keyless = Namespaces::of_keys([]);
        let keyed = Namespaces::of_keys(["alpha-key"]);

        assert_eq!(keyless.name(None), None);
        assert_eq!(keyless.owner(None), Some(None));
        assert_eq!(keyed.owner(None), None);
        assert_eq!(keyless.owner(keyed.name(Some(0)).as_deref()), None);
        // An index no key has is never another namespace.
        assert_eq!(keyed.name(Some(7)).as_deref(), Some("unknown-7"));
    }

    /// Collects the key-values of this module's test records.
    struct Collect(std::sync::Mutex<Vec<String>>);

    impl log::Log for Collect {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }

        fn log(&self, record: &log::Record<'_>) {
            struct Pairs(String);
            impl<'kvs> log::kv::VisitSource<'kvs> for Pairs {
                fn visit_pair(
                    &mut self,
                    key: log::kv::Key<'kvs>,
                    value: log::kv::Value<'kvs>,
                ) -> Result<(), log::kv::Error> {
                    self.0.push_str(&format!("{key}={value} "));
                    Ok(())
                }
            }
            if record.target() != module_path!() {
                return;
            }
            let mut pairs = Pairs(String::new());
            record.key_values().visit(&mut pairs).unwrap();
            let line = format!("{}| {}", pairs.0, record.args());
            self.0.lock().unwrap().push(line);
        }

        fn flush(&self) {}
    }

    #[test]
    fn a_line_about_a_run_carries_its_session_run_key_and_pause_as_key_values() {
        let collect: &'static Collect = Box::leak(Box::new(Collect(Default::default())));
        log::set_logger(collect).expect("the only logger of the unit tests");
        log::set_max_level(log::LevelFilter::Trace);

        let key = SessionKey::new(Some(0), r#"a "quoted" one"#);
        run_log!(
            Warn,
            RunTag::of(&key, 7).pause("c-1"),
            "escalated to {}",
            "leads"
        );
        run_log!(
            Info,
            RunTag::session(&SessionKey::new(None, "s")),
            "handed over"
        );
        let outside: Option<&RunTag> = None;
        run_log!(Info, outside, "a call outside a run");

        let lines = collect.0.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                r#"session="a \"quoted\" one" run=7 key=key-1 pause=c-1 | escalated to leads"#,
                r#"session="s" key=anonymous | handed over"#,
                "| a call outside a run",
            ]
        );
    }
}
