//! Every scenario of `tests/scenarios` against every target this machine can run.

use ina_conformance::bmv2::Bmv2Target;
use ina_conformance::l2switch::L2SwitchTarget;
use ina_conformance::model::ModelTarget;
use ina_conformance::{all_scenarios, run_all, Target};
use std::time::Instant;

fn report(target: &dyn Target, failed: &[(String, String)], total: usize) {
    if failed.is_empty() {
        return;
    }
    let mut text = format!(
        "{}: {} of {total} scenarios failed\n",
        target.name(),
        failed.len()
    );
    for (name, r) in failed {
        text.push_str(&format!("\n=== {name}\n{r}"));
    }
    panic!("{text}");
}

fn scenarios_expand() {
    let s = all_scenarios().expect("scenarios load");
    assert!(s.len() >= 20, "only {} scenarios", s.len());
    for sc in &s {
        assert!(!sc.steps.is_empty(), "{} has no steps", sc.name);
    }
}

fn model_conforms() {
    let scenarios = all_scenarios().expect("scenarios load");
    let mut t = ModelTarget::new();
    let failed = run_all(&mut t, &scenarios);
    report(&t, &failed, scenarios.len());
}

fn bmv2_conforms() {
    let mut scenarios = all_scenarios().expect("scenarios load");
    if let Ok(filter) = std::env::var("INA_SCENARIO") {
        scenarios.retain(|s| s.name.contains(&filter));
    }
    let start = Instant::now();
    let mut t = Bmv2Target::new(8).expect("bmv2 target");
    let frames: usize = scenarios.iter().map(|s| s.steps.len()).sum();
    let failed = run_all(&mut t, &scenarios);
    eprintln!(
        "bmv2: {} scenarios, {frames} frames sent, {:.1} s in all ({:.1} s starting and configuring switches)",
        scenarios.len(),
        start.elapsed().as_secs_f64(),
        t.setup_time.as_secs_f64()
    );
    report(&t, &failed, scenarios.len());
}

fn l2_switch_conforms() {
    let mut scenarios = all_scenarios().expect("scenarios load");
    if let Ok(filter) = std::env::var("INA_SCENARIO") {
        scenarios.retain(|s| s.name.contains(&filter));
    }
    let start = Instant::now();
    let mut t = L2SwitchTarget::new(8).expect("L2 switch target");
    let failed = run_all(&mut t, &scenarios);
    eprintln!(
        "l2: {} scenarios in {:.1} s",
        scenarios.len(),
        start.elapsed().as_secs_f64()
    );
    report(&t, &failed, scenarios.len());
}

fn main() -> std::process::ExitCode {
    ina_testkit::Suite::new()
        .test("scenarios_expand", &[], scenarios_expand)
        .test("model_conforms", &[], model_conforms)
        .test("bmv2_conforms", ina_testkit::BMV2_NAMESPACE, bmv2_conforms)
        .test(
            "l2_switch_conforms",
            ina_testkit::NAMESPACE,
            l2_switch_conforms,
        )
        .run()
}
