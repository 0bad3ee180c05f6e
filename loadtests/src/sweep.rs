//! `cleave-bench sweep`: one benchmark per max-concurrency or request-rate value, each saved as
//! a vLLM-style result JSON, plus `sweep.csv`, `sweep.json` and the charts of the set.

use anyhow::{bail, Context, Result};

use crate::bench::{self, write_json};
use crate::charts::{self, Series};
use crate::cli::SweepArgs;
use crate::points::{point_from, to_csv, SweepSummary, SweepVar};
use crate::runner::LoadSpec;

/// Number formatting for file names: `4`, `2.5`.
fn num(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// `cleave-bench sweep`.
pub async fn main(args: SweepArgs) -> Result<()> {
    let (variable, values): (SweepVar, Vec<f64>) = match (args.max_concurrency.is_empty(), args.request_rate.is_empty())
    {
        (false, true) => (SweepVar::MaxConcurrency, args.max_concurrency.iter().map(|&c| c as f64).collect()),
        (true, false) => (SweepVar::RequestRate, args.request_rate.clone()),
        _ => bail!("give exactly one of --max-concurrency 1,2,4,... or --request-rate 1,2,4,..."),
    };
    std::fs::create_dir_all(&args.output_dir).with_context(|| format!("creating {}", args.output_dir.display()))?;
    let (target, max_len) = bench::resolve_target(&args.server).await?;
    let extra = args.server.extra_body()?;
    let mut summary = SweepSummary {
        label: args.label.clone(),
        variable,
        model: target.model.clone(),
        endpoint: args.server.endpoint(),
        input_len: args.workload.random_input_len,
        output_len: args.workload.random_output_len,
        points: vec![],
    };
    for (i, &x) in values.iter().enumerate() {
        let (load, num_prompts, name) = match variable {
            SweepVar::MaxConcurrency => {
                let c = x as usize;
                let n = args.prompts_per_concurrency.map_or(args.workload.num_prompts, |k| (k * c).max(1));
                let load = LoadSpec {
                    request_rate: f64::INFINITY,
                    burstiness: args.workload.burstiness,
                    max_concurrency: Some(c),
                    seed: args.workload.seed,
                };
                (load, n, format!("{}-concurrency{c}.json", args.label))
            }
            SweepVar::RequestRate => {
                let load = LoadSpec {
                    request_rate: x,
                    burstiness: args.workload.burstiness,
                    max_concurrency: None,
                    seed: args.workload.seed,
                };
                (load, args.workload.num_prompts, format!("{}-{}qps.json", args.label, num(x)))
            }
        };
        println!("\n### sweep point {}/{}: {} = {}", i + 1, values.len(), variable.axis_label(), num(x));
        // A different seed per point: repeated prompts would hit a prefix cache.
        let seed = args.workload.seed + i as u64;
        let reqs = bench::load_requests(&target, &args.workload, num_prompts, seed, max_len).await?;
        let run = bench::run_point(&target, &args.workload, &extra, &reqs, &load, Some(args.label.clone())).await?;
        print!("{}", run.report);
        write_json(&args.output_dir.join(&name), &run.result)?;
        summary.points.push(point_from(x, &run));
    }
    let csv_path = args.output_dir.join("sweep.csv");
    std::fs::write(&csv_path, to_csv(&summary)).with_context(|| format!("writing {}", csv_path.display()))?;
    write_json(&args.output_dir.join("sweep.json"), &serde_json::to_value(&summary)?)?;
    let title = format!("{}: {} in / {} out, {}", summary.label, summary.input_len, summary.output_len, summary.model);
    let series = [Series { label: summary.label.clone(), points: summary.points.clone() }];
    let (png, svg) = charts::draw_sweep(&series, variable, &title, &args.output_dir.join("sweep"))?;
    println!("Wrote {} points, {}, {} and {}", summary.points.len(), csv_path.display(), png.display(), svg.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_short_numbers() {
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(4.0), "4");
    }
}
