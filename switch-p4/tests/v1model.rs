//! The committed v1model program is the generated one (`tests/p4c.rs` compiles it).

use std::path::{Path, PathBuf};

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
