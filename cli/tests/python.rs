//! The Python package's suites (pytest, `python/tests`), run against this build's `ina`
//! binary: the NumPy API, PyTorch (the DDP hook, the backend, torchrun), and CUDA staging.
//!
//! The interpreter is `$INA_PYTHON`, else the virtual environment `.ci/run` makes
//! (`~/.cache/ina/venv`), else `python3`. A suite whose interpreter lacks what it needs (the
//! `ina` package from `pip install ./python`, pytest, NumPy, torch, a GPU) is reported skipped
//! with the reason; under `INA_REQUIRE_PYTHON=1` that is a failure. The installed package is
//! what runs: reinstall it after changing `python/` (`pip install ./python`).

use ina_testkit::{Suite, REQUIRE_PYTHON};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_ina");

/// The suites share two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

fn interpreter() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("INA_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/ina/venv/bin/python"))
        .filter(|p| p.exists());
    venv.or_else(|| ina_testkit::on_path("python3"))
}

/// Why `python` cannot run a suite that imports `modules`, if it cannot.
fn lacks(python: &Path, modules: &[(&str, &str)]) -> Option<String> {
    for (module, install) in modules {
        let ok = Command::new(python)
            .args(["-c", &format!("import {module}")])
            .current_dir(std::env::temp_dir())
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!(
                "needs the Python module {module} in {} ({install})",
                python.display()
            ));
        }
    }
    None
}

/// Runs pytest on `args` (files and options under python/tests); fails on any failure, and on
/// any test pytest skipped (a skip must show here, not inside a passing suite).
fn pytest(python: &Path, args: &[&str]) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(python)
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .args(args)
        .current_dir(repo())
        .env("INA_BIN", BIN)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pytest {args:?} failed:\n{stdout}\n{stderr}"
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        !summary.contains("skipped"),
        "pytest {args:?} skipped tests:\n{stdout}"
    );
    println!("pytest {args:?}: {summary}");
}

fn main() -> std::process::ExitCode {
    let python = interpreter();
    let base: &[(&str, &str)] = &[
        ("ina", "pip install ./python"),
        ("pytest", "pip install pytest"),
        ("numpy", "pip install numpy"),
    ];
    let torch: &[(&str, &str)] = &[("torch", "pip install torch")];
    let (numpy_skip, torch_skip, cuda_skip) = match &python {
        None => {
            let why = "needs python3 (apt-get install python3 python3-venv)".to_string();
            (Some(why.clone()), Some(why.clone()), Some(why))
        }
        Some(py) => {
            let numpy_skip = lacks(py, base);
            let torch_skip = numpy_skip.clone().or_else(|| lacks(py, torch));
            let cuda_skip = torch_skip.clone().or_else(|| {
                let gpu = Command::new(py)
                    .args([
                        "-c",
                        "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
                    ])
                    .current_dir(std::env::temp_dir())
                    .output()
                    .is_ok_and(|o| o.status.success());
                (!gpu).then(|| "needs a CUDA GPU (torch.cuda.is_available())".to_string())
            });
            (numpy_skip, torch_skip, cuda_skip)
        }
    };
    let py = python.unwrap_or_default();
    let (p1, p2, p3) = (py.clone(), py.clone(), py);
    Suite::new()
        .test_unless("numpy_api", numpy_skip, REQUIRE_PYTHON, move || {
            pytest(&p1, &["python/tests/test_numpy.py"])
        })
        .test_unless(
            "torch_hook_backend_torchrun",
            torch_skip,
            REQUIRE_PYTHON,
            move || pytest(&p2, &["python/tests/test_torch.py"]),
        )
        // No GPU is no failure, even where the Python suites are required.
        .test_unless(
            "torch_cuda_staging",
            cuda_skip,
            "INA_REQUIRE_GPU",
            move || pytest(&p3, &["python/tests/test_cuda.py"]),
        )
        .run()
}
