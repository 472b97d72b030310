//! `ina sim --sweep-loss 0.001,0.01,0.1`: one simulation per loss probability, each job's
//! goodput as a fraction of the lossless run's, beside the ideal `1 − p`; `--json` gets every
//! point, `--plot` an SVG of the fractions against loss.

use crate::cmd_sim::{simulate, Faults, SimArgs, SimResult};
use anyhow::{bail, Context};
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// One loss probability and its runs.
#[derive(Debug, Serialize)]
struct Point {
    loss: f64,
    /// Every job of every seed, as a fraction of the lossless mean: least, mean, most.
    fraction_min: f64,
    fraction_mean: f64,
    fraction_max: f64,
    /// What a link that loses `loss` of its packets carries at most: `1 − loss`.
    ideal: f64,
    runs: Vec<SimResult>,
}

pub(crate) fn run(args: SimArgs, faults: &Faults) -> anyhow::Result<()> {
    let mut losses = args.sweep_loss.clone();
    if let Some(p) = losses.iter().find(|p| !(0.0..1.0).contains(*p)) {
        bail!("--sweep-loss takes probabilities in [0, 1), not {p}");
    }
    losses.retain(|p| *p > 0.0);
    losses.sort_by(f64::total_cmp);
    losses.dedup();
    losses.insert(0, 0.0);
    let mut points = Vec::new();
    let mut base = None;
    for &loss in &losses {
        println!("\n== loss {loss}");
        let mut a = args.clone();
        a.loss = loss;
        let runs = simulate(&a, faults).with_context(|| format!("the run at loss {loss}"))?;
        if let Some(r) = runs.iter().find(|r| !r.ok()) {
            bail!(
                "at loss {loss}, job {} of seed {} failed or produced a wrong result",
                r.job,
                r.seed
            );
        }
        let goodputs: Vec<f64> = runs.iter().map(|r| r.goodput_gbit_per_s).collect();
        let mean = goodputs.iter().sum::<f64>() / goodputs.len().max(1) as f64;
        let base = *base.get_or_insert(mean);
        let fraction = |g: f64| if base > 0.0 { g / base } else { 0.0 };
        points.push(Point {
            loss,
            fraction_min: fraction(goodputs.iter().copied().fold(f64::INFINITY, f64::min)),
            fraction_mean: fraction(mean),
            fraction_max: fraction(goodputs.iter().copied().fold(0.0, f64::max)),
            ideal: 1.0 - loss,
            runs,
        });
    }
    println!(
        "\n{:>8} {:>10} {:>10} {:>10} {:>8}",
        "loss", "least", "mean", "most", "1 - p"
    );
    for p in &points {
        println!(
            "{:>8} {:>10.3} {:>10.3} {:>10.3} {:>8.3}",
            p.loss, p.fraction_min, p.fraction_mean, p.fraction_max, p.ideal
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&points)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot(path, &points, &args)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

fn plot(path: &Path, points: &[Point], args: &SimArgs) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x_max = points.iter().map(|p| p.loss).fold(0.0, f64::max).max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "ina sim: goodput under loss ({} workers, {} slots, {} Gbit/s)",
                args.workers,
                args.window(),
                args.gbps
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..x_max * 1.03, 0.0..1.05)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("loss per packet and link direction")
        .y_desc("goodput / lossless goodput")
        .draw()
        .map_err(|e| err(&e))?;
    let ideal = vec![(0.0, 1.0), (x_max, 1.0 - x_max)];
    chart
        .draw_series(DashedLineSeries::new(ideal, 6, 4, BLACK.mix(0.6).into()))
        .map_err(|e| err(&e))?
        .label("ideal: 1 - p")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.6)));
    let mean: Vec<(f64, f64)> = points.iter().map(|p| (p.loss, p.fraction_mean)).collect();
    chart
        .draw_series(LineSeries::new(mean.clone(), RED.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("ina, mean over seeds and jobs")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .draw_series(mean.iter().map(|p| Circle::new(*p, 3, RED.filled())))
        .map_err(|e| err(&e))?;
    let least: Vec<(f64, f64)> = points.iter().map(|p| (p.loss, p.fraction_min)).collect();
    chart
        .draw_series(DashedLineSeries::new(least, 3, 3, RED.mix(0.5).into()))
        .map_err(|e| err(&e))?
        .label("ina, least")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.mix(0.5)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
