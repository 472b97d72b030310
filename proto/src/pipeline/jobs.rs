//! The job table: the jobs installed, each with what the data path compares a header with.

use super::{JobConfig, JobError, Pipeline, PortId};
use crate::Instant;
use ina_wire::agg::MAX_RANK;
use ina_wire::HEADER_LEN;

#[derive(Debug, Clone)]
pub(super) struct Job {
    pub(super) cfg: JobConfig,
    /// What the data fast path compares the header's bytes 2..6 with: job id and epoch, as
    /// they lie in a packet.
    pub(super) key: [u8; 4],
    /// What the data fast path compares the header's bytes 10..12 with: the element count, as
    /// it lies in a packet.
    pub(super) count_bytes: [u8; 2],
    /// The length of the job's data packets: header and `elems_per_packet` elements.
    pub(super) packet_len: usize,
    /// `cfg.ranks.len()`.
    pub(super) workers: u32,
    /// `cfg.ranks`, padded, in place: the rank check needs no indirection.
    pub(super) ports: [PortId; MAX_RANK as usize + 1],
    pub(super) last_activity: Option<Instant>,
}

impl Job {
    /// The port installed for `rank`, if the job has that rank.
    #[inline(always)]
    pub(super) fn port_of(&self, rank: u8) -> Option<PortId> {
        if u32::from(rank) < self.workers {
            Some(self.ports[usize::from(rank % 32)])
        } else {
            None
        }
    }

    pub(super) fn new(cfg: JobConfig) -> Job {
        let mut ports = [PortId(0); MAX_RANK as usize + 1];
        for (p, r) in ports.iter_mut().zip(&cfg.ranks) {
            *p = *r;
        }
        Job {
            key: (u32::from(cfg.job) << 16 | u32::from(cfg.epoch)).to_be_bytes(),
            count_bytes: cfg.elems_per_packet.to_be_bytes(),
            packet_len: HEADER_LEN + 4 * usize::from(cfg.elems_per_packet),
            workers: cfg.ranks.len() as u32,
            ports,
            cfg,
            last_activity: None,
        }
    }
}

impl Pipeline {
    /// Installs a job and clears its slots.
    pub fn add_job(&mut self, cfg: JobConfig) -> Result<(), JobError> {
        if self.jobs.iter().any(|j| j.cfg.job == cfg.job) {
            return Err(JobError::Exists(cfg.job));
        }
        if cfg.ranks.is_empty() || cfg.ranks.len() > usize::from(MAX_RANK) + 1 {
            return Err(JobError::Workers(cfg.ranks.len()));
        }
        if cfg.elems_per_packet == 0 || cfg.elems_per_packet > self.cfg.max_elems {
            return Err(JobError::Elems {
                got: cfg.elems_per_packet,
                max: self.cfg.max_elems,
            });
        }
        if cfg.slot_count == 0 {
            return Err(JobError::NoSlots);
        }
        let end = u32::from(cfg.slot_base) + u32::from(cfg.slot_count);
        if end > u32::from(self.cfg.pool_slots) {
            return Err(JobError::OutOfPool {
                base: cfg.slot_base,
                end,
                pool: self.cfg.pool_slots,
            });
        }
        for other in &self.jobs {
            let o_base = u32::from(other.cfg.slot_base);
            let o_end = o_base + u32::from(other.cfg.slot_count);
            if u32::from(cfg.slot_base) < o_end && o_base < end {
                return Err(JobError::Overlap {
                    base: cfg.slot_base,
                    end,
                    other: other.cfg.job,
                });
            }
        }
        for (i, p) in cfg.ranks.iter().enumerate() {
            if cfg.ranks[..i].contains(p) {
                return Err(JobError::DuplicatePort(*p));
            }
        }
        if let Some(up) = cfg.uplink {
            if cfg.ranks.contains(&up.port) {
                return Err(JobError::UplinkIsRank(up.port));
            }
            // The totals coming down are told apart by port and job on the upper switch.
            if let Some(other) = self.jobs.iter().find(|j| {
                j.cfg
                    .uplink
                    .is_some_and(|o| o.port == up.port && o.job == up.job)
            }) {
                return Err(JobError::UplinkShared {
                    port: up.port,
                    job: up.job,
                    other: other.cfg.job,
                });
            }
        }
        self.regs
            .clear_range(usize::from(cfg.slot_base), usize::from(cfg.slot_count));
        self.jobs.push(Job::new(cfg));
        Ok(())
    }

    /// Removes a job and clears its slots.
    pub fn remove_job(&mut self, job: u16) -> Result<JobConfig, JobError> {
        let idx = self
            .jobs
            .iter()
            .position(|j| j.cfg.job == job)
            .ok_or(JobError::Unknown(job))?;
        let removed = self.jobs.swap_remove(idx).cfg;
        self.regs.clear_range(
            usize::from(removed.slot_base),
            usize::from(removed.slot_count),
        );
        Ok(removed)
    }

    /// The job whose uplink is `port` and job `upper_job` on the upper switch.
    pub(super) fn job_of_uplink(&self, port: PortId, upper_job: u16) -> Option<usize> {
        self.jobs.iter().position(|j| {
            j.cfg
                .uplink
                .is_some_and(|u| u.port == port && u.job == upper_job)
        })
    }
}
