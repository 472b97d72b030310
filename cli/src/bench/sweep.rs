//! `ina bench --testbed --sweep-workers 2,4,8` / `--sweep-link-loss 0,0.001,0.01`: one bench
//! run per value, each on a testbed of its own; `--json` gets every run's report, `--plot` an
//! SVG of the goodput of ina and the ring against the swept value, each with the goodput its
//! links' bound allows drawn as a dashed line.

use super::{run_one, Algorithm, BenchArgs, BenchReport};
use anyhow::{bail, Context};
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// Whether `args` asks for a sweep.
pub(crate) fn requested(args: &BenchArgs) -> bool {
    !args.sweep_workers.is_empty() || !args.sweep_link_loss.is_empty()
}

/// One swept value and its run.
#[derive(Debug, Serialize)]
struct Point {
    value: f64,
    report: BenchReport,
}

/// What `--json` gets for a sweep.
#[derive(Debug, Serialize)]
struct SweepReport {
    workers: Vec<Point>,
    link_loss: Vec<Point>,
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.testbed {
        bail!("--sweep-workers and --sweep-link-loss run on the testbed: add --testbed (or a --scenario)");
    }
    let one = |configure: &dyn Fn(&mut BenchArgs)| -> anyhow::Result<BenchReport> {
        let mut a = args.clone();
        a.json = None;
        a.plot = None;
        a.sweep_workers.clear();
        a.sweep_link_loss.clear();
        a.scenario = None;
        configure(&mut a);
        run_one(a)
    };
    let mut report = SweepReport {
        workers: Vec::new(),
        link_loss: Vec::new(),
    };
    for &n in &args.sweep_workers {
        println!("\n== {n} workers");
        let r = one(&|a| a.workers = n).with_context(|| format!("the run with {n} workers"))?;
        report.workers.push(Point {
            value: n as f64,
            report: r,
        });
    }
    for &p in &args.sweep_link_loss {
        println!("\n== link loss {p}");
        let r = one(&|a| a.links.link_loss = p)
            .with_context(|| format!("the run with link loss {p}"))?;
        report.link_loss.push(Point {
            value: p,
            report: r,
        });
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot(path, &report)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// Goodput in Gbit/s of `algo` in a report, measured and at its bound.
fn goodput(r: &BenchReport, algo: Algorithm) -> (Option<f64>, Option<f64>) {
    let Some(x) = r.results.iter().find(|x| x.algorithm == algo) else {
        return (None, None);
    };
    let bits = x.bytes as f64 * 8.0;
    (
        Some(x.goodput_gbit_per_s),
        x.bound_s.map(|b| bits / b / 1e9),
    )
}

/// One panel: goodput against the swept value.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    points: &[Point],
    x_desc: &str,
) -> anyhow::Result<()> {
    let series = |algo, bound: bool| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|p| {
                let (m, b) = goodput(&p.report, algo);
                Some((p.value, if bound { b? } else { m? }))
            })
            .collect()
    };
    let all: Vec<(f64, f64)> = [
        series(Algorithm::Ina, false),
        series(Algorithm::Ina, true),
        series(Algorithm::Ring, false),
        series(Algorithm::Ring, true),
    ]
    .concat();
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max);
    let x_min = all.iter().map(|p| p.0).fold(x_max, f64::min);
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let pad = ((x_max - x_min) * 0.05).max(1e-4);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("goodput against {x_desc}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(x_min - pad..x_max + pad, 0.0..y_max.max(1e-3))
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("goodput, Gbit/s")
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    for (algo, name, color) in [
        (Algorithm::Ina, "ina", RED),
        (Algorithm::Ring, "ring", BLUE),
    ] {
        let measured = series(algo, false);
        chart
            .draw_series(LineSeries::new(measured.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(measured.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let bound = series(algo, true);
        if !bound.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(bound, 6, 4, color.mix(0.6).into()))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?
                .label(format!("{name}: links' bound"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.6)));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}

fn plot(path: &Path, r: &SweepReport) -> anyhow::Result<()> {
    let panels: Vec<(&[Point], &str)> = [
        (&r.workers[..], "workers"),
        (&r.link_loss[..], "loss per link direction"),
    ]
    .into_iter()
    .filter(|(p, _)| !p.is_empty())
    .collect();
    let root = SVGBackend::new(path, (720, 420 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let areas = root.split_evenly((panels.len(), 1));
    for (area, (points, x_desc)) in areas.iter().zip(panels) {
        panel(area, points, x_desc)?;
    }
    root.present()
        .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}
