//! The Rust frame model (`ina_proto::l2`) as a target.

use crate::scenario::Counts;
use crate::{Target, TargetError};
use ina_proto::l2::{FrameSwitch, Outputs};
use ina_proto::Instant;
use ina_switch_p4::runtime::{validate_for, P4Job, SwitchDesc, FRAME_MODEL};
use std::time::Duration;

/// The frame model: frames are processed when sent, and their outputs held until collected.
#[derive(Debug, Default)]
pub struct ModelTarget {
    switch: Option<FrameSwitch>,
    out: Outputs,
    queued: Vec<(u16, Vec<u8>)>,
    now: u64,
}

impl ModelTarget {
    /// A target with no switch until configured.
    pub fn new() -> ModelTarget {
        ModelTarget::default()
    }
}

impl Target for ModelTarget {
    fn name(&self) -> String {
        "model (proto::l2)".into()
    }

    fn configure(&mut self, switch: &SwitchDesc, jobs: &[P4Job]) -> Result<(), TargetError> {
        validate_for(&FRAME_MODEL, switch, jobs).map_err(|e| TargetError::Setup(e.to_string()))?;
        let mut sw = FrameSwitch::new(switch.frame_switch())
            .map_err(|e| TargetError::Setup(e.to_string()))?;
        for j in jobs {
            sw.add_job(j.frame_job())
                .map_err(|e| TargetError::Setup(e.to_string()))?;
        }
        self.switch = Some(sw);
        self.queued.clear();
        Ok(())
    }

    fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError> {
        let sw = self
            .switch
            .as_mut()
            .ok_or_else(|| TargetError::Setup("not configured".into()))?;
        self.now += 1_000;
        sw.process(port, frame, Instant::from_nanos(self.now), &mut self.out);
        self.queued
            .extend(self.out.iter().map(|(p, f)| (p, f.to_vec())));
        Ok(())
    }

    fn collect(
        &mut self,
        _expected: usize,
        _timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError> {
        Ok(std::mem::take(&mut self.queued))
    }

    fn counters(&mut self) -> Result<Counts, TargetError> {
        let sw = self
            .switch
            .as_ref()
            .ok_or_else(|| TargetError::Setup("not configured".into()))?;
        Ok(Counts {
            events: *sw.events(),
            multicast: sw.results_multicast(),
            missing: crate::missing_counts(sw.pipeline().counters()),
        })
    }
}
