//! The committed v1model program is the generated one, and it compiles with p4c-bm2-ss.

use std::path::{Path, PathBuf};
use std::process::Command;

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(ina_switch_p4::v1model::COMMITTED_PATH)
}

#[test]
fn committed_program_is_current() {
    let text = ina_switch_p4::v1model::program();
    let path = committed();
    if std::env::var_os("INA_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write the program");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} is stale: regenerate it with INA_BLESS=1 cargo test -p ina-switch-p4",
        path.display()
    );
}

/// The P4 compiler for bmv2, if installed: on the PATH or in the toolchain bundle.
fn p4c() -> Option<PathBuf> {
    let bundle = Path::new("/opt/ina-p4tools/bin/p4c-bm2-ss");
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let c = dir.join("p4c-bm2-ss");
            if c.is_file() {
                return Some(c);
            }
        }
    }
    bundle.is_file().then(|| bundle.to_path_buf())
}

#[test]
fn program_compiles_for_bmv2() {
    let Some(p4c) = p4c() else {
        let msg = "p4c-bm2-ss not found (install the P4 toolchain: see README.md)";
        if std::env::var("INA_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("{msg}");
        }
        eprintln!("skipped: {msg}");
        return;
    };
    let dir = std::env::temp_dir().join(format!("ina-v1model-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("ina.p4");
    std::fs::write(&src, ina_switch_p4::v1model::program()).expect("write program");
    let out = Command::new(&p4c)
        .args([
            "--std", "p4-16", "--target", "bmv2", "--arch", "v1model", "-o",
        ])
        .arg(dir.join("ina.json"))
        .arg(&src)
        .output()
        .expect("run p4c-bm2-ss");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "p4c-bm2-ss failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
