//! The documentation stays true to the code (issue 19). These checks, each listing every problem
//! it finds with its file and line:
//!
//! - **Links.** Every relative link and every `#anchor` in the repository's Markdown (README.md,
//!   docs/, SECURITY.md, manifests/README.md and the rest) resolves: the file or directory
//!   exists, and the anchor is the GitHub slug of a heading in the target file.
//! - **Flags.** Every option `quorumguard <command> --help` lists (the built binary is run) has a
//!   row in that command's flag table in docs/, with the same default and the same environment
//!   variable as `--help` shows; every flag a table names exists, and so does every flag of a
//!   `quorumguard <command> ...` command line anywhere in the docs (code blocks and code spans).
//! - **Codes.** Every admission reason (`Reason::ALL`), webhook reason of its own
//!   (`ReviewReason::OWN`), next action (`ActionCode::ALL`), EtcdQuorum reason
//!   (`QuorumReason::ALL`) and rollout prediction reason (`ReadyReason::ALL`) is in a code table
//!   of README.md or docs/ (a column headed `Reason`, `Webhook reason`, `Next action`,
//!   `EtcdQuorum reason`, `Rollout reason` or `Preflight reason`), and every code such a column
//!   names exists.
//! - **CamelCase.** Every backticked CamelCase word in README.md and docs/ is a code, an alert of
//!   the PrometheusRule, or one of a few names listed here: a renamed code cannot linger in prose.
//! - **Flags named alone** (`` `--steps` ``) are some command's, or another tool's listed here.
//! - **Names** (`quorumguard.io/...`, `QUORUMGUARD_...`, `quorumguard_...` metrics) the docs give
//!   are in the code, the manifests or the scripts.
//! - **Waiting**: what the docs say a review waits for matches `serve --fresh-probe-timeout`.
//!
//! The format the checks read (docs/development.md, "The docs test", says it for writers):
//! a flag table's first header cell is `` `quorumguard <command>` flag ``; one row per option,
//! its first cell the option's names in backticks (`` `-n`, `--namespace` ``, a value name after
//! the flag is allowed: `` `--objects FILE` ``); its `Default` cell is the default in backticks
//! exactly as `--help` prints it (several values: one code span each) or has no code span when
//! `--help` shows none; its `Environment` cell likewise.
//!
//! Why a small parser of our own and not a Markdown crate: the checks need ATX headings, fenced
//! code blocks, code spans, inline links and pipe tables, in files this repository writes; that
//! is a few hundred lines of plain string handling, tested below (`parser_*`), and no new
//! dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use quorumguard::admission::ReviewReason;
use quorumguard::engine::rollout::ReadyReason;
use quorumguard::engine::{ActionCode, Reason};
use quorumguard::status::conditions::QuorumReason;

const BIN: &str = env!("CARGO_BIN_EXE_quorumguard");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A small Markdown reader: just what the checks need, in the subset GitHub renders that this
/// repository uses.
mod md {
    /// One line of a file: its number (1-based), its text, and whether it is inside a fenced
    /// code block (fence lines included).
    pub struct Line<'a> {
        pub no: usize,
        pub text: &'a str,
        pub code: bool,
    }

    /// The lines of `text`, fenced code blocks marked. A fence is three or more backticks or
    /// tildes, at any indentation (fences inside list items are indented); it closes at a line
    /// of at least as many of the same character and nothing else.
    pub fn lines(text: &str) -> Vec<Line<'_>> {
        let mut fence: Option<(char, usize)> = None;
        let mut out = Vec::new();
        for (i, text) in text.lines().enumerate() {
            let t = text.trim_start();
            let run = |c: char| t.chars().take_while(|&x| x == c).count();
            let code = match fence {
                Some((c, n)) => {
                    if run(c) >= n && t.trim_end().chars().all(|x| x == c) {
                        fence = None;
                    }
                    true
                }
                None => {
                    for c in ['`', '~'] {
                        if run(c) >= 3 {
                            fence = Some((c, run(c)));
                        }
                    }
                    fence.is_some()
                }
            };
            out.push(Line {
                no: i + 1,
                text,
                code,
            });
        }
        out
    }

    /// Text and code spans of a line. A code span opens with a run of backticks and closes at
    /// the next run of the same length; an unclosed run is literal text.
    #[derive(Debug, PartialEq)]
    pub enum Seg {
        Text(String),
        Code(String),
    }

    pub fn segments(s: &str) -> Vec<Seg> {
        let b: Vec<char> = s.chars().collect();
        let mut out = Vec::new();
        let mut text = String::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] != '`' {
                text.push(b[i]);
                i += 1;
                continue;
            }
            let n = b[i..].iter().take_while(|&&c| c == '`').count();
            // Find the closing run of exactly n backticks.
            let mut j = i + n;
            let mut close = None;
            while j < b.len() {
                if b[j] == '`' {
                    let m = b[j..].iter().take_while(|&&c| c == '`').count();
                    if m == n {
                        close = Some(j);
                        break;
                    }
                    j += m;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(j) => {
                    if !text.is_empty() {
                        out.push(Seg::Text(std::mem::take(&mut text)));
                    }
                    let code: String = b[i + n..j].iter().collect();
                    out.push(Seg::Code(code.trim().to_string()));
                    i = j + n;
                }
                None => {
                    text.extend(&b[i..i + n]);
                    i += n;
                }
            }
        }
        if !text.is_empty() {
            out.push(Seg::Text(text));
        }
        out
    }

    /// The code spans of a line.
    pub fn code_spans(s: &str) -> Vec<String> {
        segments(s)
            .into_iter()
            .filter_map(|s| match s {
                Seg::Code(c) => Some(c),
                Seg::Text(_) => None,
            })
            .collect()
    }

    /// A line with its code spans left out (what links and prose are read from).
    pub fn without_code(s: &str) -> String {
        segments(s)
            .into_iter()
            .map(|s| match s {
                Seg::Text(t) => t,
                Seg::Code(_) => " ".to_string(),
            })
            .collect()
    }

    /// ATX headings (`# ...` to `###### ...`) outside code blocks: (line, text).
    pub fn headings(text: &str) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for l in lines(text) {
            let t = l.text.trim_start();
            if l.code || l.text.len() - t.len() > 3 {
                continue;
            }
            let hashes = t.chars().take_while(|&c| c == '#').count();
            let rest = &t[hashes..];
            if (1..=6).contains(&hashes) && (rest.is_empty() || rest.starts_with(' ')) {
                let mut h = rest.trim();
                // An optional closing sequence of #s, after a space.
                let stripped = h.trim_end_matches('#');
                if stripped.is_empty() || stripped.ends_with(' ') {
                    h = stripped.trim_end();
                }
                out.push((l.no, h.to_string()));
            }
        }
        out
    }

    /// GitHub's anchor for a heading: the rendered text (links as their text, code spans as
    /// their content), lowercased; letters, digits, `-` and `_` kept, spaces turned into `-`,
    /// everything else dropped (no collapsing: "a & b" is `a--b`).
    pub fn slug(heading: &str) -> String {
        let mut text = String::new();
        for seg in segments(heading) {
            match seg {
                Seg::Code(c) => text.push_str(&c),
                Seg::Text(t) => text.push_str(&link_texts(&t)),
            }
        }
        text.trim()
            .chars()
            .flat_map(char::to_lowercase)
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c),
                _ => None,
            })
            .collect()
    }

    /// `[text](target)` replaced by `text`.
    fn link_texts(s: &str) -> String {
        let mut out = s.to_string();
        while let Some(mid) = out.find("](") {
            let Some(open) = out[..mid].rfind('[') else {
                break;
            };
            let Some(close) = out[mid..].find(')') else {
                break;
            };
            let text = out[open + 1..mid].to_string();
            out.replace_range(open..mid + close + 1, &text);
        }
        out
    }

    /// Every anchor a file's headings make, duplicates numbered as GitHub does (`x`, `x-1`, ...).
    pub fn anchors(text: &str) -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        for (_, h) in headings(text) {
            let base = slug(&h);
            let mut s = base.clone();
            let mut n = 0;
            while seen.contains(&s) {
                n += 1;
                s = format!("{base}-{n}");
            }
            seen.insert(s);
        }
        seen
    }

    /// The target of a reference definition line, `[label]: target`.
    pub fn reference_definition(line: &str) -> Option<String> {
        let t = without_code(line);
        let t = t.trim_start();
        let end = t.find("]:")?;
        if !t.starts_with('[') || t[..end].contains("](") {
            return None;
        }
        let target = t[end + 2..].split_whitespace().next()?;
        Some(target.trim_matches(['<', '>']).to_string())
    }

    /// Targets of the inline links and images `[..](target "title")` of a text (a paragraph),
    /// outside its code spans.
    pub fn links(text: &str) -> Vec<String> {
        let t = without_code(text);
        let mut out = Vec::new();
        let mut rest = t.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let target = if let Some(inner) = after.strip_prefix('<') {
                inner.split('>').next().unwrap_or("")
            } else {
                // Up to the `)` that balances, or a space before a title.
                let mut depth = 0;
                let mut end = after.len();
                for (k, c) in after.char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' if depth == 0 => {
                            end = k;
                            break;
                        }
                        ')' => depth -= 1,
                        ' ' => {
                            end = k;
                            break;
                        }
                        _ => {}
                    }
                }
                &after[..end]
            };
            out.push(target.to_string());
            rest = after;
        }
        out
    }

    /// A pipe table: the header cells and each row's cells, with line numbers.
    pub struct Table {
        pub line: usize,
        pub header: Vec<String>,
        pub rows: Vec<(usize, Vec<String>)>,
    }

    /// The cells of a table line: split at unescaped `|` (GitHub splits before reading code
    /// spans, so a `|` inside one is written `\|`), `\|` read as `|`, each cell trimmed.
    pub fn cells(line: &str) -> Vec<String> {
        let t = line.trim();
        let t = t.strip_prefix('|').unwrap_or(t);
        let t = if t.ends_with('|') && !t.ends_with("\\|") {
            &t[..t.len() - 1]
        } else {
            t
        };
        let mut out = vec![String::new()];
        let mut chars = t.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    out.last_mut().unwrap().push('|');
                    chars.next();
                }
                '|' => out.push(String::new()),
                c => out.last_mut().unwrap().push(c),
            }
        }
        out.into_iter().map(|c| c.trim().to_string()).collect()
    }

    fn is_delimiter(line: &str) -> bool {
        let cs = cells(line);
        !cs.is_empty()
            && cs.iter().all(|c| {
                let c = c.trim_matches(':');
                !c.is_empty() && c.chars().all(|x| x == '-')
            })
    }

    /// The tables of a file: runs of lines outside code that start with `|`, whose second line
    /// is the delimiter row.
    pub fn tables(text: &str) -> Vec<Table> {
        let ls = lines(text);
        let mut out = Vec::new();
        let mut i = 0;
        while i < ls.len() {
            let is_row = |l: &Line| !l.code && l.text.trim_start().starts_with('|');
            if is_row(&ls[i])
                && i + 1 < ls.len()
                && is_row(&ls[i + 1])
                && is_delimiter(ls[i + 1].text)
            {
                let mut t = Table {
                    line: ls[i].no,
                    header: cells(ls[i].text),
                    rows: Vec::new(),
                };
                let mut j = i + 2;
                while j < ls.len() && is_row(&ls[j]) {
                    t.rows.push((ls[j].no, cells(ls[j].text)));
                    j += 1;
                }
                out.push(t);
                i = j;
                continue;
            }
            i += 1;
        }
        out
    }

    /// The units command lines are read from: (first line, text, inside a code block). Each
    /// code block line (a line ending in `\` joined with the next), and each paragraph or table
    /// row outside code (a paragraph's lines joined, so a code span may wrap).
    pub fn units(text: &str) -> Vec<(usize, String, bool)> {
        let mut out: Vec<(usize, String, bool)> = Vec::new();
        let mut open: Option<(usize, String, bool)> = None;
        let mut continued = false;
        for l in lines(text) {
            let t = l.text.trim();
            if l.code {
                out.extend(open.take());
                let is_fence = t.starts_with("```") || t.starts_with("~~~");
                if continued && let Some(last) = out.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(t.trim_end_matches('\\'));
                } else if !is_fence {
                    out.push((l.no, t.trim_end_matches('\\').to_string(), true));
                }
                continued = !is_fence && t.ends_with('\\');
                continue;
            }
            continued = false;
            if t.is_empty() || t.starts_with('|') || t.starts_with('#') {
                out.extend(open.take());
                if !t.is_empty() {
                    out.push((l.no, t.to_string(), false));
                }
                continue;
            }
            match &mut open {
                Some((_, p, _)) => {
                    p.push(' ');
                    p.push_str(t);
                }
                None => open = Some((l.no, t.to_string(), false)),
            }
        }
        out.extend(open);
        out
    }
}

/// One option of `quorumguard <command> --help`.
#[derive(Debug, PartialEq)]
struct Opt {
    short: Option<String>,
    long: String,
    /// `[default: ...]`, whitespace collapsed (several values are separated by spaces).
    default: Option<String>,
    /// `[env: NAME=...]`: the NAME.
    env: Option<String>,
}

/// The options of a `--help` text (short or long form, wrapped at any width): an option starts
/// at a line of the `Options:` section indented at most 6 columns that starts with `-`; the
/// lines after it, indented deeper, are its description.
fn help_options(help: &str) -> Vec<Opt> {
    let mut blocks: Vec<String> = Vec::new();
    let mut in_options = false;
    for line in help.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            in_options = line.trim_end() == "Options:";
            continue;
        }
        if !in_options {
            continue;
        }
        let t = line.trim_start();
        if line.len() - t.len() <= 6 && t.starts_with('-') {
            blocks.push(t.to_string());
        } else if let Some(b) = blocks.last_mut() {
            b.push(' ');
            b.push_str(t);
        }
    }
    blocks
        .iter()
        .map(|b| {
            let text = b.split_whitespace().collect::<Vec<_>>().join(" ");
            let (mut short, mut long) = (None, String::new());
            for tok in text.split(' ') {
                let tok = tok.trim_end_matches(',');
                if let Some(name) = tok.strip_prefix("--") {
                    long = format!("--{name}");
                    break;
                } else if tok.starts_with('-') && tok.len() == 2 {
                    short = Some(tok.to_string());
                } else {
                    break;
                }
            }
            let bracket = |key: &str| {
                let start = text.find(key)? + key.len();
                let end = start + text[start..].find(']')?;
                Some(text[start..end].trim().to_string())
            };
            Opt {
                short,
                long,
                default: bracket("[default: "),
                env: bracket("[env: ").map(|e| e.split('=').next().unwrap_or("").to_string()),
            }
        })
        .collect()
}

/// The subcommands `quorumguard --help` lists (but `help`).
fn help_commands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        // A command's line is indented 2 columns; its wrapped description deeper.
        let t = line.trim_start();
        if in_commands
            && line.len() - t.len() <= 4
            && let Some(name) = t.split_whitespace().next()
            && name != "help"
        {
            out.push(name.to_string());
        }
    }
    out
}

/// `quorumguard [command] --help`, with an empty environment so that no variable set around
/// the test shows up as a value in `[env: ...]`.
fn help(command: Option<&str>) -> String {
    let mut c = Command::new(BIN);
    c.env_clear();
    if let Some(command) = command {
        c.arg(command);
    }
    let out = c.arg("--help").output().expect("run quorumguard --help");
    assert!(out.status.success(), "{command:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// Every command's options, from the binary.
fn commands() -> BTreeMap<String, Vec<Opt>> {
    let commands = help_commands(&help(None));
    assert!(commands.len() >= 5, "quorumguard --help lists {commands:?}");
    commands
        .into_iter()
        .map(|c| {
            let opts = help_options(&help(Some(&c)));
            (c, opts)
        })
        .collect()
}

/// Options every command has, not documented per command.
const GENERIC_FLAGS: [&str; 4] = ["-h", "--help", "-V", "--version"];

/// Markdown files of the repository (build output and hidden directories left out), relative
/// to the root.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if p.is_dir() {
                walk(&p, root, out);
            } else if name.ends_with(".md") {
                out.push(p.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &root(), &mut out);
    out
}

/// README.md and docs/*.md: the documentation proper.
fn docs_files() -> Vec<PathBuf> {
    markdown_files()
        .into_iter()
        .filter(|p| p == Path::new("README.md") || p.starts_with("docs"))
        .collect()
}

fn read(rel: &Path) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()))
}

fn report(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn links_and_anchors_resolve() {
    let files = markdown_files();
    for must in [
        "README.md",
        "SECURITY.md",
        "manifests/README.md",
        "docs/runbook.md",
    ] {
        assert!(files.contains(&PathBuf::from(must)), "{must} is checked");
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for rel in &files {
        let text = read(rel);
        let dir = rel.parent().unwrap_or(Path::new(""));
        // Paragraph by paragraph: a code span may wrap, and what is inside one is no link.
        let definitions = md::lines(&text)
            .into_iter()
            .filter(|l| !l.code)
            .filter_map(|l| Some((l.no, md::reference_definition(l.text)?)));
        let inline = md::units(&text)
            .into_iter()
            .filter(|u| !u.2)
            .flat_map(|(no, unit, _)| md::links(&unit).into_iter().map(move |t| (no, t)));
        for (no, target) in definitions.chain(inline) {
            if target.is_empty()
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with("//")
            {
                continue;
            }
            checked += 1;
            let at = format!("{}:{no}: {target}", rel.display());
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                rel.to_path_buf()
            } else {
                normalize(&dir.join(path))
            };
            if !root().join(&file).exists() {
                problems.push(format!("{at}: {} does not exist", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if file.extension().and_then(|e| e.to_str()) != Some("md") {
                    problems.push(format!("{at}: an anchor into a file that is not Markdown"));
                } else if !md::anchors(&read(&file)).contains(anchor) {
                    problems.push(format!(
                        "{at}: {} has no heading with the anchor #{anchor}",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found");
    report("links", &problems);
}

/// The top-level directories whose paths the docs name in code spans.
const REPO_DIRS: [&str; 10] = [
    "src/",
    "crates/",
    "tests/",
    "benches/",
    "scripts/",
    "manifests/",
    "fuzz/",
    "examples/",
    "docs/",
    "certs/",
];

/// A repository path as the docs name it in a code span exists: a file, a directory, a glob's
/// prefix (`crates/playground/src/apiserver*`), or the directory before a placeholder
/// (`tests/fixtures/etcd/<scenario>/`). Code moves; the docs must move with it.
#[test]
fn paths_the_docs_name_exist() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for rel in markdown_files() {
        let text = read(&rel);
        for (no, unit, _) in md::units(&text) {
            for span in md::code_spans(&unit) {
                let span = span.trim();
                if !REPO_DIRS.iter().any(|d| span.starts_with(d))
                    || span.contains(char::is_whitespace)
                {
                    continue;
                }
                checked += 1;
                let (path, partial) = match span.find(['<', '*']) {
                    Some(at) => (&span[..at], true),
                    None => (span, false),
                };
                let exists = if partial {
                    let (dir, prefix) = match path.rsplit_once('/') {
                        Some((d, p)) => (d, p),
                        None => ("", path),
                    };
                    fs::read_dir(root().join(dir)).is_ok_and(|mut entries| {
                        entries.any(|e| {
                            e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix))
                        })
                    })
                } else {
                    root().join(path).exists()
                };
                if !exists {
                    problems.push(format!("{}:{no}: `{span}` does not exist", rel.display()));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} repository paths found in code spans"
    );
    report("paths", &problems);
}

/// `a/b/../c` as `a/c` (a link may climb out of its directory; it must stay in the repository).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// A flag table row of the docs.
struct Row {
    at: String,
    flags: Vec<String>,
    default: Vec<String>,
    env: Option<Vec<String>>,
}

/// The flag tables in docs/, by command: a table whose first header cell is
/// `` `quorumguard <command>` flag ``.
fn flag_tables(problems: &mut Vec<String>) -> BTreeMap<String, Vec<Row>> {
    let mut out: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for rel in docs_files() {
        let text = read(&rel);
        for t in md::tables(&text) {
            let Some(first) = t.header.first() else {
                continue;
            };
            let Some(command) = md::code_spans(first)
                .iter()
                .find_map(|c| c.strip_prefix("quorumguard ").map(str::to_string))
                .filter(|_| first.contains("flag"))
            else {
                continue;
            };
            let at = format!("{}:{}", rel.display(), t.line);
            if out.contains_key(&command) {
                problems.push(format!("{at}: a second flag table for {command}"));
            }
            let column = |name: &str| t.header.iter().position(|h| h == name);
            let Some(default) = column("Default") else {
                problems.push(format!("{at}: flag table without a Default column"));
                continue;
            };
            let env = column("Environment");
            let rows = out.entry(command).or_default();
            for (no, cells) in &t.rows {
                let cell = |i: usize| cells.get(i).map(String::as_str).unwrap_or("");
                let flags: Vec<String> = md::code_spans(cell(0))
                    .iter()
                    .filter_map(|c| c.split_whitespace().next())
                    .filter(|f| f.starts_with('-'))
                    .map(str::to_string)
                    .collect();
                rows.push(Row {
                    at: format!("{}:{no}", rel.display()),
                    flags,
                    default: md::code_spans(cell(default)),
                    env: env.map(|e| md::code_spans(cell(e))),
                });
            }
        }
    }
    out
}

#[test]
fn every_flag_is_documented_with_its_default_and_every_documented_flag_exists() {
    let commands = commands();
    let mut problems = Vec::new();
    let tables = flag_tables(&mut problems);
    for (command, opts) in &commands {
        let Some(rows) = tables.get(command) else {
            problems.push(format!(
                "quorumguard {command}: no flag table in docs/ (first header cell `quorumguard {command}` flag)"
            ));
            continue;
        };
        for opt in opts
            .iter()
            .filter(|o| !GENERIC_FLAGS.contains(&o.long.as_str()))
        {
            let name = format!("quorumguard {command} {}", opt.long);
            let matching: Vec<&Row> = rows
                .iter()
                .filter(|r| r.flags.contains(&opt.long))
                .collect();
            let [row] = matching[..] else {
                problems.push(format!(
                    "{name}: {} rows document it, not one",
                    matching.len()
                ));
                continue;
            };
            let mut names: Vec<String> = opt.short.iter().cloned().collect();
            names.push(opt.long.clone());
            let mut documented = row.flags.clone();
            documented.sort();
            names.sort();
            if documented != names {
                problems.push(format!(
                    "{}: {name}: the row names {documented:?}, --help {names:?}",
                    row.at
                ));
            }
            let want: Vec<String> = opt
                .default
                .as_deref()
                .map(|d| d.split(' ').map(str::to_string).collect())
                .unwrap_or_default();
            if row.default != want {
                problems.push(format!(
                    "{}: {name}: the docs say default {:?}, --help says {:?}",
                    row.at, row.default, opt.default
                ));
            }
            let want_env: Vec<String> = opt.env.iter().cloned().collect();
            match &row.env {
                Some(env) if *env != want_env => problems.push(format!(
                    "{}: {name}: the docs say environment {env:?}, --help says {want_env:?}",
                    row.at
                )),
                None if !want_env.is_empty() => problems.push(format!(
                    "{}: {name}: --help shows the environment variable {want_env:?}; the table has no Environment column",
                    row.at
                )),
                _ => {}
            }
        }
    }
    for (command, rows) in &tables {
        let Some(opts) = commands.get(command) else {
            problems.push(format!(
                "{}: a flag table for `quorumguard {command}`, which does not exist",
                rows.first().map(|r| r.at.as_str()).unwrap_or("?")
            ));
            continue;
        };
        for row in rows {
            if row.flags.is_empty() {
                problems.push(format!(
                    "{}: a row of the {command} flag table names no flag",
                    row.at
                ));
            }
            for f in &row.flags {
                let known = opts
                    .iter()
                    .any(|o| o.long == *f || o.short.as_ref() == Some(f));
                if !known {
                    problems.push(format!("{}: quorumguard {command} has no flag {f}", row.at));
                }
            }
        }
    }
    report("flags", &problems);
}

/// (command, flag) of every `quorumguard <command> ...` command line in a unit of text: after
/// `quorumguard`, `.../quorumguard` or `cargo run --`, a known command, then its arguments up
/// to the end of the shell command. `scripts/try.sh` runs `quorumguard playground`.
fn command_line_flags(
    unit: &str,
    code: bool,
    commands: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let texts: Vec<String> = if code {
        vec![unit.to_string()]
    } else {
        md::code_spans(unit)
    };
    for text in texts {
        let toks: Vec<&str> = text.split_whitespace().collect();
        for i in 0..toks.len() {
            let t = toks[i];
            let command = if t == "scripts/try.sh" {
                Some(("playground".to_string(), i + 1))
            } else if (t == "quorumguard" || t.ends_with("/quorumguard"))
                && toks.get(i + 1).is_some_and(|c| commands.contains(*c))
            {
                Some((toks[i + 1].to_string(), i + 2))
            } else if toks[i..].starts_with(&["cargo", "run", "--"])
                && toks.get(i + 3).is_some_and(|c| commands.contains(*c))
            {
                Some((toks[i + 3].to_string(), i + 4))
            } else {
                None
            };
            let Some((command, start)) = command else {
                continue;
            };
            for tok in &toks[start..] {
                if ["&&", ";", "&", "<"].contains(tok)
                    || tok.starts_with(['#', ')', '|', '>'])
                    || tok.starts_with("2>")
                {
                    break;
                }
                let tok = tok
                    .trim_start_matches('[')
                    .trim_end_matches([']', ',', ')', '.']);
                let flag = tok.split('=').next().unwrap_or("");
                let long = flag.len() > 2 && flag.starts_with("--");
                let short = flag.len() == 2
                    && flag.starts_with('-')
                    && flag[1..].chars().all(|c| c.is_ascii_alphabetic());
                if long || short {
                    out.push((command.clone(), flag.to_string()));
                }
            }
        }
    }
    out
}

#[test]
fn command_lines_in_the_docs_use_flags_that_exist() {
    let commands = commands();
    let names: BTreeSet<String> = commands.keys().cloned().collect();
    let mut problems = Vec::new();
    let mut seen = 0;
    for rel in markdown_files() {
        let text = read(&rel);
        for (no, unit, code) in md::units(&text) {
            for (command, flag) in command_line_flags(&unit, code, &names) {
                seen += 1;
                let opts = &commands[&command];
                let known = GENERIC_FLAGS.contains(&flag.as_str())
                    || opts
                        .iter()
                        .any(|o| o.long == flag || o.short.as_deref() == Some(flag.as_str()));
                if !known {
                    problems.push(format!(
                        "{}:{no}: quorumguard {command} has no flag {flag}",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} flags on command lines found");
    report("command lines", &problems);
}

/// The kinds of codes, by the header of the table column that lists them.
const CODE_COLUMNS: [&str; 6] = [
    "Reason",
    "Webhook reason",
    "Next action",
    "EtcdQuorum reason",
    "Rollout reason",
    "Preflight reason",
];

fn codes_of(column: &str) -> BTreeSet<String> {
    match column {
        "Reason" => Reason::ALL.iter().map(|r| r.as_str().to_string()).collect(),
        "Webhook reason" => ReviewReason::OWN
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        "Next action" => ActionCode::ALL
            .iter()
            .map(|a| a.as_str().to_string())
            .collect(),
        "EtcdQuorum reason" => QuorumReason::ALL
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        "Rollout reason" | "Preflight reason" => ReadyReason::ALL
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        _ => unreachable!(),
    }
}

#[test]
fn every_code_is_documented_and_every_documented_code_exists() {
    let mut problems = Vec::new();
    let mut documented: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for rel in docs_files() {
        let text = read(&rel);
        for t in md::tables(&text) {
            for column in CODE_COLUMNS {
                let Some(i) = t.header.iter().position(|h| h == column) else {
                    continue;
                };
                let codes = codes_of(column);
                for (no, cells) in &t.rows {
                    for code in md::code_spans(cells.get(i).map(String::as_str).unwrap_or("")) {
                        if !codes.contains(&code) {
                            problems.push(format!(
                                "{}:{no}: `{code}` in a {column:?} column is not one of {codes:?}",
                                rel.display()
                            ));
                        }
                        documented.entry(column).or_default().insert(code);
                    }
                }
            }
        }
    }
    for column in CODE_COLUMNS {
        let have = documented.get(column).cloned().unwrap_or_default();
        let missing: Vec<_> = codes_of(column).difference(&have).cloned().collect();
        if !missing.is_empty() {
            problems.push(format!(
                "codes in no {column:?} column of README.md or docs/: {missing:?}"
            ));
        }
    }
    report("codes", &problems);
}

/// Backticked CamelCase words the docs may use that are not codes: kinds, types and values
/// named in passing.
const NOT_CODES: [&str; 10] = [
    // kube's type the review decoder builds (docs/benchmarks.md).
    "AdmissionRequest",
    // The engine's types: its input (docs/rules.md) and the codes' own enums
    // (docs/development.md).
    "ControlPlane",
    "ActionCode",
    "QuorumReason",
    // A `quorumguard status -o json` probe result (docs/status.md).
    "NotProbed",
    // `quorumguard preflight -o json` readiness values (docs/preflight.md).
    "WouldStick",
    "CannotJudge",
    // `check -o json` `machines[].remediation.held` values (docs/check.md; `Paused` is short).
    "NoMachineHealthCheck",
    "ShortCircuit",
    "ControlPlanePaused",
];

/// Alert names of the PrometheusRule (`- alert: Name`).
fn alerts() -> BTreeSet<String> {
    read(Path::new("manifests/monitoring/prometheusrule.yaml"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|a| a.trim().to_string())
        .collect()
}

fn camel_case(s: &str) -> bool {
    s.len() > 3
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
        && s.chars().any(|c| c.is_ascii_lowercase())
        && s.chars().skip(1).any(|c| c.is_ascii_uppercase())
}

#[test]
fn camel_case_words_in_the_docs_are_codes_that_exist() {
    let mut known: BTreeSet<String> = CODE_COLUMNS.iter().flat_map(|c| codes_of(c)).collect();
    let alerts = alerts();
    assert!(alerts.len() >= 11, "{alerts:?}");
    known.extend(alerts);
    known.extend(NOT_CODES.map(String::from));
    let mut problems = Vec::new();
    for rel in docs_files() {
        let text = read(&rel);
        for (no, unit, _) in md::units(&text).into_iter().filter(|u| !u.2) {
            for code in md::code_spans(&unit) {
                if camel_case(&code) && !known.contains(&code) {
                    problems.push(format!(
                        "{}:{no}: `{code}` is no reason, webhook reason, next action, EtcdQuorum reason or alert",
                        rel.display()
                    ));
                }
            }
        }
    }
    report("CamelCase words", &problems);
}

// The parser, on the cases the docs use.

#[test]
fn parser_slugs_are_githubs() {
    for (heading, slug) in [
        ("The rules", "the-rules"),
        (
            "Believing a probe: a change for the worse is confirmed",
            "believing-a-probe-a-change-for-the-worse-is-confirmed",
        ),
        (
            "The playground: `quorumguard playground`",
            "the-playground-quorumguard-playground",
        ),
        (
            "`quorumguard status`: the live view (and `kubectl quorumguard`)",
            "quorumguard-status-the-live-view-and-kubectl-quorumguard",
        ),
        ("Changing KCP replicas R → R'", "changing-kcp-replicas-r--r"),
        ("Limits & Retries", "limits--retries"),
        ("QuorumGuardEtcdQuorumLost", "quorumguardetcdquorumlost"),
        ("See [the rules](rules.md) first", "see-the-rules-first"),
        ("max_health_age, 1.5x", "max_health_age-15x"),
    ] {
        assert_eq!(md::slug(heading), slug, "{heading}");
    }
    let anchors =
        md::anchors("# A\n## Tests\n```sh\n# not a heading\n```\n## Tests\n### Tests ###\n");
    let want: BTreeSet<String> = ["a", "tests", "tests-1", "tests-2"]
        .map(String::from)
        .into();
    assert_eq!(anchors, want);
}

#[test]
fn parser_reads_links_outside_code() {
    assert_eq!(
        md::links("see [the rules](docs/rules.md#the-rules) and [`x`](../x.md \"title\")."),
        ["docs/rules.md#the-rules", "../x.md"]
    );
    assert_eq!(md::links("`[not](a-link.md)` and ![img](i.png)"), ["i.png"]);
    assert_eq!(
        md::reference_definition("[ref]: <docs/ops.md#x> \"t\""),
        Some("docs/ops.md#x".into())
    );
    assert_eq!(md::reference_definition("[a](b.md): c"), None);
    assert_eq!(md::reference_definition("`[a]: b`"), None);
    assert_eq!(
        md::links("[a](<with space.md>) [b](f(x).md)"),
        ["with space.md", "f(x).md"]
    );
    assert!(md::links("no [link] (here)").is_empty());
    let text = "a [x](y.md)\n```md\n[in](code.md)\n```\n";
    let found: Vec<String> = md::lines(text)
        .iter()
        .filter(|l| !l.code)
        .flat_map(|l| md::links(l.text))
        .collect();
    assert_eq!(found, ["y.md"]);
}

#[test]
fn parser_reads_code_spans_and_tables() {
    assert_eq!(md::code_spans("`a` b ``c ` d`` `e"), ["a", "c ` d"]);
    let text = "\
| `quorumguard check` flag | Default | Environment | Meaning |
|---|:--|---|---|
| `-o`, `--output text\\|json` | `text` | `QUORUMGUARD_OUTPUT` | a \\| b |
| `--as-group GROUP` | | | groups |

| not | a table |
";
    let tables = md::tables(text);
    assert_eq!(tables.len(), 1);
    let t = &tables[0];
    assert_eq!(t.line, 1);
    assert_eq!(t.header[0], "`quorumguard check` flag");
    assert_eq!(t.rows.len(), 2);
    assert_eq!(t.rows[0].0, 3);
    assert_eq!(t.rows[0].1[0], "`-o`, `--output text|json`");
    assert_eq!(t.rows[0].1[3], "a | b");
    assert_eq!(
        md::code_spans(&t.rows[0].1[0]),
        ["-o", "--output text|json"]
    );
    assert_eq!(t.rows[1].1, ["`--as-group GROUP`", "", "", "groups"]);
}

#[test]
fn parser_reads_help_as_clap_wraps_it() {
    let help = "\
Serve it

Usage: quorumguard serve [OPTIONS]

Options:
      --listen <LISTEN>
          Address

          [env: QUORUMGUARD_LISTEN=]
          [default: 0.0.0.0:8443]

      --controller <CONTROLLERS>
          Control-plane controllers

          [env: QUORUMGUARD_CONTROLLERS=]
          [default:
          system:serviceaccount:a:b]

      --teardown <TEARDOWN>
          Teardown [default: a b
          c]

          Possible values:
          - port-forward: Through the API server
  -n, --namespace <NS>          Namespace [env:
                                NS_ENV=x] [default: default]
      --no-probe
          Off
  -h, --help
          Print help

Every flag has an environment twin
  --not-an-option
";
    let opts = help_options(help);
    type Row<'a> = (Option<&'a str>, &'a str, Option<&'a str>, Option<&'a str>);
    let got: Vec<Row> = opts
        .iter()
        .map(|o| {
            (
                o.short.as_deref(),
                o.long.as_str(),
                o.default.as_deref(),
                o.env.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                None,
                "--listen",
                Some("0.0.0.0:8443"),
                Some("QUORUMGUARD_LISTEN")
            ),
            (
                None,
                "--controller",
                Some("system:serviceaccount:a:b"),
                Some("QUORUMGUARD_CONTROLLERS")
            ),
            (None, "--teardown", Some("a b c"), None),
            (Some("-n"), "--namespace", Some("default"), Some("NS_ENV")),
            (None, "--no-probe", None, None),
            (Some("-h"), "--help", None, None),
        ]
    );
    assert_eq!(
        help_commands(
            "Usage: x\n\nCommands:\n  check  Judge a control plane\n         from dumps\n  serve  Serve\n  help   Print\n\nOptions:\n  -h\n"
        ),
        ["check", "serve"]
    );
}

#[test]
fn parser_finds_flags_on_command_lines() {
    let names: BTreeSet<String> = ["check", "status", "playground", "certs"]
        .map(String::from)
        .into();
    let flags = |unit: &str| -> Vec<(String, String)> {
        command_line_flags(unit, !unit.contains('`'), &names)
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        flags("kubectl quorumguard status test -n capi-test -o json # as a plugin --nope"),
        pairs(&[("status", "-n"), ("status", "-o")])
    );
    assert_eq!(
        flags("cargo run -- check --objects x.yaml --what-if 'delete machine/m' | less --nope"),
        pairs(&[("check", "--objects"), ("check", "--what-if")])
    );
    assert_eq!(
        flags(
            "run `quorumguard playground [--scenario NAME] [--keep]`, then `scripts/try.sh --list`; `kubectl --nope`"
        ),
        pairs(&[
            ("playground", "--scenario"),
            ("playground", "--keep"),
            ("playground", "--list")
        ])
    );
    assert_eq!(
        flags(
            "quorumguard certs ... --patch-webhook=quorumguard && kubectl delete x quorumguard --nope"
        ),
        pairs(&[("certs", "--patch-webhook")])
    );
    assert!(flags("kubectl -n quorumguard-system get deploy/quorumguard --output=yaml").is_empty());
}

#[test]
fn parser_units_join_paragraphs_and_continued_lines() {
    let text = "\
A paragraph with `quorumguard check
--objects f` wrapped.

```sh
quorumguard certs --out-dir d \\
  --force
echo
```
| `a` | b |
";
    let units = md::units(text);
    assert_eq!(
        units,
        [
            (
                1,
                "A paragraph with `quorumguard check --objects f` wrapped.".to_string(),
                false
            ),
            (
                5,
                "quorumguard certs --out-dir d  --force".to_string(),
                true
            ),
            (7, "echo".to_string(), true),
            (9, "| `a` | b |".to_string(), false),
        ]
    );
}

/// The first duration ("2s", "2 s", "1.5 s", "100ms") in `s`, as written (no space), if `s`
/// starts with one after at most a few characters of punctuation or words (at most 16).
fn leading_duration(s: &str) -> Option<String> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    if start > 16 {
        return None;
    }
    let rest = &s[start..];
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, after) = rest.split_at(number_end);
    let after = after.strip_prefix(' ').unwrap_or(after);
    let unit: String = after
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    ["ms", "s", "m"]
        .contains(&unit.as_str())
        .then(|| format!("{number}{unit}"))
}

/// What the docs say about how long a review waits on etcd (issue 40) matches `serve`: every
/// place in README.md, docs/, SECURITY.md and manifests/README.md that names
/// `--fresh-probe-timeout` and a duration right after it (`` `--fresh-probe-timeout` 2 s ``,
/// "(default `2s`", a flag table's Default cell, `` `--fresh-probe-timeout 2s` ``) states
/// `serve --help`'s default; the README and docs/operations.md do state it; that default is
/// inside every webhook's `timeoutSeconds` of the manifests; and no paragraph claims again that
/// a review never waits on etcd or that the webhook reads caches only.
#[test]
fn what_the_docs_say_a_review_waits_for_matches_serve() {
    const FLAG: &str = "--fresh-probe-timeout";
    let serve = commands().remove("serve").expect("a serve command");
    let opt = serve
        .iter()
        .find(|o| o.long == FLAG)
        .unwrap_or_else(|| panic!("serve --help has no {FLAG}"));
    let default = opt
        .default
        .clone()
        .expect("a default for --fresh-probe-timeout");
    let default_d = humantime::parse_duration(&default).expect("a duration");

    let mut files: Vec<PathBuf> = docs_files();
    files.extend(["SECURITY.md", "manifests/README.md"].map(PathBuf::from));
    let mut problems = Vec::new();
    let mut stated: BTreeMap<String, usize> = BTreeMap::new();
    for rel in &files {
        let text = read(rel);
        for (no, unit, _) in md::units(&text) {
            let plain = unit.replace('`', "").replace('|', " ");
            let lower = plain.to_lowercase();
            for claim in ["never waits on etcd", "reads caches only"] {
                if lower.contains(claim) {
                    problems.push(format!(
                        "{}:{no}: says a review {claim:?}; a fresh probe waits for etcd up to {FLAG}",
                        rel.display()
                    ));
                }
            }
            for (at, _) in plain.match_indices(FLAG) {
                let Some(said) = leading_duration(&plain[at + FLAG.len()..]) else {
                    continue;
                };
                *stated.entry(rel.display().to_string()).or_default() += 1;
                match humantime::parse_duration(&said) {
                    Ok(d) if d == default_d => {}
                    _ => problems.push(format!(
                        "{}:{no}: {FLAG} {said}, but serve --help says the default is {default}",
                        rel.display()
                    )),
                }
            }
        }
    }
    for must in ["README.md", "docs/operations.md"] {
        if !stated.contains_key(must) {
            problems.push(format!(
                "{must} does not state {FLAG}'s default: {stated:?}"
            ));
        }
    }
    let vwc = read(Path::new(
        "manifests/core/validatingwebhookconfiguration.yaml",
    ));
    let timeouts: Vec<u64> = vwc
        .lines()
        .filter_map(|l| l.trim().strip_prefix("timeoutSeconds:"))
        .map(|v| v.trim().parse().expect("timeoutSeconds is a number"))
        .collect();
    assert_eq!(timeouts.len(), 2, "{timeouts:?}");
    for t in timeouts {
        if std::time::Duration::from_secs(t) <= default_d {
            problems.push(format!(
                "a webhook's timeoutSeconds {t} is not longer than {FLAG}'s default {default}"
            ));
        }
    }
    report("the webhook's waiting", &problems);
}

#[test]
fn parser_reads_a_duration_after_a_flag() {
    assert_eq!(leading_duration(" 2 s) and"), Some("2s".into()));
    assert_eq!(
        leading_duration(" (default 2s, at most 4s)"),
        Some("2s".into())
    );
    assert_eq!(leading_duration("   2s   QUORUMGUARD_X"), Some("2s".into()));
    assert_eq!(leading_duration(" 1.5 s"), Some("1.5s".into()));
    assert_eq!(leading_duration(" 100ms"), Some("100ms".into()));
    assert_eq!(leading_duration(", 3 members"), None);
    assert_eq!(
        leading_duration(" leaves the decision to the policy, 5 s"),
        None
    );
}

/// Flags of other tools that the docs name alone in backticks, with the tool: not quorumguard's,
/// so not in any `--help` of it.
const OTHER_TOOLS_FLAGS: [(&str, &str); 14] = [
    ("--dry-run", "kubectl"),
    ("--hex", "etcdctl"),
    ("-w", "etcdctl"),
    ("--cluster", "etcdctl"),
    ("--quota-backend-bytes", "etcd"),
    ("--force-new-cluster", "etcd"),
    ("--logger", "etcd"),
    ("--election-timeout", "etcd"),
    ("--admission-control-config-file", "kube-apiserver"),
    ("--no-default-features", "cargo"),
    ("--workspace", "cargo"),
    ("--test", "cargo"),
    ("--release", "cargo"),
    ("-s", "cargo fuzz"),
];

/// The flag a code span names alone (`` `--steps` ``, `` `-o json` ``, `` `--objects FILE` ``,
/// `` `--etcd-election-timeout 0s` ``): its first word, up to a `=`, when that is a flag.
fn lone_flag(span: &str) -> Option<String> {
    let first = span.split_whitespace().next()?;
    let flag = first.split('=').next().unwrap_or("");
    let long = flag.len() > 2
        && flag.starts_with("--")
        && flag[2..].starts_with(|c: char| c.is_ascii_alphabetic())
        && flag[2..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
    let short = flag.len() == 2
        && flag.starts_with('-')
        && flag[1..].chars().all(|c| c.is_ascii_alphabetic());
    (long || short).then(|| flag.to_string())
}

/// A flag the docs name alone in backticks, outside a command line (`` `--steps` shows one
/// control plane's steps ``), is a flag of some quorumguard command or one of
/// [`OTHER_TOOLS_FLAGS`]: a flag renamed or never made cannot linger in prose. (Which command a
/// paragraph speaks of is not read: headings name one command while their text names flags of
/// `serve` or the playground, so that check would need a list of exceptions as long as the
/// docs.) docs/benchmarks.md is left out: its flags are the benchmark binary's.
#[test]
fn flags_the_docs_name_alone_exist() {
    let commands = commands();
    let known = |flag: &str| {
        GENERIC_FLAGS.contains(&flag)
            || OTHER_TOOLS_FLAGS.iter().any(|(f, _)| *f == flag)
            || commands
                .values()
                .flatten()
                .any(|o| o.long == flag || o.short.as_deref() == Some(flag))
    };
    let mut files: Vec<PathBuf> = docs_files();
    files.extend(["SECURITY.md", "manifests/README.md", "certs/README.md"].map(PathBuf::from));
    files.retain(|f| f != Path::new("docs/benchmarks.md"));
    let mut problems = Vec::new();
    let mut seen = 0;
    for rel in &files {
        let text = read(rel);
        for (no, unit, code) in md::units(&text) {
            if code {
                continue;
            }
            for flag in md::code_spans(&unit).iter().filter_map(|s| lone_flag(s)) {
                seen += 1;
                if !known(&flag) {
                    problems.push(format!(
                        "{}:{no}: `{flag}` is no flag of any quorumguard command (nor in OTHER_TOOLS_FLAGS)",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(seen > 50, "only {seen} lone flags found");
    report("flags named alone", &problems);
}

#[test]
fn parser_reads_lone_flags() {
    assert_eq!(lone_flag("--steps"), Some("--steps".into()));
    assert_eq!(lone_flag("-o json"), Some("-o".into()));
    assert_eq!(lone_flag("--objects FILE"), Some("--objects".into()));
    assert_eq!(lone_flag("--dry-run=server"), Some("--dry-run".into()));
    assert_eq!(lone_flag("-----BEGIN"), None);
    assert_eq!(lone_flag("-1"), None);
    assert_eq!(lone_flag("--"), None);
    assert_eq!(lone_flag("quorumguard status"), None);
}

/// Every name of one of these families that the docs give (the text right after the prefix,
/// letters, digits and `_./-`, trailing punctuation dropped).
fn names_with_prefix(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
            .unwrap_or(rest.len());
        let name = rest[..end].trim_end_matches(['.', '/', '-', '_']);
        if !name.is_empty() {
            out.insert(format!("{prefix}{name}"));
        }
    }
    out
}

/// The text of the code and manifests a name the docs give must appear in: src/, crates/,
/// manifests/, scripts/ and tests/ (`.rs`, `.yaml`, `.sh`).
fn code_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else if [".rs", ".yaml", ".sh"].iter().any(|e| name.ends_with(e)) {
                out.push_str(&fs::read_to_string(&p).unwrap_or_default());
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    // tests/ too: the tests' own knobs (environment variables) are documented.
    for dir in ["src", "crates", "manifests", "scripts", "tests"] {
        walk(&root().join(dir), &mut out);
    }
    out
}

/// The annotations, condition types and JSON schemas (`quorumguard.io/...`), environment
/// variables (`QUORUMGUARD_...`) and metrics (`quorumguard_...`) that README.md, docs/,
/// SECURITY.md, manifests/README.md and certs/README.md name exist, spelled so, in the code or
/// the manifests: an operator who copies one from the docs gets a name the product reads or
/// writes.
#[test]
fn names_the_docs_give_exist_in_the_code() {
    let code = code_text();
    assert!(
        code.len() > 100_000,
        "only {} bytes of code read",
        code.len()
    );
    let mut files: Vec<PathBuf> = docs_files();
    files.extend(["SECURITY.md", "manifests/README.md", "certs/README.md"].map(PathBuf::from));
    let mut problems = Vec::new();
    let mut seen = 0;
    for rel in &files {
        let text = read(rel);
        for prefix in ["quorumguard.io/", "QUORUMGUARD_", "quorumguard_"] {
            for name in names_with_prefix(&text, prefix) {
                seen += 1;
                if !code.contains(&name) && !registered_metric(&code, &name) {
                    problems.push(format!(
                        "{}: `{name}` appears nowhere in src/, crates/, manifests/, scripts/ or tests/",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(seen > 30, "only {seen} names found");
    report("names", &problems);
}

/// A metric `quorumguard_X` whose family is registered as `"X"` (the registry adds the prefix
/// `quorumguard_`, and `_total` to counters; histograms have `_bucket`, `_sum`, `_count`).
fn registered_metric(code: &str, name: &str) -> bool {
    let Some(family) = name.strip_prefix("quorumguard_") else {
        return false;
    };
    let mut candidates = vec![family];
    for suffix in ["_total", "_bucket", "_sum", "_count"] {
        candidates.extend(family.strip_suffix(suffix));
    }
    candidates
        .iter()
        .any(|c| code.contains(&format!("\"{c}\"")))
}

#[test]
fn parser_reads_names_with_a_prefix() {
    let got = names_with_prefix(
        "`quorumguard.io/NextAction`, machines.quorumguard.io/reason and \
         quorumguard.io/check/v1. QUORUMGUARD_KCP=x `quorumguard_status_writes_total{result}`",
        "quorumguard.io/",
    );
    let want: BTreeSet<String> = ["quorumguard.io/NextAction", "quorumguard.io/check/v1"]
        .map(String::from)
        .into();
    assert_eq!(got, want);
    let got = names_with_prefix("x QUORUMGUARD_KCP=x, QUORUMGUARD_.", "QUORUMGUARD_");
    assert_eq!(got, ["QUORUMGUARD_KCP".to_string()].into());
    let got = names_with_prefix("`quorumguard_status_writes_total{result}`", "quorumguard_");
    assert_eq!(got, ["quorumguard_status_writes_total".to_string()].into());
    let code = "reg.register(\n\"status_writes\",";
    assert!(registered_metric(code, "quorumguard_status_writes_total"));
    assert!(registered_metric(code, "quorumguard_status_writes"));
    assert!(!registered_metric(code, "quorumguard_status_write_total"));
    assert!(!registered_metric(code, "status_writes_total"));
}
