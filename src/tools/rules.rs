//! Rules on a call's arguments (`[[rule]]` tables in the tools file):
//! what the server's file decides about a call before anyone is asked.
//!
//! Rules are evaluated in file order; the first rule in `enforce` mode
//! that matches decides (`allow`: run without asking; `ask`: ask even a
//! `confirm = false` tool; `deny`: never run, never ask). A matching rule
//! in `shadow` mode decides nothing: what it would have decided is
//! recorded, and evaluation goes on as if it were absent. No match falls
//! back to the tool's `confirm`. The model never takes part: a rule reads
//! the call's arguments, the tool's name and the requester's key label.
//!
//! Bounds (docs/tools.md, "Rules and grants"): [`MAX_RULES`] rules,
//! [`MAX_MATCHERS`] argument matchers a rule, a regex's pattern
//! [`MAX_PATTERN_CHARS`] and its compiled program [`MAX_REGEX_BYTES`].

use serde::Serialize;
use serde_json::Value;
use wildmatch::WildMatch;

use super::gate::{Gate, GateKeys, GATE_KEYS};

/// Most `[[rule]]` tables one tools file may have.
pub const MAX_RULES: usize = 256;
/// Most entries a rule's `args` may have.
pub const MAX_MATCHERS: usize = 16;
/// Longest a matcher's pattern (a glob or a regex) may be, in characters.
pub const MAX_PATTERN_CHARS: usize = 1_000;
/// Largest compiled program a rule's regex may have (the `regex` crate's
/// size limit): a pattern such as `\w{1000}` is refused at start.
pub const MAX_REGEX_BYTES: usize = 256 * 1024;
/// Longest a rule's `reason` may be, in characters.
pub const MAX_REASON_CHARS: usize = 1_000;

/// What a rule decides about a call it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleDecision {
    Allow,
    Ask,
    Deny,
}

impl RuleDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleDecision::Allow => "allow",
            RuleDecision::Ask => "ask",
            RuleDecision::Deny => "deny",
        }
    }
}

/// Whether a rule decides (`enforce`) or is only recorded (`shadow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleMode {
    Enforce,
    Shadow,
}

impl RuleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleMode::Enforce => "enforce",
            RuleMode::Shadow => "shadow",
        }
    }
}

/// One `[[rule]]`, checked.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    /// The `tool` as written (a name or a glob).
    pub tool: String,
    tool_glob: WildMatch,
    args: Vec<(String, Matcher)>,
    /// Key labels it applies to; `None`: every key.
    keys: Option<Vec<String>>,
    pub decision: RuleDecision,
    pub reason: Option<String>,
    pub mode: RuleMode,
    /// An `ask` rule's say on who decides and when nobody answers (its
    /// tool's, made stricter: see [`crate::tools::gate`]); `None` when it
    /// writes none of those keys.
    pub gate: Option<Gate>,
}

/// How one argument (named by a JSON Pointer) must look.
#[derive(Debug)]
pub enum Matcher {
    /// A glob (`*`, `?`) over the value's string form; without wildcards,
    /// equality with it.
    Glob(WildMatch),
    Equals(Value),
    /// A whole-value match over the value's string form.
    Regex(regex::Regex),
    OneOf(Vec<Value>),
    Range {
        min: Option<f64>,
        max: Option<f64>,
    },
    Exists(bool),
}

/// The rules of a tools file, in file order.
#[derive(Debug, Default)]
pub struct Rules {
    list: Vec<Rule>,
}

/// What the rules say about one call: the enforcing rule that decides it,
/// if any, and the shadow rules that matched before it (each would have
/// decided it had it been enforced).
#[derive(Debug, Default)]
pub struct Ruling<'a> {
    pub enforced: Option<&'a Rule>,
    pub shadowed: Vec<&'a Rule>,
}

/// A rule that cannot be used: where (`rule "name"` or `rule #3`) and
/// what, naming the key.
#[derive(Debug)]
pub struct RuleError {
    pub place: String,
    pub message: String,
}

impl Rules {
    /// Checks the `[[rule]]` tables as written, in order.
    pub fn parse(raw: Vec<toml::Value>) -> Result<Rules, RuleError> {
        if raw.len() > MAX_RULES {
            return Err(RuleError {
                place: "the file".to_owned(),
                message: format!(
                    "key `rule`: {} rules; a tools file has at most {MAX_RULES}",
                    raw.len()
                ),
            });
        }
        let mut rules = Rules::default();
        for (position, raw) in raw.into_iter().enumerate() {
            let place = raw
                .get("name")
                .and_then(toml::Value::as_str)
                .map(|name| format!("rule \"{name}\""))
                .unwrap_or_else(|| format!("rule #{}", position + 1));
            let fail = |message: String| RuleError {
                place: place.clone(),
                message,
            };
            let rule = parse_rule(raw).map_err(&fail)?;
            if rules.list.iter().any(|other| other.name == rule.name) {
                return Err(fail(
                    "key `name`: a rule of that name is written earlier".to_owned(),
                ));
            }
            rules.list.push(rule);
        }
        Ok(rules)
    }

    /// Refuses a rule whose `tool` matches none of `names` (the declared
    /// and MCP tools): a misspelt rule would never apply.
    pub fn check_tools<'a>(
        &self,
        names: impl Iterator<Item = &'a str> + Clone,
    ) -> Result<(), RuleError> {
        for rule in &self.list {
            if !names.clone().any(|name| rule.tool_glob.matches(name)) {
                return Err(RuleError {
                    place: format!("rule \"{}\"", rule.name),
                    message: format!(
                        "key `tool`: `{}` matches no declared or MCP tool",
                        rule.tool
                    ),
                });
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first enforcing `allow` rule whose `tool` matches `tool`, if any.
    pub fn allows(&self, tool: &str) -> Option<&Rule> {
        self.list.iter().find(|rule| {
            rule.decision == RuleDecision::Allow
                && rule.mode == RuleMode::Enforce
                && rule.tool_glob.matches(tool)
        })
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The rules in file order, each as `GET /api/v1/rules` shows it.
    pub fn views(&self) -> Vec<Value> {
        self.list.iter().map(Rule::view).collect()
    }

    /// How many rules enforce (not `mode = "shadow"`).
    pub fn enforcing(&self) -> usize {
        self.list
            .iter()
            .filter(|rule| rule.mode == RuleMode::Enforce)
            .count()
    }

    /// What the rules say about a call of `tool` with `args` made for the
    /// key labelled `key`.
    pub fn evaluate(&self, tool: &str, args: &Value, key: &str) -> Ruling<'_> {
        let mut ruling = Ruling::default();
        for rule in &self.list {
            if !rule.matches(tool, args, key) {
                continue;
            }
            match rule.mode {
                RuleMode::Shadow => ruling.shadowed.push(rule),
                RuleMode::Enforce => {
                    ruling.enforced = Some(rule);
                    break;
                }
            }
        }
        ruling
    }

    /// The first enforcing `deny` rule that matches, if any (an edit's new
    /// arguments are checked with it).
    pub fn denies(&self, tool: &str, args: &Value, key: &str) -> Option<&Rule> {
        self.evaluate(tool, args, key)
            .enforced
            .filter(|rule| rule.decision == RuleDecision::Deny)
    }
}

impl Rule {
    fn matches(&self, tool: &str, args: &Value, key: &str) -> bool {
        self.tool_glob.matches(tool)
            && self
                .keys
                .as_ref()
                .is_none_or(|keys| keys.iter().any(|k| k == key))
            && self
                .args
                .iter()
                .all(|(pointer, matcher)| matcher.matches(args.pointer(pointer)))
    }
}

impl Rule {
    /// The rule as the API lists it: what it matches (its argument
    /// matchers as written), what it decides, for which keys, in which mode,
    /// and for an `ask` rule who decides (`approvers`, `approvals`).
    pub fn view(&self) -> Value {
        let args: serde_json::Map<String, Value> = self
            .args
            .iter()
            .map(|(pointer, matcher)| (pointer.clone(), matcher.view()))
            .collect();
        let mut view = serde_json::json!({
            "name": self.name,
            "tool": self.tool,
            "args": args,
            "decision": self.decision.as_str(),
            "mode": self.mode.as_str(),
            "reason": self.reason,
            "keys": self.keys,
        });
        if let Some(gate) = &self.gate {
            view["approvers"] = serde_json::json!(gate.approvers);
            view["approvals"] = serde_json::json!(gate.approvals);
        }
        view
    }
}

impl Matcher {
    /// The matcher as a rule's `args` writes it.
    fn view(&self) -> Value {
        match self {
            Matcher::Glob(glob) => Value::from(glob.to_string()),
            Matcher::Equals(value) => serde_json::json!({ "equals": value }),
            Matcher::Regex(regex) => {
                // Written whole-value: `^(?:PATTERN)$` as compiled.
                let full = regex.as_str();
                let written = full
                    .strip_prefix("^(?:")
                    .and_then(|rest| rest.strip_suffix(")$"))
                    .unwrap_or(full);
                serde_json::json!({ "regex": written })
            }
            Matcher::OneOf(values) => serde_json::json!({ "one_of": values }),
            Matcher::Range { min, max } => serde_json::json!({ "min": min, "max": max }),
            Matcher::Exists(exists) => serde_json::json!({ "exists": exists }),
        }
    }

    /// Whether the value a pointer resolved to (`None`: it did not) matches.
    pub fn matches(&self, value: Option<&Value>) -> bool {
        let Some(value) = value else {
            return matches!(self, Matcher::Exists(false));
        };
        match self {
            Matcher::Exists(exists) => *exists,
            Matcher::Glob(glob) => glob.matches(&string_form(value)),
            Matcher::Regex(regex) => regex.is_match(&string_form(value)),
            Matcher::Equals(expected) => same(expected, value),
            Matcher::OneOf(values) => values.iter().any(|expected| same(expected, value)),
            Matcher::Range { min, max } => value.as_f64().is_some_and(|number| {
                min.is_none_or(|min| number >= min) && max.is_none_or(|max| number <= max)
            }),
        }
    }
}

/// A value as a glob or a regex sees it: a string as it is, anything else
/// as JSON (`5`, `true`, `["a"]`).
fn string_form(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(text) => text.as_str().into(),
        other => other.to_string().into(),
    }
}

/// JSON equality where numbers compare by value (`5` and `5.0` are equal).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

const RULE_KEYS: [&str; 7] = ["name", "tool", "args", "keys", "decision", "reason", "mode"];

/// Checks one table; the error names the key.
fn parse_rule(raw: toml::Value) -> Result<Rule, String> {
    let toml::Value::Table(table) = raw else {
        return Err("a rule is a table".to_owned());
    };
    let known = |k: &str| RULE_KEYS.contains(&k) || GATE_KEYS.contains(&k);
    if let Some(unknown) = table.keys().find(|k| !known(k)) {
        return Err(format!(
            "key `{unknown}` is unknown (a rule has {}, and an `ask` rule {})",
            RULE_KEYS.join(", "),
            GATE_KEYS.join(", ")
        ));
    }
    let text = |key: &str| -> Result<Option<&str>, String> {
        match table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(format!("key `{key}` must be a string")),
        }
    };
    let name = text("name")?.ok_or("key `name` is missing")?.to_owned();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b' '));
    if !valid_name {
        return Err(format!(
            "key `name`: `{name}` must be 1-64 characters of A-Z a-z 0-9 _ - and space"
        ));
    }
    let tool = text("tool")?.ok_or("key `tool` is missing")?.to_owned();
    if tool.is_empty() || tool.chars().count() > 128 {
        return Err("key `tool`: a tool name or glob of 1-128 characters".to_owned());
    }
    let decision = match text("decision")? {
        Some("allow") => RuleDecision::Allow,
        Some("ask") => RuleDecision::Ask,
        Some("deny") => RuleDecision::Deny,
        Some(other) => {
            return Err(format!(
                "key `decision`: `{other}` is not allow, ask or deny"
            ))
        }
        None => return Err("key `decision` is missing (allow, ask or deny)".to_owned()),
    };
    let mode = match text("mode")? {
        None | Some("enforce") => RuleMode::Enforce,
        Some("shadow") => RuleMode::Shadow,
        Some(other) => return Err(format!("key `mode`: `{other}` is not enforce or shadow")),
    };
    let reason = text("reason")?.map(str::to_owned);
    if reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_REASON_CHARS)
    {
        return Err(format!(
            "key `reason`: longer than {MAX_REASON_CHARS} characters"
        ));
    }
    let keys = match table.get("keys") {
        None => None,
        Some(toml::Value::Array(list)) if !list.is_empty() && list.len() <= 64 => Some(
            list.iter()
                .map(|k| match k {
                    toml::Value::String(k) if !k.is_empty() && k.len() <= 64 => Ok(k.clone()),
                    _ => Err("key `keys`: each entry is a key label of 1-64 characters".to_owned()),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err("key `keys`: a list of 1-64 key labels".to_owned()),
    };
    let args = match table.get("args") {
        None => Vec::new(),
        Some(toml::Value::Table(args)) => {
            if args.len() > MAX_MATCHERS {
                return Err(format!(
                    "key `args`: {} matchers; a rule has at most {MAX_MATCHERS}",
                    args.len()
                ));
            }
            args.iter()
                .map(|(pointer, matcher)| {
                    check_pointer(pointer)
                        .and_then(|()| parse_matcher(matcher))
                        .map(|matcher| (pointer.clone(), matcher))
                        .map_err(|why| format!("key `args` \"{pointer}\": {why}"))
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => {
            return Err("key `args`: a table of JSON Pointers to matchers".to_owned());
        }
    };
    let gate = if table.keys().any(|k| GATE_KEYS.contains(&k.as_str())) {
        if decision != RuleDecision::Ask {
            return Err(format!(
                "key `decision`: only an `ask` rule names who decides and when ({}); this one \
                 is `{}`",
                GATE_KEYS.join(", "),
                decision.as_str()
            ));
        }
        Some(GateKeys::of_table(&table)?.build()?)
    } else {
        None
    };
    Ok(Rule {
        gate,
        tool_glob: WildMatch::new(&tool),
        name,
        tool,
        args,
        keys,
        decision,
        reason,
        mode,
    })
}

/// A JSON Pointer (RFC 6901): empty, or `/`-separated tokens where `~` is
/// only `~0` or `~1`.
fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err("not a JSON Pointer (it starts with `/`, such as `/env`)".to_owned());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("not a JSON Pointer (`~` is only `~0` or `~1`)".to_owned());
        }
    }
    Ok(())
}

const MATCHER_KEYS: [&str; 6] = ["equals", "regex", "one_of", "min", "max", "exists"];

fn parse_matcher(raw: &toml::Value) -> Result<Matcher, String> {
    let table = match raw {
        toml::Value::String(glob) => {
            if glob.chars().count() > MAX_PATTERN_CHARS {
                return Err(format!("a glob is at most {MAX_PATTERN_CHARS} characters"));
            }
            return Ok(Matcher::Glob(WildMatch::new(glob)));
        }
        toml::Value::Table(table) => table,
        _ => return Err("a matcher is a string (a glob) or a table".to_owned()),
    };
    if let Some(unknown) = table.keys().find(|k| !MATCHER_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "`{unknown}` is not a matcher ({})",
            MATCHER_KEYS.join(", ")
        ));
    }
    let range = table.contains_key("min") || table.contains_key("max");
    let kinds = table.len() - usize::from(table.contains_key("min") && table.contains_key("max"));
    if kinds != 1 {
        return Err(format!(
            "a matcher has exactly one of {} (`min` and `max` may go together)",
            MATCHER_KEYS.join(", ")
        ));
    }
    if range {
        let number = |key: &str| -> Result<Option<f64>, String> {
            match table.get(key) {
                None => Ok(None),
                Some(toml::Value::Integer(n)) => Ok(Some(*n as f64)),
                Some(toml::Value::Float(n)) if n.is_finite() => Ok(Some(*n)),
                Some(_) => Err(format!("`{key}` must be a number")),
            }
        };
        return Ok(Matcher::Range {
            min: number("min")?,
            max: number("max")?,
        });
    }
    let (key, value) = table.iter().next().ok_or("an empty matcher")?;
    match key.as_str() {
        "equals" => Ok(Matcher::Equals(json_of(value)?)),
        "one_of" => match value {
            toml::Value::Array(list) if !list.is_empty() && list.len() <= 256 => Ok(
                Matcher::OneOf(list.iter().map(json_of).collect::<Result<_, _>>()?),
            ),
            _ => Err("`one_of` must be a list of 1-256 values".to_owned()),
        },
        "exists" => match value {
            toml::Value::Boolean(exists) => Ok(Matcher::Exists(*exists)),
            _ => Err("`exists` must be true or false".to_owned()),
        },
        "regex" => {
            let toml::Value::String(pattern) = value else {
                return Err("`regex` must be a string".to_owned());
            };
            if pattern.chars().count() > MAX_PATTERN_CHARS {
                return Err(format!("`regex` is at most {MAX_PATTERN_CHARS} characters"));
            }
            // `.` matches a newline too: a `deny` on `prod.*` must not
            // miss `"prod\nx"`.
            regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
                .dot_matches_new_line(true)
                .size_limit(MAX_REGEX_BYTES)
                .build()
                .map(Matcher::Regex)
                .map_err(|err| {
                    let why = err
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                        .to_owned();
                    format!("`regex` cannot be used: {why}")
                })
        }
        _ => Err("an unknown matcher".to_owned()),
    }
}

/// A grant's `args` (JSON: pointers to matchers, as a rule's): checked
/// and compiled; the error names the pointer.
pub fn matchers_of_json(
    args: &serde_json::Map<String, Value>,
) -> Result<Vec<(String, Matcher)>, String> {
    if args.len() > MAX_MATCHERS {
        return Err(format!(
            "args: {} matchers; at most {MAX_MATCHERS}",
            args.len()
        ));
    }
    args.iter()
        .map(|(pointer, matcher)| {
            let matcher = toml::Value::try_from(matcher)
                .map_err(|_| "not a matcher (no nulls in a matcher)".to_owned())
                .and_then(|matcher| check_pointer(pointer).and_then(|()| parse_matcher(&matcher)))
                .map_err(|why| format!("args \"{pointer}\": {why}"))?;
            Ok((pointer.clone(), matcher))
        })
        .collect()
}

/// Whether every matcher accepts `args`.
pub fn all_match(matchers: &[(String, Matcher)], args: &Value) -> bool {
    matchers
        .iter()
        .all(|(pointer, matcher)| matcher.matches(args.pointer(pointer)))
}

fn json_of(value: &toml::Value) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|err| format!("not a JSON value: {err}"))
}

#[cfg(test)]
mod tests;
