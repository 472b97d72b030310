//! The committed P4 programs through the P4 tools: the v1model program compiles with
//! `p4c-bm2-ss`; the TNA program passes p4c's front and mid end against TNA and T2NA
//! (`p4tools-tna-check`) and, where the Tofino back end is installed, builds for Tofino 1 and 2
//! with it (`p4c-barefoot`, then `bfas`). No package registry has these tools (README.md says where to get
//! them): each test is skipped with the reason where its tool is absent, and required under
//! `INA_REQUIRE_P4=1` (p4c) or `INA_REQUIRE_TOFINO=1` (the TNA tools).
#![allow(clippy::unwrap_used)]

use ina_testkit::{p4_tool, Need, Suite, P4C, P4_PREFIX};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const TNA_CHECK: Need = Need::TofinoTool("p4tools-tna-check");
/// The p4c front and mid end that `p4tools-tna-check` runs: a wrapper without it is no tool.
const P4TEST: Need = Need::TofinoTool("p4test");
/// The Tofino back end (p4c's `backends/tofino`), which places the program on the chip.
const TNA_BUILD: Need = Need::TofinoTool("p4c-barefoot");

fn tna_program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tna/ina.p4")
}

fn assert_ran(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn v1model_compiles_with_p4c_bm2_ss() {
    let p4c = p4_tool("p4c-bm2-ss").unwrap();
    let dir = std::env::temp_dir().join(format!("ina-v1model-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("ina.p4");
    std::fs::write(&src, ina_switch_p4::v1model::program()).unwrap();
    let out = Command::new(&p4c)
        .args([
            "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
        ])
        .arg(dir.join("ina.json"))
        .arg(&src)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_ran("p4c-bm2-ss", &out);
}

fn tna_passes_the_front_and_mid_end() {
    let tool = p4_tool("p4tools-tna-check").unwrap();
    let include = Path::new(P4_PREFIX).join("share/p4c");
    // Tofino 1 and 2 differ in their architecture's widths (Tofino 2's mirror ids are 8 bits).
    for target in ["tofino", "tofino2"] {
        let started = Instant::now();
        let mut cmd = Command::new(&tool);
        cmd.arg(tna_program()).arg(target);
        if std::env::var_os("P4TOOLS_TNA_INCLUDE").is_none() && include.is_dir() {
            cmd.env("P4TOOLS_TNA_INCLUDE", include.join("tna-include"));
            cmd.env("P4C_16_INCLUDE_PATH", include.join("p4include"));
        }
        let out = cmd.output().unwrap();
        eprintln!(
            "p4tools-tna-check {target} took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert_ran(&format!("p4tools-tna-check {target}"), &out);
    }
}

/// The Tofino back end's verdict on the program for Tofino 1 and 2: it must compile, place
/// and assemble. Its PHV summary and, once it places the program, its resources per stage are
/// printed; its errors are in the failure message. `INA_TNA_PROGRAM` names another program to
/// compile the same way (SwitchML's, to compare).
fn tna_builds_with_the_tofino_back_end() {
    let compiler = p4_tool("p4c-barefoot").unwrap();
    let version = Command::new(&compiler).arg("--version").output().unwrap();
    eprintln!(
        "{} {}",
        compiler.display(),
        String::from_utf8_lossy(&[version.stdout, version.stderr].concat()).trim()
    );
    let program = std::env::var_os("INA_TNA_PROGRAM").map_or_else(tna_program, PathBuf::from);
    // Tofino 2 without CLOTs: bfas 9.13.4 stops on the CLOT section the compiler writes for
    // this program ("No length for clot 1", then a crash of the assembler); without them the
    // program still fits Tofino 2's PHV.
    for (target, arch, extra) in [
        ("tofino", "tna", None),
        ("tofino2", "t2na", Some("--no-clot")),
    ] {
        let dir =
            std::env::temp_dir().join(format!("ina-tna-build-{}-{target}", std::process::id()));
        let started = Instant::now();
        let out = Command::new(&compiler)
            .args(["--target", target, "--arch", arch, "-g", "-Tallocate_phv:1"])
            .args(extra)
            .arg("-o")
            .arg(&dir)
            .arg(&program)
            .output()
            .unwrap();
        eprintln!(
            "p4c-barefoot {target} took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let logs = dir.join("pipe/logs");
        eprint!("{}", phv_summary(&logs));
        eprint!("{}", stage_summary(&logs));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
        let assembled = out.status.success() && assemble(target, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "p4c-barefoot {target}:\n{}",
            errors.join("\n")
        );
        assert!(assembled, "bfas {target} failed");
    }
}

/// The PHV allocation's overall line and, where it failed, the bits left without a container,
/// from `phv_allocation_summary_*.log`.
fn phv_summary(logs: &Path) -> String {
    let text = std::fs::read_dir(logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("phv_allocation_summary")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .next()
        .unwrap_or_default();
    let mut out = String::new();
    for prefix in ["| Overall PHV Usage", "..........Unallocated bits"] {
        if let Some(l) = text.lines().find(|l| l.starts_with(prefix)) {
            out.push_str(l.trim());
            out.push('\n');
        }
    }
    out
}

/// Per stage of the placed program (`resources.json`): logical tables, SRAM and TCAM blocks,
/// stateful ALUs, hash distribution units and gateways, and their totals.
fn stage_summary(logs: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(logs.join("resources.json")) else {
        return String::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return String::new();
    };
    let stages = json["resources"]["mau"]["mau_stages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if stages.is_empty() {
        return String::new();
    }
    let count = |s: &serde_json::Value, a: &str, b: &str| s[a][b].as_array().map_or(0, Vec::len);
    let columns = [
        ("tables", "logical_tables", "ids"),
        ("SRAM", "rams", "srams"),
        ("TCAM", "tcams", "tcams"),
        ("SALU", "meter_alus", "meters"),
        ("hash", "hash_distribution_units", "units"),
        ("gateways", "gateways", "gateways"),
    ];
    let mut out = String::from("stage");
    for (name, _, _) in columns {
        out.push_str(&format!(" {name:>8}"));
    }
    out.push('\n');
    let mut totals = [0; 6];
    for s in &stages {
        out.push_str(&format!("{:>5}", s["stage_number"].as_i64().unwrap_or(-1)));
        for (i, (_, a, b)) in columns.iter().enumerate() {
            let n = count(s, a, b);
            totals[i] += n;
            out.push_str(&format!(" {n:>8}"));
        }
        out.push('\n');
    }
    out.push_str("  all");
    for t in totals {
        out.push_str(&format!(" {t:>8}"));
    }
    out.push('\n');
    out
}

/// Runs the Tofino assembler on the `.bfa` files under `dir`, where it is installed.
fn assemble(target: &str, dir: &Path) -> bool {
    let Some(bfas) = p4_tool("bfas") else {
        eprintln!("bfas is not installed: the program was compiled, not assembled");
        return true;
    };
    let mut bfa = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "bfa") {
                bfa.push(p);
            }
        }
    }
    !bfa.is_empty()
        && bfa.iter().all(|f| {
            let out_dir = f.parent().unwrap_or(dir);
            Command::new(&bfas)
                .args(["--no-warn", "--target", target, "-o"])
                .arg(out_dir)
                .arg(f)
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .test(
            "v1model_compiles_with_p4c_bm2_ss",
            &[P4C],
            v1model_compiles_with_p4c_bm2_ss,
        )
        .test(
            "tna_passes_the_front_and_mid_end",
            &[TNA_CHECK, P4TEST],
            tna_passes_the_front_and_mid_end,
        )
        .test(
            "tna_builds_with_the_tofino_back_end",
            &[TNA_BUILD],
            tna_builds_with_the_tofino_back_end,
        )
        .run()
}
