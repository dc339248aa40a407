//! The shape of `src/`, checked: imports flow one way (no cycle among the
//! modules, and every top-level module names only modules of a lower rank
//! in [`RANKS`]), the Layout of `lib.rs` and of the README name every
//! module, and no file grows past a size one reads in a sitting without
//! saying why in its `//!` header.
//!
//! The import graph has one node per file (`src/run/mod.rs` is `run`,
//! `src/run/replay.rs` is `run::replay`) and an edge for every path a file names
//! outside its test modules: `use crate::...`, `use super::...`,
//! `use self::...`, and paths written inline (`crate::store::open(..)`).
//! A path counts as naming the deepest module file it reaches.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest file, in lines, that needs no reason.
const MAX_LINES: usize = 600;

/// The layers, top to bottom: a top-level module may name only modules of
/// a lower rank (two of one rank name neither the other). A new module gets
/// its place here, which is where it says what it may use.
const RANKS: &[(&str, u32)] = &[
    ("startup", 14),
    ("config", 13),
    ("http", 12),
    ("engine", 12),
    ("run", 11),
    ("cluster", 10),
    ("webhook", 10),
    ("receipt", 10),
    ("confirmation", 10),
    ("metrics", 9),
    ("pause", 9),
    ("notify", 9),
    ("audit", 9),
    ("store", 8),
    ("decider", 8),
    ("tools", 8),
    ("sse", 8),
    ("session", 7),
    ("protocol", 6),
    ("redact", 6),
    ("clock", 6),
];

#[test]
fn every_top_level_module_names_only_modules_ranked_below_it() {
    let rank: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let top = |module: &str| module.split("::").next().unwrap_or(module).to_owned();
    let mut unranked = BTreeSet::new();
    let mut climbing = Vec::new();
    for (from, targets) in import_edges() {
        for to in targets {
            let (a, b) = (top(&from), top(&to));
            // `crate` is lib.rs, which declares every module.
            if a == b || a == "crate" {
                continue;
            }
            match (rank.get(a.as_str()), rank.get(b.as_str())) {
                (Some(ra), Some(rb)) if ra > rb => {}
                (Some(_), Some(_)) => climbing.push(format!("{from} -> {to}")),
                _ => {
                    unranked.insert(if rank.contains_key(a.as_str()) { b } else { a });
                }
            }
        }
    }
    for module in modules().keys().filter(|m| *m != "crate") {
        if !rank.contains_key(top(module).as_str()) {
            unranked.insert(top(module));
        }
    }
    assert!(
        unranked.is_empty(),
        "modules with no rank in RANKS: {unranked:?}"
    );
    assert!(
        climbing.is_empty(),
        "imports that climb or cross a layer (see RANKS):\n{}",
        climbing.join("\n")
    );
}

#[test]
fn the_layout_of_lib_rs_and_the_readme_name_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Layout section in the README");
    for (module, _) in RANKS {
        assert!(
            lib.contains(&format!("[`{module}`]")),
            "the Layout table of src/lib.rs does not name `{module}`"
        );
        let file = format!("src/{module}.rs");
        let dir = format!("src/{module}/");
        assert!(
            layout.contains(&file) || layout.contains(&dir),
            "the README's Layout does not name {file} or {dir}"
        );
    }
}

#[test]
fn imports_under_src_form_no_cycle() {
    let edges = import_edges();
    let names: BTreeSet<String> = modules().keys().cloned().collect();
    let cycles = find_cycles(&names, &edges);
    assert!(
        cycles.is_empty(),
        "import cycles among the files under src/:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn imports_between_top_level_modules_form_no_cycle() {
    // `engine` naming `run::log` while `run` names `engine` is a cycle of
    // the two layers even when no two files name each other.
    let top = |module: &str| module.split("::").next().unwrap_or(module).to_owned();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in import_edges() {
        for to in targets {
            if top(&from) != top(&to) {
                edges.entry(top(&from)).or_default().insert(top(&to));
            }
        }
    }
    let names: BTreeSet<String> = modules().keys().map(|m| top(m)).collect();
    let cycles = find_cycles(&names, &edges);
    assert!(
        cycles.is_empty(),
        "import cycles among the top-level modules:\n{}",
        cycles.join("\n")
    );
}

/// Who names whom: module -> the modules it names.
fn import_edges() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = without_tests(&std::fs::read_to_string(file).unwrap());
        for path in paths(&text) {
            // A child naming its parent is an edge too: the parent
            // declares the child, but declaring is not importing.
            if let Some(target) = resolve(module, &path, &names).filter(|t| t != module) {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

#[test]
fn no_file_under_src_is_long_without_saying_why() {
    let mut long = Vec::new();
    for file in rust_files(Path::new("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        let header: String = text
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        if lines > MAX_LINES && !header.contains("Longer than") {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines whose `//!` does not say why (\"Longer than ... because ...\"):\n{}",
        long.join("\n")
    );
}

/// #26: what is written of a pause event (its audit record, its webhook
/// event) is built in `run/journal.rs` alone.
#[test]
fn only_the_journal_builds_audit_records_and_webhook_events_under_run() {
    let mut found = Vec::new();
    for file in rust_files(Path::new("src/run")) {
        if file.ends_with("journal.rs") {
            continue;
        }
        let code = without_tests(&std::fs::read_to_string(&file).unwrap());
        // The webhook event and its types are not even named; an audit
        // record may be passed on (a type), never built (`AuditRecord::`).
        for word in ["Event", "EventType", "About", "event_rows"] {
            if find_word(&code, word).is_some() {
                found.push(format!("{} names {word}", file.display()));
            }
        }
        let compact: String = code.split_whitespace().collect();
        if compact.contains("AuditRecord::") || compact.contains("AuditRecord{") {
            found.push(format!("{} builds an AuditRecord", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "use run::journal instead:\n{}",
        found.join("\n")
    );
    let journal = without_tests(&std::fs::read_to_string("src/run/journal.rs").unwrap());
    assert!(journal.contains("AuditRecord::Decided") && journal.contains("Event::decided"));
}

/// Every module file of the library, by module path.
fn modules() -> BTreeMap<String, PathBuf> {
    let mut modules = BTreeMap::new();
    for file in rust_files(Path::new("src")) {
        let relative = file.strip_prefix("src").unwrap().with_extension("");
        let parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let name = match parts.as_slice() {
            [only] if only == "lib" => "crate".to_owned(),
            [only] if only == "main" => continue, // the binary: another crate
            [rest @ .., last] if last == "mod" => rest.join("::"),
            all => all.join("::"),
        };
        modules.insert(name, file);
    }
    modules
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The text without `#[cfg(test)]` items (test modules and helpers) and
/// without comments and string literals, which may mention any path.
fn without_tests(text: &str) -> String {
    let code = strip_comments_and_strings(text);
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // Skip the item: to the end of its first `{...}` block, or its `;`.
        let brace = after.find('{');
        let semi = after.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => {
                let mut depth = 0;
                let mut end = after.len();
                for (i, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn strip_comments_and_strings(text: &str) -> String {
    let bytes: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == '*' && bytes[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && is_raw_start(&bytes, i) {
            // r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while bytes.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1; // the quote
            loop {
                if j >= bytes.len() {
                    break;
                }
                if bytes[j] == '"' && (0..hashes).all(|k| bytes.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                if bytes[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next.is_some() && bytes.get(i + 2) == Some(&'\'') {
            // a char literal like '{'
            out.push_str("' '");
            i += 3;
        } else if c == '\'' && next == Some('\\') {
            // an escaped char literal like '\n' or '\''
            let mut j = i + 2;
            while j < bytes.len() && bytes[j] != '\'' {
                j += 1;
            }
            if bytes.get(i + 2) == Some(&'\'') {
                j = i + 3;
                while j < bytes.len() && bytes[j] != '\'' {
                    j += 1;
                }
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_raw_start(chars: &[char], at: usize) -> bool {
    let before = at.checked_sub(1).map(|i| chars[i]);
    !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Every path the code names that starts with `crate`, `super` or `self`,
/// as segments (use trees expanded).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    // `use` statements, trees expanded.
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        let tree: String = after[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        expand(&tree, &mut Vec::new(), &mut found);
        rest = &after[end..];
    }
    // Inline paths: `a::b(::c)*` anywhere in the code (`crate::x::y`,
    // `super::x`, or a child module's `replay::Replay`).
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = (chars[i].is_alphabetic() || chars[i] == '_')
            && !(i > 0
                && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':'));
        if !starts_word {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == ':')
        {
            i += 1;
        }
        let path: String = chars[start..i].iter().collect();
        let segments: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if segments.len() > 1 && path.contains("::") {
            found.push(segments);
        }
    }
    found
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if boundary(before) && boundary(after) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        let mut parts = Vec::new();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&inner[start..]);
        let len = prefix.len();
        prefix.extend(head);
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            expand(part, prefix, out);
        }
        prefix.truncate(len);
    } else {
        let name = tree.split(" as ").next().unwrap_or(tree);
        let mut path = prefix.clone();
        path.extend(
            name.split("::")
                .filter(|s| !s.is_empty() && *s != "*")
                .map(str::to_owned),
        );
        if !path.is_empty() {
            out.push(path);
        }
    }
}

/// The deepest module a path reaches, from `module`.
fn resolve(module: &str, path: &[String], names: &BTreeSet<String>) -> Option<String> {
    let mut base: Vec<String> = if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut segments = path.iter();
    match segments.next()?.as_str() {
        "crate" => base.clear(),
        "self" => {}
        "super" => {
            base.pop();
            for next in segments.clone() {
                if next == "super" {
                    base.pop();
                    segments.next();
                } else {
                    break;
                }
            }
        }
        // A relative path: a child module of this one (`replay::Replay` in
        // `run`), or something else (a crate, a type): no module edge.
        first => {
            let mut child = base.clone();
            child.push(first.to_owned());
            if !names.contains(&child.join("::")) {
                return None;
            }
            base = child;
        }
    }
    let mut best = if base.is_empty() {
        "crate".to_owned()
    } else {
        base.join("::")
    };
    let mut current = base;
    for segment in segments {
        current.push(segment.clone());
        let name = current.join("::");
        if names.contains(&name) {
            best = name;
        } else {
            break;
        }
    }
    names.contains(&best).then_some(best)
}

fn find_cycles(
    names: &BTreeSet<String>,
    edges: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    // Tarjan's strongly connected components; a component of more than one
    // module is a cycle, shown with one path around it.
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        next: usize,
        components: Vec<Vec<String>>,
    }
    fn visit(state: &mut State<'_>, node: &str) {
        state.index.insert(node.to_owned(), state.next);
        state.low.insert(node.to_owned(), state.next);
        state.next += 1;
        state.stack.push(node.to_owned());
        state.on_stack.insert(node.to_owned());
        let targets: Vec<String> = state
            .edges
            .get(node)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        for target in targets {
            if !state.index.contains_key(&target) {
                visit(state, &target);
                let low = state.low[node].min(state.low[&target]);
                state.low.insert(node.to_owned(), low);
            } else if state.on_stack.contains(&target) {
                let low = state.low[node].min(state.index[&target]);
                state.low.insert(node.to_owned(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            loop {
                let top = state.stack.pop().unwrap();
                state.on_stack.remove(&top);
                let done = top == node;
                component.push(top);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                state.components.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        components: Vec::new(),
    };
    for name in names {
        if !state.index.contains_key(name) {
            visit(&mut state, name);
        }
    }
    state
        .components
        .iter()
        .map(|component| {
            let members: BTreeSet<&String> = component.iter().collect();
            format!(
                "{} (edges inside: {})",
                component.join(", "),
                component
                    .iter()
                    .flat_map(|from| {
                        edges
                            .get(from)
                            .into_iter()
                            .flatten()
                            .filter(|to| members.contains(to))
                            .map(move |to| format!("{from} -> {to}"))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })
        .collect()
}

/// Who may decide a pause is one rule (`src/decider.rs`): no other file
/// compares a key's risk or checks a key's groups.
#[test]
fn the_who_may_decide_rule_is_defined_once() {
    let risk = regex_lite(r"max_risk\s*(<|>)|(<|>)=?\s*[a-z_.]*max_risk\b");
    let groups = regex_lite(r"(decider|person|caller|key|p)\.groups\.(contains|iter)");
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        if file.ends_with("decider.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if risk(code) || groups(code) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "who may decide is decided by crate::decider::may_decide alone:\n{}",
        found.join("\n")
    );
}

/// Kind comparisons by `==` (or a `matches!`, an `if let`, a `let else`:
/// anything the compiler would not name for a new kind) live in `pause/`
/// only (elsewhere: an exhaustive match, or a method of the kind).
#[test]
fn no_kind_is_compared_by_eq_outside_pause() {
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        if file.starts_with("src/pause") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // A kind tested by `==`, `matches!`, `if let` or `let ... else`
            // falls through for a new kind without the compiler naming it.
            let kinds = ["PauseKind::", "Ask::", "PauseData::", "Asking::"];
            let partial = kinds.iter().any(|kind| {
                code.contains(&format!("== {kind}"))
                    || code.contains(&format!("!= {kind}"))
                    || code.contains(&format!("== crate::protocol::{kind}"))
                    || (code.contains("matches!(") && code.contains(kind))
                    || code.contains(&format!("if let {kind}"))
                    || (code.contains(&format!("let {kind}")) && code.contains("else"))
            });
            if partial {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "kind comparisons:\n{}", found.join("\n"));
}

/// The places that name a kind of pause in a `match` arm (#39): the
/// wire table and the kinds' wire files (`protocol/kinds*`), the run table
/// and the kinds' run files (`run/context/kinds*`), `pause/` (where
/// `Asking` dispatches each kind's reply check), the chunk's own
/// accessors, and its card (the link page). A kind's AG-UI interrupts live
/// in its wire file (`AguiFace`); the registry asks `Asking::check`. A new kind touches these
/// (the compiler names each), and nothing else grows an arm per kind.
#[test]
fn kinds_are_matched_only_in_their_tables_their_files_and_their_cards() {
    const MAY: [&str; 6] = [
        "src/protocol/kinds",
        "src/run/context/kinds",
        "src/pause/",
        "src/protocol/chunk.rs",
        "src/http/links/page.rs",
        // Its own tests only (see `without_tests`).
        "src/confirmation/tests",
    ];
    let arm = regex_lite(r"\b(PauseKind|PauseData|Ask|Asking)::[A-Z][A-Za-z]*\b[^;]*=>");
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        let path = file.display().to_string();
        if MAY.iter().any(|may| path.starts_with(may)) {
            continue;
        }
        let text = without_tests(&std::fs::read_to_string(&file).unwrap());
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if arm(code) {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a kind matched outside its tables, files and cards:\n{}",
        found.join("\n")
    );
}

/// A line matcher for the fitness tests: the `regex` crate the server
/// depends on.
fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
    let regex = regex::Regex::new(pattern).unwrap();
    move |text| regex.is_match(text)
}

/// Most lines an HTTP handler (a function under `src/http/` that takes the
/// request) may have: extract, check, one call below HTTP, respond.
const MAX_HANDLER_LINES: usize = 60;

#[test]
fn no_http_handler_is_over_sixty_lines() {
    let mut long = Vec::new();
    for file in rust_files(Path::new("src/http")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i].trim_start();
            let is_fn = line.starts_with("fn ")
                || line.starts_with("async fn ")
                || line.starts_with("pub fn ")
                || line.starts_with("pub async fn ")
                || line.starts_with("pub(crate) async fn ")
                || line.starts_with("pub(super) async fn ");
            if !is_fn {
                i += 1;
                continue;
            }
            // The signature, to its opening brace; then the body, to the
            // brace that closes it.
            let mut signature = String::new();
            let mut j = i;
            while j < lines.len() && !lines[j].contains('{') {
                signature.push_str(lines[j]);
                j += 1;
            }
            signature.push_str(lines.get(j).copied().unwrap_or(""));
            let mut depth = 0i32;
            let mut k = j;
            while k < lines.len() {
                depth += lines[k].matches('{').count() as i32;
                depth -= lines[k].matches('}').count() as i32;
                if depth <= 0 {
                    break;
                }
                k += 1;
            }
            let length = k + 1 - i;
            if signature.contains("HttpRequest") && length > MAX_HANDLER_LINES {
                long.push(format!("{}:{} ({length} lines)", file.display(), i + 1));
            }
            i = k + 1;
        }
    }
    assert!(
        long.is_empty(),
        "HTTP handlers over {MAX_HANDLER_LINES} lines (move the work below HTTP):\n{}",
        long.join("\n")
    );
}

/// The clock is one place: wall-clock milliseconds and RFC 3339 text are
/// made in `src/clock.rs` only (#39 item 6).
#[test]
fn the_clock_s_conversions_live_in_clock_rs_only() {
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        if file == Path::new("src/clock.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in without_tests(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("format_rfc3339") || code.contains("fn now_ms") {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "clock conversions elsewhere:\n{}",
        found.join("\n")
    );
}

/// The server's flags come in groups, one per concern (`#[command(flatten)]`
/// fields of `Settings`): no flag is declared on `Settings` itself.
#[test]
fn the_flags_are_grouped_by_concern() {
    let text = std::fs::read_to_string("src/config.rs").unwrap();
    let start = text.find("pub struct Settings {").expect("Settings");
    let body = &text[start..start + text[start..].find("\n}").unwrap()];
    let fields: Vec<&str> = body.lines().filter(|l| l.starts_with("    pub ")).collect();
    let flattened = body.matches("#[command(flatten)]").count();
    assert!(fields.len() >= 5, "groups: {fields:?}");
    assert_eq!(flattened, fields.len(), "a flag on Settings itself: {body}");
    assert!(!body.contains("#[arg"), "a flag on Settings itself: {body}");
}

/// What each kind of pause carries is one value outside `protocol/`: no
/// struct or enum variant declares one kind's payload fields beside the
/// other's (an approval's `decisions`, `tasks`, `grant`; questions'
/// `answers`, `questions`), as optional fields side by side (#39 item 1).
/// The wire forms with a field per kind live in `protocol/` (`given.rs`,
/// `ask.rs`, `request.rs`).
#[test]
fn no_per_kind_payload_fields_side_by_side_outside_protocol() {
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        if file.starts_with("src/protocol") {
            continue;
        }
        let text = without_tests(&std::fs::read_to_string(&file).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        for (at, names) in declared_fields(&lines) {
            let approval = names
                .iter()
                .any(|n| ["decisions", "tasks", "grant"].contains(n));
            let question = names.iter().any(|n| ["answers", "questions"].contains(n));
            if approval && question {
                found.push(format!("{}:{}: {names:?}", file.display(), at + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "per-kind fields side by side:\n{}",
        found.join("\n")
    );
}

/// The field names of each struct and each enum variant declared in
/// `lines` (rustfmt's layout: a field four spaces in from its `{`), with
/// the line that opens it.
fn declared_fields<'a>(lines: &[&'a str]) -> Vec<(usize, Vec<&'a str>)> {
    let field = regex::Regex::new(r"^\s*(?:pub(?:\([a-z]+\))? )?([a-z_][a-z0-9_]*): ").unwrap();
    let declares = regex::Regex::new(r"^\s*(?:pub(?:\([a-z]+\))? )?(struct|enum) ").unwrap();
    let variant = regex::Regex::new(r"^\s+[A-Z]\w* \{$").unwrap();
    let indent = |line: &str| line.len() - line.trim_start().len();
    let block = |from: usize| -> Vec<&'a str> {
        let depth = indent(lines[from]);
        let mut names = Vec::new();
        for inner in &lines[from + 1..] {
            if inner.trim_start().starts_with('}') && indent(inner) == depth {
                break;
            }
            if indent(inner) == depth + 4 {
                names.extend(
                    field
                        .captures(inner)
                        .and_then(|c| c.get(1))
                        .map(|m| m.as_str()),
                );
            }
        }
        names
    };
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(kind) = declares.captures(line) else {
            continue;
        };
        if !line.trim_end().ends_with('{') {
            continue;
        }
        if &kind[1] == "struct" {
            out.push((n, block(n)));
            continue;
        }
        let depth = indent(line);
        for (m, inner) in lines.iter().enumerate().skip(n + 1) {
            if inner.trim_start().starts_with('}') && indent(inner) == depth {
                break;
            }
            if indent(inner) == depth + 4 && variant.is_match(inner) {
                out.push((m, block(m)));
            }
        }
    }
    out
}

/// A log line about a run names it one way: `run_log!` with a `RunTag`
/// (its session, run, key and pause as `log` key-values, #39 item 5), never
/// by hand in the message. The access log writes its own request line
/// (the session a request named), and a stored run whose API key is gone
/// has no key to tag it with.
#[test]
fn log_lines_about_a_run_name_it_by_its_tag() {
    let allowed = [
        Path::new("src/session.rs"),
        Path::new("src/http/access_log.rs"),
        Path::new("src/run/restore.rs"),
    ];
    let mut found = Vec::new();
    for file in rust_files(Path::new("src")) {
        if allowed.contains(&file.as_path()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in without_tests(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let by_hand = code.contains("\"session=") || code.contains(" run={");
            let stringified = code.contains("tag().to_string()") || code.contains("{tag}");
            if by_hand || stringified {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a run named by hand in a log line (use session::run_log!):\n{}",
        found.join("\n")
    );
}

/// The renderers (the link page, mail, Slack's message, the inbox) read a
/// pause's typed data (`PauseData`, `ConfirmationData`, `QuestionData`),
/// never its JSON by key (#39 item 3): a field renamed or a kind added is
/// then named by the compiler. Slack's own message, which a press sends
/// back, is Slack's JSON and is read as such (`notify/slack.rs`'s
/// `with_progress`).
#[test]
fn the_renderers_read_the_typed_pause_data() {
    let renderers = [
        "src/notify/mod.rs",
        "src/notify/mail.rs",
        "src/notify/slack.rs",
        "src/http/links.rs",
        "src/http/links/page.rs",
        "src/http/inbox.rs",
    ];
    let by_key = regex_lite(r#"(confirmation_data|data|task|q|plan)(\.get\("|\[")"#);
    let mut found = Vec::new();
    for file in renderers {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in without_tests(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if by_key(code) {
                found.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a pause's JSON read by key:\n{}",
        found.join("\n")
    );
}
