//! `cleave-bench chart`: sweep directories or result files overlaid on the sweep panels, or
//! mixed-scenario result files compared as bars.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};

use crate::charts::{draw_sweep, Series};
use crate::cli::ChartArgs;
use crate::{mixed, points};

/// `cleave-bench chart`: sweep directories overlaid on the four panels, or mixed-scenario
/// result files compared as bars.
pub fn main(args: ChartArgs) -> Result<()> {
    if !args.label.is_empty() && args.label.len() != args.input.len() {
        bail!("give one --label per --input ({} labels, {} inputs)", args.label.len(), args.input.len());
    }
    let is_mixed = |p: &PathBuf| p.is_file() && mixed::load_result(p).is_ok();
    if args.input.iter().all(is_mixed) {
        return mixed::chart(&args);
    }
    let mut series = vec![];
    let mut var = None;
    for (i, input) in args.input.iter().enumerate() {
        let s = points::load_summary(input).or_else(|sweep_err| {
            points::load_results(input).map_err(|e| {
                anyhow!("{}: neither a sweep ({sweep_err:#}) nor benchmark results ({e:#})", input.display())
            })
        })?;
        if var.is_some_and(|v| v != s.variable) {
            bail!("{} sweeps a different variable than the inputs before it", input.display());
        }
        var = Some(s.variable);
        let label = args.label.get(i).cloned().unwrap_or(s.label);
        series.push(Series { label, points: s.points });
    }
    let var = var.context("no --input")?;
    let title =
        args.title.clone().unwrap_or_else(|| series.iter().map(|s| s.label.as_str()).collect::<Vec<_>>().join(" vs "));
    let (png, svg) = draw_sweep(&series, var, &title, &args.output)?;
    println!("Wrote {} and {}", png.display(), svg.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::points::SweepVar;

    /// Two runs as `vllm bench serve --save-result` writes them (keys of vLLM 0.11).
    fn vllm_result(conc: u32, out_tps: f64) -> String {
        format!(
            r#"{{"date": "20251120-101010", "backend": "vllm", "model_id": "deepseek-ai/DeepSeek-R1",
            "tokenizer_id": "deepseek-ai/DeepSeek-R1", "num_prompts": 100, "request_rate": "inf",
            "burstiness": 1.0, "max_concurrency": {conc}, "duration": 50.0, "completed": 100,
            "total_input_tokens": 102400, "total_output_tokens": 12800, "request_throughput": 2.0,
            "request_goodput": null, "output_throughput": {out_tps}, "total_token_throughput": 2300.0,
            "max_output_tokens_per_s": 300.0, "max_concurrent_requests": {conc}, "mean_ttft_ms": 120.0,
            "median_ttft_ms": 110.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 300.0, "mean_tpot_ms": 30.0,
            "median_tpot_ms": 29.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 45.0, "mean_itl_ms": 30.0,
            "median_itl_ms": 28.0, "std_itl_ms": 2.0, "p99_itl_ms": 140.0}}"#
        )
    }

    #[test]
    fn vllm_result_files_chart_as_a_concurrency_sweep() {
        let dir = std::env::temp_dir().join(format!("cleave-chart-vllm-{}", std::process::id()));
        let runs = dir.join("vllm-r1");
        std::fs::create_dir_all(&runs).unwrap();
        std::fs::write(runs.join("c8.json"), vllm_result(8, 250.0)).unwrap();
        std::fs::write(runs.join("c32.json"), vllm_result(32, 800.0)).unwrap();
        let s = points::load_results(&runs).unwrap();
        assert_eq!(s.variable, SweepVar::MaxConcurrency);
        let mut xs: Vec<f64> = s.points.iter().map(|p| p.x).collect();
        xs.sort_by(f64::total_cmp);
        assert_eq!(xs, vec![8.0, 32.0]);
        assert_eq!((s.points[0].p99_itl_ms, s.label.as_str()), (140.0, "vllm-r1"));
        let out = dir.join("chart");
        main(ChartArgs { input: vec![runs], label: vec![], title: None, output: out.clone() }).unwrap();
        assert!(std::fs::metadata(out.with_extension("png")).unwrap().len() > 10_000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
