//! The driver of bmv2's `simple_switch` running the v1model program, through
//! `simple_switch_CLI`'s runtime commands.
//!
//! - A switch that holds no L2 entry has just started: the driver configures it first (its
//!   address, L2 table and flood group, every register zeroed), so a restarted bmv2 is
//!   provisioned again by the controller's resync like a restarted software switch.
//! - Installing a job adds its table entries, its multicast group and one node per rank, then
//!   (with the node handles the switch answered) joins the nodes to the group and zeroes the
//!   control registers of its slots.
//! - Removing a job reads the tables back and deletes whatever they hold under its number, so
//!   a removal after a controller restart, or of a half-installed job, needs no memory.

use super::p4::{job_desc, next_epoch, rank_of};
use super::{DriverError, Install, SwitchDriver};
use crate::alloc::{JobId, Range};
use crate::api::P4Spec;
use ina_switch_p4::bmv2::Bmv2Error;
use ina_switch_p4::bmv2_cli::{
    parse_created_nodes, parse_mc_dump, parse_num_entries, parse_table_dump, Bmv2Cli, DumpedEntry,
};
use ina_switch_p4::runtime::{
    bmv2_job_attach_commands, bmv2_job_entry_commands, bmv2_switch_commands, V1MODEL,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How long one batch of runtime commands may take.
pub const CLI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The tables that hold a job's entries, keyed by its number first.
const JOB_TABLES: [&str; 3] = [
    "InaIngress.ina_job",
    "InaIngress.ina_rank",
    "InaEgress.ina_rank_addr",
];

/// The driver of one bmv2 switch.
#[derive(Debug)]
pub struct Bmv2Switch {
    cli: Bmv2Cli,
    p4: P4Spec,
}

impl Bmv2Switch {
    /// The driver of the bmv2 whose thrift server is `thrift`, described by `p4`, whose
    /// runtime CLI runs in network namespace `netns` (the controller's configuration; `None`:
    /// the controller's own).
    pub fn new(thrift: SocketAddr, p4: P4Spec, netns: Option<String>) -> Bmv2Switch {
        let mut cli = Bmv2Cli::new(thrift);
        cli.netns = netns;
        cli.timeout = CLI_TIMEOUT;
        Bmv2Switch { cli, p4 }
    }

    fn run(&self, commands: &[String]) -> Result<String, DriverError> {
        self.cli.run(commands).map_err(|e| self.error(e))
    }

    /// Runs `commands`; returns each one's answer.
    fn run_each(&self, commands: &[String]) -> Result<Vec<String>, DriverError> {
        let text = self.run(commands)?;
        // The CLI prompts before reading each command: what follows the n-th prompt is the
        // n-th command's answer.
        let answers: Vec<String> = text
            .split("RuntimeCmd:")
            .skip(1)
            .take(commands.len())
            .map(str::to_string)
            .collect();
        if answers.len() != commands.len() {
            return Err(self.error(Bmv2Error::Output(format!(
                "{} answers to {} commands in:\n{text}",
                answers.len(),
                commands.len()
            ))));
        }
        Ok(answers)
    }

    fn error(&self, e: Bmv2Error) -> DriverError {
        match e {
            Bmv2Error::Cli(m) if m.contains("Could not connect") || m.contains("took longer") => {
                DriverError::Unreachable {
                    addr: self.cli.thrift,
                    source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, m),
                }
            }
            Bmv2Error::Io { what, source } => DriverError::Unreachable {
                addr: self.cli.thrift,
                source: std::io::Error::new(source.kind(), format!("{what}: {source}")),
            },
            other => self.refused(other.to_string()),
        }
    }

    fn refused(&self, message: String) -> DriverError {
        DriverError::Refused {
            addr: self.cli.thrift,
            message,
        }
    }

    /// The `ina_job` entries the switch holds, in one CLI run with the check for a switch
    /// that has just started (it holds no L2 entry; the configuration always adds the
    /// broadcast one), which is configured first and then holds no job.
    fn job_entries(&self) -> Result<Vec<DumpedEntry>, DriverError> {
        let answers = self.run_each(&[
            "table_num_entries InaIngress.l2_forward".to_string(),
            "table_dump InaIngress.ina_job".to_string(),
        ])?;
        let entries = parse_num_entries(&answers[0]).map_err(|e| self.error(e))?;
        if entries == 0 {
            let commands =
                bmv2_switch_commands(&self.p4.switch).map_err(|e| self.refused(e.to_string()))?;
            self.run(&commands)?;
            tracing::info!(thrift = %self.cli.thrift, "bmv2 configured (it had just started)");
            return Ok(Vec::new());
        }
        parse_table_dump(&answers[1]).map_err(|e| self.error(e))
    }
}

/// The slots of an `ina_job` entry (`set_job`'s parameters: epoch, slot base, slot count,
/// elements, workers, group).
fn job_slots(e: &DumpedEntry) -> Option<(JobId, Range, u16, u16)> {
    let id = JobId::try_from(*e.key.first()?).ok()?;
    let field = |i: usize| e.data.get(i).and_then(|v| u16::try_from(*v).ok());
    Some((
        id,
        Range {
            base: field(1)?,
            count: field(2)?,
        },
        field(0)?,
        field(5)?,
    ))
}

impl SwitchDriver for Bmv2Switch {
    fn install(&self, job: &Install) -> Result<u16, DriverError> {
        let previous = self
            .job_entries()?
            .iter()
            .filter_map(job_slots)
            .find(|(id, ..)| *id == job.job)
            .map(|(_, _, epoch, _)| epoch);
        let epoch = next_epoch(job.job, previous);
        let desc = job_desc(&V1MODEL, &self.p4, job, epoch).map_err(|m| self.refused(m))?;
        let text = self.run(&bmv2_job_entry_commands(&desc))?;
        let nodes = parse_created_nodes(&text).map_err(|e| self.error(e))?;
        if nodes.len() != desc.ranks.len() {
            return Err(self.refused(format!(
                "job {}: {} multicast nodes made for {} ranks",
                job.job,
                nodes.len(),
                desc.ranks.len()
            )));
        }
        self.run(&bmv2_job_attach_commands(&desc, &nodes))?;
        tracing::info!(thrift = %self.cli.thrift, job = job.job, epoch, slots = ?job.slots, "job installed on bmv2");
        Ok(epoch)
    }

    fn remove(&self, job: JobId) -> Result<(), DriverError> {
        let mut commands: Vec<String> = JOB_TABLES
            .iter()
            .map(|t| format!("table_dump {t}"))
            .collect();
        commands.push("mc_dump".into());
        let answers = self.run_each(&commands)?;
        let mut deletes = Vec::new();
        let mut group = job;
        for (table, answer) in JOB_TABLES.iter().zip(&answers) {
            for e in parse_table_dump(answer).map_err(|e| self.error(e))? {
                if e.key.first() != Some(&u64::from(job)) {
                    continue;
                }
                if let Some((_, _, _, mgrp)) = job_slots(&e).filter(|_| *table == JOB_TABLES[0]) {
                    group = mgrp;
                }
                deletes.push(format!("table_delete {table} {}", e.handle));
            }
        }
        let groups = parse_mc_dump(&answers[3]).map_err(|e| self.error(e))?;
        if group != self.p4.switch.flood_mgrp {
            if let Some(nodes) = groups.get(&group) {
                for n in nodes {
                    deletes.push(format!("mc_node_dissociate {group} {n}"));
                    deletes.push(format!("mc_node_destroy {n}"));
                }
                deletes.push(format!("mc_mgrp_destroy {group}"));
            }
        }
        if !deletes.is_empty() {
            self.run(&deletes)?;
            tracing::info!(thrift = %self.cli.thrift, job, "job removed from bmv2");
        }
        Ok(())
    }

    fn installed(&self) -> Result<BTreeMap<JobId, Range>, DriverError> {
        Ok(self
            .job_entries()?
            .iter()
            .filter_map(job_slots)
            .map(|(id, r, ..)| (id, r))
            .collect())
    }

    fn check_worker(&self, addr: SocketAddr) -> Result<(), String> {
        rank_of(&self.p4, addr).map(|_| ())
    }
}
