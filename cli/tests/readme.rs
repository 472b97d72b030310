//! README's command table ("## The `ina` command") against the binary: every flag a row names
//! for its subcommand must be one that subcommand's `--help` lists.
//!
//! A row's flags belong to the row's command (`ina job`), or, once the row names one of that
//! command's subcommands at the start of a code span (`create NAME --workers ...`), to that
//! subcommand until the row names another. A code span that starts with `ina` (`ina worker
//! --group`) names its own command for its own flags.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The heading of the table's section.
const SECTION: &str = "## The `ina` command";

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The rows of the command table: the section's lines that start with "| `ina ".
fn table_rows(readme: &str) -> Vec<String> {
    let start = readme
        .find(SECTION)
        .unwrap_or_else(|| panic!("README.md has no section {SECTION:?}"));
    let section = &readme[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with("| `ina "))
        .map(str::to_string)
        .collect()
}

/// A table row's cells, split on the pipes that are not escaped (`\|` stays in its cell, as
/// `|`).
fn cells(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = row.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    if !cell.trim().is_empty() {
        cells.push(cell.trim().to_string());
    }
    cells
}

/// A cell as alternating pieces: plain text (`false`) and code spans (`true`).
fn pieces(cell: &str) -> Vec<(bool, &str)> {
    cell.split('`')
        .enumerate()
        .map(|(i, p)| (i % 2 == 1, p))
        .filter(|(_, p)| !p.is_empty())
        .collect()
}

/// Every `--flag` in `text`, in order.
fn flags(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at + 2..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let starts_word = before.is_none_or(|c| !(c.is_alphanumeric() || c == '-'));
        if starts_word && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push(format!("--{name}"));
        }
        rest = &tail[len..];
    }
    out
}

/// The help text of `ina <path> --help`, the options it lists and its subcommands.
#[derive(Debug)]
struct Help {
    options: BTreeSet<String>,
    subcommands: BTreeSet<String>,
}

fn help(path: &[String]) -> Help {
    let out = Command::new(env!("CARGO_BIN_EXE_ina"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ina {} --help failed: {}{}",
        path.join(" "),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut options = BTreeSet::new();
    let mut subcommands = BTreeSet::new();
    let mut in_commands = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        if in_commands && indent == 2 {
            if let Some(name) = trimmed.split_whitespace().next() {
                subcommands.insert(name.to_string());
            }
        }
        // An option's own line ("  -h, --help", "      --listen <LISTEN>"), not a line of a
        // description (indented further, and free to name other flags).
        if indent <= 6 && trimmed.starts_with('-') {
            let spec = trimmed.split("  ").next().unwrap_or(trimmed);
            if let Some(flag) = flags(spec).into_iter().next() {
                options.insert(flag);
            }
        }
    }
    Help {
        options,
        subcommands,
    }
}

/// Caches the help of every command path asked for.
#[derive(Default)]
struct Helps(BTreeMap<Vec<String>, Help>);

impl Helps {
    fn get(&mut self, path: &[String]) -> &Help {
        self.0.entry(path.to_vec()).or_insert_with(|| help(path))
    }

    /// The command a code span starting with `ina` names: its words that are subcommands.
    fn command_of(&mut self, span: &str) -> Vec<String> {
        let mut path: Vec<String> = Vec::new();
        for word in span.split_whitespace().skip(1) {
            if self.get(&path).subcommands.contains(word) {
                path.push(word.to_string());
            } else {
                break;
            }
        }
        path
    }
}

#[test]
fn every_flag_the_command_table_names_is_in_its_subcommands_help() {
    let readme = readme();
    let rows = table_rows(&readme);
    assert!(rows.len() >= 8, "the command table has {} rows", rows.len());
    let mut helps = Helps::default();
    let mut missing = Vec::new();
    let mut checked = 0;
    for row in &rows {
        let cells = cells(row);
        assert!(cells.len() >= 2, "a row without a description: {row}");
        let first = cells[0].trim_matches('`');
        let command: Vec<String> = helps.command_of(first);
        assert!(
            !command.is_empty(),
            "the row's command `{first}` is no subcommand of ina"
        );
        let mut current = command.clone();
        for (code, piece) in pieces(&cells[1]) {
            let mut of = current.clone();
            if code {
                let word = piece.split_whitespace().next().unwrap_or("");
                if word == "ina" {
                    of = helps.command_of(piece);
                } else if helps.get(&command).subcommands.contains(word) {
                    current = command.iter().cloned().chain([word.to_string()]).collect();
                    of = current.clone();
                }
            }
            for flag in flags(piece) {
                checked += 1;
                if !helps.get(&of).options.contains(&flag) {
                    missing.push(format!(
                        "README.md's row `{first}` names {flag} for `ina {}`, which its --help \
                         does not list",
                        of.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {checked} flags:\n{}",
        missing.len(),
        missing.join("\n")
    );
    assert!(checked >= 50, "only {checked} flags found in the table");
    eprintln!(
        "{checked} flags of {} rows, all in their subcommands' --help",
        rows.len()
    );
}

#[test]
fn the_parsers_read_a_row_as_written() {
    let row = "| `ina switch add\\|list\\|drain` | `add NAME --kind bmv2` a bmv2, `ina worker --group`; --x-y, a--b, `--p4 F` |";
    let cells = cells(row);
    assert_eq!(cells[0], "`ina switch add|list|drain`");
    assert_eq!(
        flags(&cells[1]),
        ["--kind", "--group", "--x-y", "--p4"].map(String::from)
    );
    let spans: Vec<&str> = pieces(&cells[1])
        .into_iter()
        .filter(|(code, _)| *code)
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        spans,
        ["add NAME --kind bmv2", "ina worker --group", "--p4 F"]
    );
}
