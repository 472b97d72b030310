//! `ina bench --testbed --sweep-density 0.01,0.05,0.1,0.25,0.5,1`: one bench run per density of
//! sparse tensors (`--shape`), each on a testbed of its own; prints the table of times against
//! density (ina dense and sparse, the ring, the sparse all-gather), `--json` gets every run's
//! report and `--plot` an SVG of time against density.
//!
//! The sparse target: `max(u × dense time, floor)`, `u` the union density (the fraction of
//! blocks some worker held) and `floor` the time of the support stream at the dense run's rate
//! (one int32 per block: 1/elems of the tensor), all it must send besides the union.

use super::{run_one, Algorithm, BenchArgs, BenchReport};
use anyhow::{bail, Context};
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// One density and its run.
#[derive(Debug, Serialize)]
struct Point {
    density: f64,
    report: BenchReport,
}

/// The median time of `algo` in a report.
fn time(r: &BenchReport, algo: Algorithm) -> Option<f64> {
    r.results
        .iter()
        .find(|x| x.algorithm == algo)
        .map(|x| x.median_s)
}

/// The union density a report's sparse all-reduce found.
fn union_density(r: &BenchReport) -> Option<f64> {
    r.results
        .iter()
        .find(|x| x.algorithm == Algorithm::InaSparse)
        .and_then(|x| x.union_density)
}

/// The sparse target of a report (see the module's doc).
fn target(r: &BenchReport, elems: u16) -> Option<f64> {
    let dense = time(r, Algorithm::Ina)?;
    let u = union_density(r)?;
    Some((u * dense).max(dense / f64::from(elems.max(1))))
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.testbed {
        bail!("--sweep-density runs on the testbed: add --testbed (or a --scenario)");
    }
    if args.sweep_density.iter().any(|d| !(*d > 0.0 && *d <= 1.0)) {
        bail!("--sweep-density takes fractions of the blocks in (0, 1]");
    }
    let mut points = Vec::new();
    for &d in &args.sweep_density {
        println!("\n== density {d}");
        let mut a = args.clone();
        a.json = None;
        a.plot = None;
        a.sweep_density.clear();
        a.scenario = None;
        a.density = Some(d);
        let report = run_one(a).with_context(|| format!("the run at density {d}"))?;
        points.push(Point { density: d, report });
    }
    let elems = if args.elems > 0 {
        args.elems
    } else {
        super::default_elems(&args)
    };
    print_table(&points, elems);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&points)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot(path, &points, elems, &args)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

fn cell(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.3}"))
}

fn print_table(points: &[Point], elems: u16) {
    println!(
        "\n{:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>13} {:>13} {:>13}",
        "density",
        "union",
        "dense s",
        "sparse s",
        "ring s",
        "AGsparse s",
        "sparse/dense",
        "sparse/target",
        "ring/sparse"
    );
    for p in points {
        let r = &p.report;
        let (dense, sparse, ring, ag) = (
            time(r, Algorithm::Ina),
            time(r, Algorithm::InaSparse),
            time(r, Algorithm::Ring),
            time(r, Algorithm::Agsparse),
        );
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        println!(
            "{:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>13} {:>13} {:>13}",
            format!("{:.0}%", p.density * 100.0),
            union_density(r).map_or("-".into(), |u| format!("{:.1}%", u * 100.0)),
            cell(dense),
            cell(sparse),
            cell(ring),
            cell(ag),
            cell(ratio(sparse, dense)),
            cell(ratio(sparse, target(r, elems))),
            cell(ratio(ring, sparse)),
        );
    }
}

/// A line of the plot: its name, colour, points, and whether it is dashed.
type Line = (String, RGBColor, Vec<(f64, f64)>, bool);

fn plot(path: &Path, points: &[Point], elems: u16, args: &BenchArgs) -> anyhow::Result<()> {
    let series = |f: &dyn Fn(&BenchReport) -> Option<f64>| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|p| Some((p.density * 100.0, f(&p.report)?)))
            .collect()
    };
    let lines: Vec<Line> = vec![
        (
            "ina dense".into(),
            RED,
            series(&|r| time(r, Algorithm::Ina)),
            false,
        ),
        (
            "ina sparse".into(),
            MAGENTA,
            series(&|r| time(r, Algorithm::InaSparse)),
            false,
        ),
        (
            "ring".into(),
            BLUE,
            series(&|r| time(r, Algorithm::Ring)),
            false,
        ),
        (
            "sparse all-gather".into(),
            GREEN,
            series(&|r| time(r, Algorithm::Agsparse)),
            false,
        ),
        (
            "sparse target × 1.1".into(),
            BLACK,
            series(&|r| target(r, elems).map(|t| t * 1.1)),
            true,
        ),
    ];
    let y_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (760, 460)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} MiB all-reduce, {} workers, {:?} blocks: time against density",
                args.size >> 20,
                args.workers,
                args.shape
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..105.0, 0.0..y_max.max(1e-3))
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("blocks each worker holds, %")
        .y_desc("seconds (median)")
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    for (name, color, data, dashed) in lines {
        if data.is_empty() {
            continue;
        }
        let legend = move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 20, y)], color);
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(data, 6, 4, color.mix(0.7).into()))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?
                .label(name)
                .legend(legend);
        } else {
            chart
                .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?
                .label(name)
                .legend(legend);
            chart
                .draw_series(data.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present()
        .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}
