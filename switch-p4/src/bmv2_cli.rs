//! `simple_switch_CLI` as a program drives it: run a batch of commands against a running
//! switch's thrift port (with a deadline, optionally inside a network namespace), and parse what
//! it prints back: table dumps, multicast dumps, the handles of created nodes.
//!
//! The CLI's output is text meant for people; every parser here checks what it reads and
//! returns [`Bmv2Error::Output`] on anything it does not recognise, never a guess.

use crate::bmv2::{tool, Bmv2Error};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `simple_switch_CLI` pointed at one switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bmv2Cli {
    /// The switch's thrift server.
    pub thrift: SocketAddr,
    /// The network namespace to run the CLI in (`None`: this one).
    pub netns: Option<String>,
    /// How long one batch may take before the CLI is killed.
    pub timeout: Duration,
}

impl Bmv2Cli {
    /// The CLI of the switch whose thrift server is `thrift`, with a 30 s deadline per batch.
    pub fn new(thrift: SocketAddr) -> Bmv2Cli {
        Bmv2Cli {
            thrift,
            netns: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// Runs `commands`, one per line; returns what the CLI printed. Fails if it cannot connect,
    /// takes longer than the deadline, or reports an error for any command.
    pub fn run(&self, commands: &[String]) -> Result<String, Bmv2Error> {
        let cli = tool("simple_switch_CLI")?;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(cli);
                c
            }
            None => Command::new(cli),
        };
        let mut child = cmd
            .arg("--thrift-ip")
            .arg(self.thrift.ip().to_string())
            .arg("--thrift-port")
            .arg(self.thrift.port().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Bmv2Error::Io {
                what: "starting simple_switch_CLI".into(),
                source,
            })?;
        // Readers first, so that a long answer never fills a pipe while we wait.
        let read = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut text);
                }
                text
            })
        };
        let out = read(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = read(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        if let Some(mut stdin) = child.stdin.take() {
            let text = commands.join("\n") + "\n";
            // A CLI that could not connect exits before reading: its output says why.
            let _ = stdin.write_all(text.as_bytes());
        }
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Bmv2Error::Cli(format!(
                        "simple_switch_CLI at {} took longer than {:?}",
                        self.thrift, self.timeout
                    )));
                }
                Err(source) => {
                    return Err(Bmv2Error::Io {
                        what: "waiting for simple_switch_CLI".into(),
                        source,
                    })
                }
            }
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.join().unwrap_or_default()),
            String::from_utf8_lossy(&err.join().unwrap_or_default())
        );
        check_output(status.success(), text)
    }
}

/// The CLI's output, or the error lines in it (it exits 0 after most errors).
pub(crate) fn check_output(success: bool, text: String) -> Result<String, Bmv2Error> {
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("Error")
                || l.contains("Invalid")
                || l.contains("Could not connect")
                || l.contains("Traceback")
                || l.contains("error:")
        })
        .collect();
    if !success || !errors.is_empty() {
        return Err(Bmv2Error::Cli(if errors.is_empty() {
            text
        } else {
            errors.join("; ")
        }));
    }
    Ok(text)
}

/// One entry of a table, as `table_dump` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedEntry {
    /// The handle `table_delete` takes.
    pub handle: u32,
    /// The key's fields, in the table's order.
    pub key: Vec<u64>,
    /// The action's name, as `InaIngress.set_job`.
    pub action: String,
    /// The action's parameters, in order.
    pub data: Vec<u64>,
}

fn bad(what: &str, line: &str) -> Bmv2Error {
    Bmv2Error::Output(format!("{what}: {line:?}"))
}

/// A line without the prompts the CLI writes in front of its answers.
fn unprompted(line: &str) -> &str {
    let mut l = line.trim();
    while let Some(rest) = l.strip_prefix("RuntimeCmd:") {
        l = rest.trim_start();
    }
    l
}

fn hex(s: &str, line: &str) -> Result<u64, Bmv2Error> {
    u64::from_str_radix(s.trim(), 16).map_err(|_| bad("not a hexadecimal number", line))
}

/// Parses the output of one `table_dump`: its entries (the default entry is left out).
pub fn parse_table_dump(text: &str) -> Result<Vec<DumpedEntry>, Bmv2Error> {
    let mut entries: Vec<DumpedEntry> = Vec::new();
    let mut current: Option<DumpedEntry> = None;
    let mut in_default = false;
    for raw in text.lines() {
        let line = unprompted(raw);
        if let Some(h) = line.strip_prefix("Dumping entry 0x") {
            entries.extend(current.take());
            current = Some(DumpedEntry {
                handle: u32::from_str_radix(h.trim(), 16)
                    .map_err(|_| bad("not an entry handle", raw))?,
                key: Vec::new(),
                action: String::new(),
                data: Vec::new(),
            });
            in_default = false;
        } else if line.starts_with("Dumping default entry") {
            entries.extend(current.take());
            in_default = true;
        } else if let Some(field) = line.strip_prefix("* ") {
            if in_default {
                continue;
            }
            let e = current
                .as_mut()
                .ok_or_else(|| bad("a key field outside an entry", raw))?;
            // `ina.job             : EXACT     0007`
            let (_, spec) = field
                .split_once(':')
                .ok_or_else(|| bad("a key field without a match kind", raw))?;
            let mut words = spec.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("EXACT"), Some(v), None) => e.key.push(hex(v, raw)?),
                _ => return Err(bad("a key field that is not one exact value", raw)),
            }
        } else if let Some(action) = line.strip_prefix("Action entry:") {
            if in_default {
                continue;
            }
            let e = current
                .as_mut()
                .ok_or_else(|| bad("an action outside an entry", raw))?;
            let (name, data) = action
                .split_once(" - ")
                .map(|(n, d)| (n, d.trim()))
                .or_else(|| action.trim().strip_suffix(" -").map(|n| (n, "")))
                .ok_or_else(|| bad("an action without parameters", raw))?;
            e.action = name.trim().to_string();
            e.data = data
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| hex(d, raw))
                .collect::<Result<_, _>>()?;
        }
    }
    entries.extend(current);
    if let Some(e) = entries.iter().find(|e| e.action.is_empty()) {
        return Err(Bmv2Error::Output(format!(
            "entry {:#x} has no action in:\n{text}",
            e.handle
        )));
    }
    Ok(entries)
}

/// Parses the output of `mc_dump`: each multicast group's nodes, by their handles.
pub fn parse_mc_dump(text: &str) -> Result<BTreeMap<u16, Vec<u32>>, Bmv2Error> {
    let mut groups: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
    let mut current = None;
    for raw in text.lines() {
        let line = unprompted(raw);
        if line.starts_with("LAGS") {
            break;
        }
        if let Some(g) = line.strip_prefix("mgrp(") {
            let g: u16 = g
                .strip_suffix(')')
                .and_then(|g| g.parse().ok())
                .ok_or_else(|| bad("not a multicast group", raw))?;
            groups.entry(g).or_default();
            current = Some(g);
        } else if let Some(node) = line.strip_prefix("-> (L1h=") {
            let g = current.ok_or_else(|| bad("a node outside a group", raw))?;
            let h: u32 = node
                .split(',')
                .next()
                .and_then(|h| h.parse().ok())
                .ok_or_else(|| bad("not a node handle", raw))?;
            groups.entry(g).or_default().push(h);
        }
    }
    Ok(groups)
}

/// The handles of the nodes `mc_node_create` made, in the order it made them.
pub fn parse_created_nodes(text: &str) -> Result<Vec<u32>, Bmv2Error> {
    text.lines()
        .filter_map(|raw| {
            unprompted(raw)
                .strip_prefix("node was created with handle ")
                .map(|h| h.trim().parse().map_err(|_| bad("not a node handle", raw)))
        })
        .collect()
}

/// The value `table_num_entries` printed.
pub fn parse_num_entries(text: &str) -> Result<u64, Bmv2Error> {
    text.lines()
        .map(unprompted)
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.parse().ok())
        .next_back()
        .ok_or_else(|| Bmv2Error::Output(format!("no entry count in:\n{text}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RANK_DUMP: &str = "Obtaining JSON from switch...\nDone\nControl utility for runtime P4 table manipulation\nRuntimeCmd: ==========\nTABLE ENTRIES\n**********\nDumping entry 0x0\nMatch key:\n* ina.job             : EXACT     0007\n* ina.rank            : EXACT     01\nAction entry: InaIngress.set_rank - 02, c6120101, 2328\n**********\nDumping entry 0x1a\nMatch key:\n* ina.job             : EXACT     0007\n* ina.rank            : EXACT     00\nAction entry: InaIngress.set_rank - 02, c6120102, 2328\n==========\nDumping default entry\nAction entry: InaIngress.unknown_rank - \n==========\nRuntimeCmd: \n";

    #[test]
    fn a_table_dump_gives_handles_keys_and_data() {
        let e = parse_table_dump(RANK_DUMP).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].handle, 0);
        assert_eq!(e[0].key, vec![7, 1]);
        assert_eq!(e[0].action, "InaIngress.set_rank");
        assert_eq!(e[0].data, vec![2, 0xc612_0101, 9000]);
        assert_eq!(e[1].handle, 0x1a);
        assert_eq!(e[1].key, vec![7, 0]);
    }

    #[test]
    fn a_table_dump_with_unknown_lines_is_refused() {
        let ternary = RANK_DUMP.replace("EXACT     01", "TERNARY   01 &&& ff");
        assert!(matches!(
            parse_table_dump(&ternary),
            Err(Bmv2Error::Output(_))
        ));
        let no_action = RANK_DUMP.replace(
            "Action entry: InaIngress.set_rank - 02, c6120101, 2328\n",
            "",
        );
        assert!(parse_table_dump(&no_action).is_err());
        let bad_hex = RANK_DUMP.replace("c6120101", "c6x20101");
        assert!(parse_table_dump(&bad_hex).is_err());
        assert_eq!(parse_table_dump("RuntimeCmd: \n").unwrap(), vec![]);
    }

    #[test]
    fn an_mc_dump_gives_each_groups_nodes() {
        let text = "RuntimeCmd: ==========\nMC ENTRIES\n**********\nmgrp(6)\n  -> (L1h=2, rid=3) -> (ports=[1, 2], lags=[])\n**********\nmgrp(5)\n  -> (L1h=0, rid=0) -> (ports=[1], lags=[])\n  -> (L1h=1, rid=1) -> (ports=[2], lags=[])\n**********\nmgrp(9)\n==========\nLAGS\n==========\n";
        let g = parse_mc_dump(text).unwrap();
        assert_eq!(g.get(&5), Some(&vec![0, 1]));
        assert_eq!(g.get(&6), Some(&vec![2]));
        assert_eq!(g.get(&9), Some(&vec![]));
        assert!(parse_mc_dump("mgrp(x)\n").is_err());
        assert!(parse_mc_dump("  -> (L1h=1, rid=1)\n").is_err());
    }

    #[test]
    fn created_nodes_and_entry_counts() {
        let text = "RuntimeCmd: Creating node with rid 0 , port map 10 and lag map \nnode was created with handle 4\nRuntimeCmd: Creating node with rid 1 , port map 100 and lag map \nnode was created with handle 7\n";
        assert_eq!(parse_created_nodes(text).unwrap(), vec![4, 7]);
        assert!(parse_created_nodes("node was created with handle x\n").is_err());
        assert_eq!(
            parse_num_entries("Done\nRuntimeCmd: 3\nRuntimeCmd: \n").unwrap(),
            3
        );
        assert!(parse_num_entries("RuntimeCmd: \n").is_err());
    }

    #[test]
    fn errors_in_the_output_fail_the_batch() {
        assert!(check_output(
            true,
            "RuntimeCmd: Invalid table operation (DUPLICATE_ENTRY)\n".into()
        )
        .is_err());
        assert!(check_output(false, "anything\n".into()).is_err());
        assert!(check_output(true, "RuntimeCmd: \n".into()).is_ok());
    }

    proptest! {
        /// Whatever the CLI prints, the parsers answer without panicking.
        #[test]
        fn parsers_never_panic(text in "(RuntimeCmd: |Dumping entry 0x|\\* |Action entry:| - |mgrp\\(|-> \\(L1h=|node was created with handle |[0-9a-f, :()=\n])*") {
            let _ = parse_table_dump(&text);
            let _ = parse_mc_dump(&text);
            let _ = parse_created_nodes(&text);
            let _ = parse_num_entries(&text);
        }

        /// Entries written in the dump's format read back as they were.
        #[test]
        fn dumped_entries_round_trip(entries in proptest::collection::vec(
            (any::<u32>(), proptest::collection::vec(any::<u32>(), 1..3), proptest::collection::vec(any::<u64>(), 0..7)), 0..6)) {
            let mut text = String::from("RuntimeCmd: ==========\nTABLE ENTRIES\n");
            for (h, key, data) in &entries {
                text += &format!("**********\nDumping entry {h:#x}\nMatch key:\n");
                for k in key {
                    text += &format!("* ina.f               : EXACT     {k:08x}\n");
                }
                let d: Vec<String> = data.iter().map(|d| format!("{d:x}")).collect();
                text += &format!("Action entry: InaIngress.a - {}\n", d.join(", "));
            }
            text += "==========\nDumping default entry\nAction entry: InaIngress.none - \n==========\n";
            let parsed = parse_table_dump(&text).unwrap();
            prop_assert_eq!(parsed.len(), entries.len());
            for (p, (h, key, data)) in parsed.iter().zip(&entries) {
                prop_assert_eq!(p.handle, *h);
                prop_assert_eq!(&p.key, &key.iter().map(|k| u64::from(*k)).collect::<Vec<_>>());
                prop_assert_eq!(&p.data, data);
                prop_assert_eq!(p.action.as_str(), "InaIngress.a");
            }
        }
    }
}
