//! `ina sim --cluster N`: the slot-sharing experiment (docs/CONTROLLER.md, "Policy
//! experiment"): streams of N jobs sharing one switch's pool under each of the controller's
//! policies and the baselines, at one load or several, with a plot of completion times
//! against load.

use crate::cmd_sim::SimArgs;
use anyhow::bail;
use ina_proto::alloc::Policy;
use ina_sim::cluster::{self, ClusterConfig, Scheme};
use plotters::prelude::*;
use std::path::Path;

/// Every scheme the experiment compares, in the order of its tables.
const SCHEMES: [Scheme; 10] = [
    Scheme::StaticPartitions(4),
    Scheme::StaticPartitions(16),
    Scheme::BestEffortHash,
    Scheme::Controller(Policy::FirstFit),
    Scheme::Controller(Policy::FairShare),
    Scheme::Controller(Policy::Priority),
    Scheme::LeastAttained,
    Scheme::FinishTimeFairness,
    Scheme::Spilling(Policy::FairShare),
    Scheme::Spilling(Policy::Priority),
];

/// One scheme at one load: completion times in seconds, means over the seeds.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    load: f64,
    scheme: String,
    mean_s: f64,
    p50_s: f64,
    p99_s: f64,
}

pub fn run(args: &SimArgs, n: usize) -> anyhow::Result<()> {
    let loads = &args.cluster_load;
    if n == 0 || loads.is_empty() || loads.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
        bail!("--cluster needs at least one job and positive --cluster-load values");
    }
    let cfg = ClusterConfig {
        pool: args.cluster_pool,
        link_gbps: args.gbps,
        host_gbps: args.cluster_host_gbps,
    };
    if ina_proto::alloc::usable(cfg.pool) < 2048 {
        bail!("--cluster-pool must hold at least 2048 slots (the largest window of the workload)");
    }
    if args.plot.is_some() && loads.len() < 2 {
        bail!("--plot with --cluster draws completion time against load: give --cluster-load at least two loads (0.5,1,1.5)");
    }
    let mut rows = Vec::new();
    for &load in loads {
        println!(
            "{n} jobs per stream, load {load:.2}, pool {} slots, {} Gbit/s links, host fallback {} Gbit/s, seeds {}..{}",
            cfg.pool,
            cfg.link_gbps,
            cfg.host_gbps,
            args.seed,
            args.seed + args.seeds - 1
        );
        println!(
            "{:<40} {:>10} {:>10} {:>10} {:>12}",
            "scheme", "mean s", "p50 s", "p99 s", "mean / static"
        );
        let mut base = None;
        for scheme in SCHEMES {
            let (mut mean, mut p50, mut p99) = (0.0, 0.0, 0.0);
            for seed in args.seed..args.seed + args.seeds {
                let jobs = cluster::workload(seed, n, load, &cfg);
                let r = cluster::run(&cfg, &jobs, scheme);
                mean += r.mean();
                p50 += r.quantile(0.5);
                p99 += r.quantile(0.99);
            }
            let k = args.seeds as f64;
            let row = Row {
                load,
                scheme: scheme.to_string(),
                mean_s: mean / k,
                p50_s: p50 / k,
                p99_s: p99 / k,
            };
            let b = *base.get_or_insert(row.mean_s);
            println!(
                "{:<40} {:>10.2} {:>10.2} {:>10.2} {:>12.3}",
                row.scheme,
                row.mean_s,
                row.p50_s,
                row.p99_s,
                row.mean_s / b
            );
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        plot(path, &rows, n, args.seeds)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// Two panels, mean and p99 completion time (log scale) against load, a line per scheme.
fn plot(path: &Path, rows: &[Row], n: usize, seeds: u64) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1080, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(
            &format!("ina sim --cluster {n}: job completion time against load ({seeds} seeds)"),
            ("sans-serif", 18),
        )
        .map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    let loads: Vec<f64> = rows.iter().map(|r| r.load).collect();
    let (x0, x1) = (
        loads.iter().copied().fold(f64::INFINITY, f64::min),
        loads.iter().copied().fold(0.0, f64::max),
    );
    // One colour per scheme (the array's length makes the compiler count them).
    let palette: [RGBColor; SCHEMES.len()] = [
        RGBColor(120, 120, 120),
        RGBColor(60, 60, 60),
        RGBColor(230, 120, 0),
        RGBColor(90, 160, 220),
        RGBColor(200, 30, 30),
        RGBColor(30, 110, 200),
        RGBColor(120, 60, 170),
        RGBColor(20, 150, 80),
        RGBColor(200, 160, 0),
        RGBColor(0, 0, 0),
    ];
    for (panel, (what, value)) in panels.iter().zip([
        ("mean", (|r: &Row| r.mean_s) as fn(&Row) -> f64),
        ("p99", |r: &Row| r.p99_s),
    ]) {
        let ys: Vec<f64> = rows.iter().map(value).collect();
        let y0 = ys.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3) * 0.8;
        let y1 = ys.iter().copied().fold(0.0, f64::max) * 1.25;
        let mut chart = ChartBuilder::on(panel)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("offered load (1 = the pool's capacity at full windows)")
            .y_desc(format!("{what} job completion time, s"))
            .draw()
            .map_err(|e| err(&e))?;
        for (scheme, color) in SCHEMES.iter().zip(palette) {
            let name = scheme.to_string();
            let line: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.scheme == name)
                .map(|r| (r.load, value(r)))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        if what == "mean" {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 11))
                .draw()
                .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
