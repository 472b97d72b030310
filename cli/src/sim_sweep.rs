//! `ina sim --sweep-loss 0.001,0.01,0.1`: one simulation per loss probability, each job's
//! goodput as a fraction of the lossless run's, beside the ideal `1 − p` and the ceiling of
//! loss recovery by repair on the same topology ([`ina_sim::ceiling`]); `--json` gets every
//! point, `--plot` an SVG of the fractions against loss.

use crate::cmd_sim::{simulate, Faults, SimArgs, SimResult};
use anyhow::{bail, Context};
use ina_sim::CeilingModel;
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Draws of the stream's end behind each ceiling.
const CEILING_TRIALS: u32 = 400;

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
    /// The ceiling of loss recovery by repair at this loss, as a fraction of lossless goodput
    /// (one job only: jobs that share links are not modelled).
    ceiling: Option<f64>,
    /// The stream's end beyond lossless in that model, mean over its draws, microseconds.
    ceiling_end_us: Option<f64>,
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
    let mut lossless_time = None;
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
        let lossless = *lossless_time.get_or_insert_with(|| {
            runs.iter().map(|r| r.virtual_seconds).sum::<f64>() / runs.len().max(1) as f64
        });
        let ceiling = ceiling_model(&args, loss)
            .zip(Duration::try_from_secs_f64(lossless).ok())
            .map(|(m, lossless)| m.estimate(lossless, CEILING_TRIALS, 1))
            .transpose()
            .with_context(|| format!("the ceiling at loss {loss}"))?;
        points.push(Point {
            loss,
            fraction_min: fraction(goodputs.iter().copied().fold(f64::INFINITY, f64::min)),
            fraction_mean: fraction(mean),
            fraction_max: fraction(goodputs.iter().copied().fold(0.0, f64::max)),
            ideal: 1.0 - loss,
            ceiling: ceiling.map(|c| c.fraction),
            ceiling_end_us: ceiling.map(|c| c.end_mean.as_secs_f64() * 1e6),
            runs,
        });
    }
    println!(
        "\n{:>8} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "loss", "least", "mean", "most", "1 - p", "ceiling"
    );
    for p in &points {
        let ceiling = p.ceiling.map_or("-".to_string(), |c| format!("{c:.3}"));
        println!(
            "{:>8} {:>10.3} {:>10.3} {:>10.3} {:>8.3} {:>8}",
            p.loss, p.fraction_min, p.fraction_mean, p.fraction_max, p.ideal, ceiling
        );
    }
    if args.jobs == 1 {
        println!(
            "ceiling: the most any loss recovery by repair can expect on this topology (every loss \
             found at once and repaired over its hop's round trip, no protocol bytes; \
             {CEILING_TRIALS} draws of the stream's end, docs/BENCHMARKS.md)"
        );
    } else {
        println!("ceiling: not modelled for jobs that share links");
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

/// The ceiling model of one job of `args` at `loss`; `None` with several jobs, which share
/// links the model does not have (or with times that are no durations, which the runs
/// before have refused).
fn ceiling_model(args: &SimArgs, loss: f64) -> Option<CeilingModel> {
    if args.jobs != 1 || args.workers == 0 || args.elems == 0 {
        return None;
    }
    let packet_bytes = ina_wire::agg::HEADER_LEN as f64
        + 4.0 * f64::from(args.elems)
        + f64::from(args.framing_bytes);
    let round_trip = |latency_us: f64| Duration::try_from_secs_f64(2.0 * latency_us * 1e-6).ok();
    Some(CeilingModel {
        workers: u32::try_from(args.workers).ok()?,
        rack_size: match args.rack_size {
            0 => None,
            k => Some(u32::try_from(k).ok()?),
        },
        loss,
        uplink_loss: args.uplink_loss.unwrap_or(loss),
        round_trip: round_trip(args.latency_us)?,
        uplink_round_trip: round_trip(args.uplink_latency_us.unwrap_or(args.latency_us))?,
        packet_time: Duration::try_from_secs_f64(packet_bytes * 8.0 / (args.gbps * 1e9)).ok()?,
        packets: args.elements.div_ceil(usize::from(args.elems)) as u64,
    })
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
    let ceiling: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.loss, p.ceiling?)))
        .collect();
    if !ceiling.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(ceiling, 2, 4, BLUE.mix(0.7).into()))
            .map_err(|e| err(&e))?
            .label("ceiling of recovery by repair")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.7)));
    }
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
