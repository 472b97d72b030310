//! The L2 software switch (`ina switch --ports`: `ina_switch::frames::FramesSwitch` on raw
//! Ethernet ports) as a target: it runs on a thread inside a [`TestNet`], serving the `swP`
//! interfaces, one fresh switch per configuration.

use crate::netns::{enter_netns, TestNet};
use crate::scenario::Counts;
use crate::{Target, TargetError};
use ina_io::packet::RawConfig;
use ina_switch::frames::FramesSwitch;
use ina_switch_p4::runtime::{validate_for, P4Job, SwitchDesc, FRAME_MODEL};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Debug)]
struct Running {
    shutdown: Arc<AtomicBool>,
    handle: JoinHandle<Result<Counts, TargetError>>,
}

impl Running {
    fn stop(self) -> Result<Counts, TargetError> {
        self.shutdown.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .map_err(|_| TargetError::Setup("the switch thread panicked".into()))?
    }
}

/// The L2 software switch in a network namespace of its own.
#[derive(Debug)]
pub struct L2SwitchTarget {
    // (Dropped after the switch: see Drop.)
    net: TestNet,
    running: Option<Running>,
}

impl L2SwitchTarget {
    /// Sets up the namespace with ports `0..ports`.
    pub fn new(ports: u16) -> Result<L2SwitchTarget, TargetError> {
        Ok(L2SwitchTarget {
            net: TestNet::new(ports, Duration::from_millis(15))?,
            running: None,
        })
    }
}

impl Drop for L2SwitchTarget {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop();
        }
    }
}

impl Target for L2SwitchTarget {
    fn name(&self) -> String {
        "l2 (ina switch --ports)".into()
    }

    fn configure(&mut self, switch: &SwitchDesc, jobs: &[P4Job]) -> Result<(), TargetError> {
        if let Some(r) = self.running.take() {
            r.stop()?;
        }
        validate_for(&FRAME_MODEL, switch, jobs).map_err(|e| TargetError::Setup(e.to_string()))?;
        // The L2 switch numbers its ports by position.
        if switch
            .ports
            .iter()
            .enumerate()
            .any(|(i, p)| usize::from(*p) != i)
        {
            return Err(TargetError::Setup(format!(
                "the L2 switch's ports are 0..n, not {:?}",
                switch.ports
            )));
        }
        if let Some(p) = switch.ports.iter().find(|p| !self.net.has_port(**p)) {
            return Err(TargetError::Setup(format!("port {p} has no veth pair")));
        }
        let ifnames: Vec<String> = switch.ports.iter().map(|p| format!("sw{p}")).collect();
        let cfg = switch.frame_switch();
        let frame_jobs: Vec<_> = jobs.iter().map(P4Job::frame_job).collect();
        let ns = self.net.ns().to_string();
        let shutdown = Arc::new(AtomicBool::new(false));
        let stop = shutdown.clone();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let handle = std::thread::spawn(move || {
            let opened = enter_netns(&ns).map_err(TargetError::from).and_then(|()| {
                FramesSwitch::open(&ifnames, cfg, frame_jobs, RawConfig::default())
                    .map_err(|e| TargetError::Setup(e.to_string()))
            });
            let mut sw = match opened {
                Ok(sw) => sw,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            sw.run(&stop, None)
                .map_err(|e| TargetError::Setup(e.to_string()))?;
            let fs = sw.frame_switch();
            Ok(Counts {
                events: *fs.events(),
                multicast: fs.results_multicast(),
                missing: crate::missing_counts(fs.pipeline().counters()),
            })
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| TargetError::Setup("the L2 switch did not start".into()))?;
        self.running = Some(Running { shutdown, handle });
        ready.map_err(TargetError::Setup)?;
        self.net.drain();
        Ok(())
    }

    fn send(&mut self, port: u16, frame: &[u8]) -> Result<(), TargetError> {
        self.net.send(port, frame)
    }

    fn collect(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(u16, Vec<u8>)>, TargetError> {
        self.net.collect(expected, timeout)
    }

    /// Stops the switch (its counters are final): the scenario is over.
    fn counters(&mut self) -> Result<Counts, TargetError> {
        match self.running.take() {
            Some(r) => r.stop(),
            None => Err(TargetError::Setup("not running".into())),
        }
    }
}
