//! The harness of ina's test suites that need what a machine may lack: root, a network tool
//! (`ip`, `tc`, `nft`, `tshark`), the P4 tools (p4c, bmv2) or DPDK.
//!
//! A suite built on it (`harness = false`) declares each test's needs up front. A test whose
//! needs are met runs as under libtest. One whose needs are not met is reported as *ignored*,
//! with the reason in its line (`test [skipped: needs root] name ... ignored`) and counted in
//! the summary, so that a machine that cannot run it never shows it as passed. Where the
//! environment says a need is required (`INA_REQUIRE_PRIVILEGED=1` for root and system tools,
//! `INA_REQUIRE_P4=1` for p4c and bmv2, `INA_REQUIRE_TOFINO=1` for the Tofino tools,
//! `INA_REQUIRE_PYTHON=1` for the Python package's suites), the unmet
//! need fails the test instead.
//!
//! This crate only decides and reports; it must not install anything or change the machine.

use libtest_mimic::{Arguments, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The variable that makes root and system tools required (CI sets it).
pub const REQUIRE_PRIVILEGED: &str = "INA_REQUIRE_PRIVILEGED";
/// The variable that makes the P4 tools required (a machine that has them sets it).
pub const REQUIRE_P4: &str = "INA_REQUIRE_P4";
/// The variable that makes the Tofino tools required.
pub const REQUIRE_TOFINO: &str = "INA_REQUIRE_TOFINO";
/// The variable that makes the Python suites required (their interpreter, the `ina` package,
/// pytest, NumPy, torch), as `.ci/run` sets it after installing them.
pub const REQUIRE_PYTHON: &str = "INA_REQUIRE_PYTHON";
/// Where the P4 tools may be installed besides the `PATH`.
pub const P4_PREFIX: &str = "/opt/ina-p4tools";

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Effective user id 0: network namespaces, raw sockets, `tc`.
    Root,
    /// A kernel that gives a thread a network namespace of its own (and the right to ask).
    NetNamespaces,
    /// A system program on the `PATH`, and the Debian package that brings it.
    Tool {
        /// The program's name.
        program: &'static str,
        /// The Debian package that installs it.
        package: &'static str,
    },
    /// A P4 tool (p4c, bmv2), on the `PATH` or under [`P4_PREFIX`]`/bin`. No package registry
    /// has them: README.md says where to get them.
    P4Tool(&'static str),
    /// A tool of the Tofino toolchain (the TNA front end, the Tofino back end), found as
    /// [`Need::P4Tool`]; required only under `INA_REQUIRE_TOFINO=1`.
    TofinoTool(&'static str),
}

/// iproute2's `ip`.
pub const IP: Need = Need::Tool {
    program: "ip",
    package: "iproute2",
};
/// iproute2's `tc`.
pub const TC: Need = Need::Tool {
    program: "tc",
    package: "iproute2",
};
/// nftables' `nft` (the testbed's link loss).
pub const NFT: Need = Need::Tool {
    program: "nft",
    package: "nftables",
};
/// Wireshark's command-line `tshark`.
pub const TSHARK: Need = Need::Tool {
    program: "tshark",
    package: "tshark",
};
/// What an emulated rack needs: root, network namespaces, `ip` and `tc`.
pub const RACK: &[Need] = &[Need::Root, Need::NetNamespaces, IP, TC];
/// What an emulated rack with link loss needs.
pub const LOSSY_RACK: &[Need] = &[Need::Root, Need::NetNamespaces, IP, TC, NFT];
/// p4c's compiler for bmv2.
pub const P4C: Need = Need::P4Tool("p4c-bm2-ss");
/// bmv2's switch.
pub const SIMPLE_SWITCH: Need = Need::P4Tool("simple_switch");
/// bmv2's runtime CLI.
pub const SIMPLE_SWITCH_CLI: Need = Need::P4Tool("simple_switch_CLI");
/// Everything a bmv2 run needs besides a rack.
pub const BMV2: &[Need] = &[P4C, SIMPLE_SWITCH, SIMPLE_SWITCH_CLI];
/// A network namespace of the test's own: root, the kernel's namespaces, `ip`.
pub const NAMESPACE: &[Need] = &[Need::Root, Need::NetNamespaces, IP];
/// bmv2 in a namespace of its own (the conformance target).
pub const BMV2_NAMESPACE: &[Need] = &[
    Need::Root,
    Need::NetNamespaces,
    IP,
    P4C,
    SIMPLE_SWITCH,
    SIMPLE_SWITCH_CLI,
];
/// bmv2 as the hub of an emulated rack.
pub const BMV2_RACK: &[Need] = &[
    Need::Root,
    Need::NetNamespaces,
    IP,
    TC,
    P4C,
    SIMPLE_SWITCH,
    SIMPLE_SWITCH_CLI,
];

impl Need {
    /// Why the need is not met on this machine, or `None` if it is.
    pub fn unmet(&self) -> Option<String> {
        match *self {
            Need::Root => (!is_root()).then(|| "needs root".to_string()),
            Need::NetNamespaces => net_namespaces()
                .err()
                .map(|e| format!("needs network namespaces ({e})")),
            Need::Tool { program, package } => on_path(program)
                .is_none()
                .then(|| format!("needs {program} (apt-get install {package})")),
            Need::P4Tool(program) => p4_tool(program)
                .is_none()
                .then(|| format!("needs {program} (the P4 tools: see README.md)")),
            Need::TofinoTool(program) => p4_tool(program)
                .is_none()
                .then(|| format!("needs {program} (the Tofino tools: see README.md)")),
        }
    }

    /// The variable that turns this need, when unmet, into a failure.
    pub fn required_by(&self) -> &'static str {
        match self {
            Need::Root | Need::NetNamespaces | Need::Tool { .. } => REQUIRE_PRIVILEGED,
            Need::P4Tool(_) => REQUIRE_P4,
            Need::TofinoTool(_) => REQUIRE_TOFINO,
        }
    }
}

/// Whether `var` is set to `1`.
pub fn env_flag(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| v == "1")
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// Whether a thread can enter a new network namespace: tried on a thread of its own, which
/// then ends, so the caller's namespace is untouched.
pub fn net_namespaces() -> std::io::Result<()> {
    std::thread::spawn(|| {
        // SAFETY: unshare affects only this short-lived thread, which does nothing else.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the probing thread panicked")))
}

/// `program`'s path on the `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// A P4 tool's path: on the `PATH`, else under [`P4_PREFIX`]`/bin`.
pub fn p4_tool(program: &str) -> Option<PathBuf> {
    on_path(program).or_else(|| {
        let p = Path::new(P4_PREFIX).join("bin").join(program);
        is_executable(&p).then_some(p)
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first unmet need's reason and whether the environment requires it.
fn verdict(needs: &[Need]) -> Option<(String, Option<&'static str>)> {
    needs.iter().find_map(|n| {
        n.unmet().map(|why| {
            let var = n.required_by();
            (why, env_flag(var).then_some(var))
        })
    })
}

/// A suite of trials, each with its needs.
#[derive(Default)]
pub struct Suite {
    trials: Vec<Trial>,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("trials", &self.trials.len())
            .finish()
    }
}

impl Suite {
    /// An empty suite.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a test that needs `needs`; it passes unless `run` panics.
    pub fn test(self, name: &str, needs: &[Need], run: impl FnOnce() + Send + 'static) -> Self {
        self.test_with_reason(name, verdict(needs), run)
    }

    /// Adds a test that is skipped for `reason` when it is `Some` (a condition the caller
    /// checked itself), required under `required_by`.
    pub fn test_unless(
        self,
        name: &str,
        skip: Option<String>,
        required_by: &'static str,
        run: impl FnOnce() + Send + 'static,
    ) -> Self {
        let verdict = skip.map(|why| (why, env_flag(required_by).then_some(required_by)));
        self.test_with_reason(name, verdict, run)
    }

    fn test_with_reason(
        mut self,
        name: &str,
        verdict: Option<(String, Option<&'static str>)>,
        run: impl FnOnce() + Send + 'static,
    ) -> Self {
        let trial = match verdict {
            None => Trial::test(name, move || {
                run();
                Ok(())
            }),
            Some((why, Some(var))) => Trial::test(name, move || {
                Err(Failed::from(format!("{var}=1, but this test {why}")))
            }),
            Some((why, None)) => {
                let reason = why.clone();
                Trial::test(name, move || {
                    Err(Failed::from(format!("cannot run here: it {reason}")))
                })
                .with_ignored_flag(true)
                .with_kind(format!("skipped: {why}"))
            }
        };
        self.trials.push(trial);
        self
    }

    /// Runs the trials the command line selects and returns the process's exit code.
    pub fn run(self) -> ExitCode {
        let args = Arguments::from_args();
        libtest_mimic::run(&args, self.trials).exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_is_unmet_with_its_package() {
        let need = Need::Tool {
            program: "ina-no-such-program-anywhere",
            package: "ina-nothing",
        };
        let why = need.unmet().expect("no such program");
        assert!(why.contains("apt-get install ina-nothing"), "{why}");
        assert_eq!(need.required_by(), REQUIRE_PRIVILEGED);
    }

    #[test]
    fn a_present_tool_is_met() {
        // `sh` is on every machine that can run cargo's build scripts.
        let need = Need::Tool {
            program: "sh",
            package: "dash",
        };
        assert_eq!(need.unmet(), None);
    }

    #[test]
    fn p4_tools_answer_to_their_own_variable() {
        assert_eq!(Need::P4Tool("p4c-bm2-ss").required_by(), REQUIRE_P4);
        let why = Need::P4Tool("ina-no-such-p4-tool").unmet().expect("absent");
        assert!(why.contains("README"), "{why}");
    }

    #[test]
    fn without_root_there_are_no_network_namespaces() {
        if !is_root() {
            assert!(Need::NetNamespaces.unmet().is_some());
        } else {
            // Root may still lack them (a container without CAP_SYS_ADMIN): the probe says which.
            assert_eq!(
                Need::NetNamespaces.unmet().is_none(),
                net_namespaces().is_ok()
            );
        }
    }

    #[test]
    fn root_is_unmet_exactly_when_not_root() {
        assert_eq!(Need::Root.unmet().is_none(), is_root());
    }
}
