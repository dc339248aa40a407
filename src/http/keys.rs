//! The keys file (`--api-keys-file`): one key per line, `approver KEY` for
//! an approver key, each optionally followed by attributes:
//! `approver KEY label=lead-1 groups=oncall,leads max_risk=high
//! namespaces=key-1,key-2`. Blank lines and `#` comments are skipped. A
//! duplicate label, an unknown attribute or a bad value stops the start
//! with one line naming the file and the line.

use std::path::Path;

// A label or group name: 1-32 (labels 64) of A-Z a-z 0-9 _ -.
use crate::protocol::is_plain_name as is_name;
use crate::protocol::RiskLevel;

/// What a keys-file line says of its key besides the key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyAttrs {
    /// The person or bot on every record (default: the place label,
    /// `key-N` or `approver-N`).
    pub label: Option<String>,
    /// The approver groups the key belongs to.
    pub groups: Vec<String>,
    /// The highest risk of a task it may decide (default: high).
    pub max_risk: Option<RiskLevel>,
    /// The requester key labels whose pauses it may see and decide
    /// (default: all).
    pub namespaces: Option<Vec<String>>,
    /// Where its person gets mail (`email=`).
    pub email: Option<String>,
    /// Its person's Slack user id (`slack=U...`): a Slack button they press
    /// decides as this key.
    pub slack: Option<String>,
}

/// The keys of a keys file: API keys and approver keys, each with its
/// attributes (in the same order).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KeysFile {
    pub keys: Vec<String>,
    pub approvers: Vec<String>,
    pub key_attrs: Vec<KeyAttrs>,
    pub approver_attrs: Vec<KeyAttrs>,
}

/// Reads the keys file at `path`; an error names the line.
pub fn read_keys_file(path: &Path) -> std::io::Result<KeysFile> {
    parse_keys(&std::fs::read_to_string(path)?)
        .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidData, why))
}

/// A plausible mail address: `local@domain`, no spaces, at most 254
/// characters (the mail server has the last word).
fn is_address(text: &str) -> bool {
    text.len() <= 254
        && text
            .split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'))
        && !text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '<' || c == '>')
}

fn parse_keys(text: &str) -> Result<KeysFile, String> {
    let mut file = KeysFile::default();
    let mut labels: Vec<String> = Vec::new();
    // Every key's line, in the order of its list (requester, approver).
    let (mut key_lines, mut approver_lines) = (Vec::new(), Vec::new());
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", number + 1);
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let (approver, key) = match first {
            "approver" => match words.next() {
                Some(key) => (true, key),
                None => return Err(at("`approver` needs a key".to_owned())),
            },
            key => (false, key),
        };
        let mut attrs = KeyAttrs::default();
        for word in words {
            let Some((name, value)) = word.split_once('=') else {
                return Err(at(format!(
                    "`{word}` is not an attribute (label=, groups=, max_risk=, namespaces=, \
                     email=, slack=)"
                )));
            };
            match name {
                "label" if is_name(value, 64) => attrs.label = Some(value.to_owned()),
                "groups" => {
                    let groups: Vec<String> = value.split(',').map(str::to_owned).collect();
                    if !groups.iter().all(|g| is_name(g, 32)) {
                        return Err(at(format!(
                            "groups `{value}`: names of 1-32 characters of A-Z a-z 0-9 _ -"
                        )));
                    }
                    attrs.groups = groups;
                }
                "max_risk" => {
                    attrs.max_risk = Some(match value {
                        "low" => RiskLevel::Low,
                        "medium" => RiskLevel::Medium,
                        "high" => RiskLevel::High,
                        _ => {
                            return Err(at(format!(
                                "max_risk `{value}` is not low, medium or high"
                            )))
                        }
                    })
                }
                "namespaces" => {
                    let names: Vec<String> = value.split(',').map(str::to_owned).collect();
                    if !names.iter().all(|n| is_name(n, 64)) {
                        return Err(at(format!("namespaces `{value}`: requester key labels")));
                    }
                    attrs.namespaces = Some(names);
                }
                "email" if is_address(value) => attrs.email = Some(value.to_owned()),
                "email" => return Err(at(format!("email `{value}` is not a mail address"))),
                "slack" if is_name(value, 32) => attrs.slack = Some(value.to_owned()),
                "slack" => {
                    return Err(at(format!(
                        "slack `{value}`: a Slack user id (such as U024BE7LH)"
                    )))
                }
                "label" => {
                    return Err(at(format!(
                        "label `{value}`: 1-64 characters of A-Z a-z 0-9 _ -"
                    )))
                }
                other => {
                    return Err(at(format!(
                        "`{other}` is not an attribute (label, groups, max_risk, namespaces, \
                         email, slack)"
                    )))
                }
            }
        }
        if let Some(label) = &attrs.label {
            if labels.contains(label) {
                return Err(at(format!(
                    "label `{label}` is given to another key already"
                )));
            }
            labels.push(label.clone());
        }
        if approver {
            file.approvers.push(key.to_owned());
            file.approver_attrs.push(attrs);
            approver_lines.push(number + 1);
        } else {
            file.keys.push(key.to_owned());
            file.key_attrs.push(attrs);
            key_lines.push(number + 1);
        }
    }
    check_effective_labels(&file, &key_lines, &approver_lines)?;
    Ok(file)
}

/// Every key's label as the records name it (its `label=`, else its place
/// label: `key-N`, `approver-N`) is its own: a `label=approver-1` on
/// another key would let a link or a record of one key pass for the other.
fn check_effective_labels(
    file: &KeysFile,
    key_lines: &[usize],
    approver_lines: &[usize],
) -> Result<(), String> {
    let effective = |attrs: &KeyAttrs, place: String| attrs.label.clone().unwrap_or(place);
    let mut seen: Vec<(String, usize)> = vec![("anonymous".to_owned(), 0)];
    let keys = file
        .key_attrs
        .iter()
        .enumerate()
        .map(|(i, a)| (effective(a, format!("key-{}", i + 1)), key_lines[i]));
    let approvers = file.approver_attrs.iter().enumerate().map(|(i, a)| {
        (
            effective(a, format!("approver-{}", i + 1)),
            approver_lines[i],
        )
    });
    for (label, line) in keys.chain(approvers) {
        if let Some((_, first)) = seen.iter().find(|(l, _)| *l == label) {
            let (line, other) = (line.max(*first), line.min(*first));
            let whose = if other == 0 {
                "the label of a request without a key".to_owned()
            } else {
                format!("the label of the key on line {other}")
            };
            return Err(format!(
                "line {line}: label `{label}` is {whose} (a key without label= is named by \
                 its place: key-N, approver-N); give each key a label of its own"
            ));
        }
        seen.push((label, line));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_follow_the_key_and_mistakes_name_the_line() {
        let file = parse_keys(
            "# agents\nsk-agent label=ci-bot\n\napprover ak-lead label=lead-1 groups=oncall,leads max_risk=medium namespaces=ci-bot\napprover ak-plain\n",
        )
        .unwrap();
        assert_eq!(file.keys, ["sk-agent"]);
        assert_eq!(file.key_attrs[0].label.as_deref(), Some("ci-bot"));
        assert_eq!(file.approvers, ["ak-lead", "ak-plain"]);
        let lead = &file.approver_attrs[0];
        assert_eq!(lead.groups, ["oncall", "leads"]);
        assert_eq!(lead.max_risk, Some(RiskLevel::Medium));
        assert_eq!(lead.namespaces.as_deref(), Some(&["ci-bot".to_owned()][..]));
        assert_eq!(file.approver_attrs[1], KeyAttrs::default());

        for (text, line, word) in [
            ("k1 label=a\nk2 label=a\n", "line 2", "label `a`"),
            (
                "approver a1\nk1 label=approver-1\n",
                "line 2",
                "label `approver-1`",
            ),
            ("k1 label=key-2\nk2\n", "line 2", "label `key-2`"),
            ("k1 label=anonymous\n", "line 1", "label `anonymous`"),
            ("k1 colour=red\n", "line 1", "colour"),
            ("\napprover k1 max_risk=huge\n", "line 2", "max_risk"),
            ("k1 groups=a,b/c\n", "line 1", "groups"),
            ("k1 label\n", "line 1", "label"),
        ] {
            let err = parse_keys(text).unwrap_err();
            assert!(err.starts_with(line), "{err}");
            assert!(err.contains(word), "{err}");
        }
    }
}
