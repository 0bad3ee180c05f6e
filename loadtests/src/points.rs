//! A sweep's data: the swept variable, each point's numbers, the summary `sweep.json` holds,
//! its CSV, and single-run result files (vLLM's or cleave-bench's) read as a sweep. The `sweep`
//! command writes it, the charts and the `chart` command read it.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench;
use crate::metrics::{self, Goodput};

/// The swept variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepVar {
    /// `--max-concurrency`, requests released all at once.
    MaxConcurrency,
    /// `--request-rate`, no concurrency cap.
    RequestRate,
}

impl SweepVar {
    /// Axis title.
    pub fn axis_label(self) -> &'static str {
        match self {
            SweepVar::MaxConcurrency => "max concurrency",
            SweepVar::RequestRate => "request rate (req/s)",
        }
    }
}

/// The numbers of one point that the CSV and the charts use (all latencies in ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SweepPoint {
    /// The swept value.
    pub x: f64,
    pub num_prompts: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration: f64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub p99_itl_ms: f64,
    /// Mean time to last token (= E2EL).
    pub mean_e2el_ms: f64,
    pub median_e2el_ms: f64,
    pub p99_e2el_ms: f64,
}

/// A whole sweep: what `sweep.json` holds and `chart` reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepSummary {
    /// Legend label.
    pub label: String,
    /// What was swept.
    pub variable: SweepVar,
    /// Model benchmarked.
    pub model: String,
    /// API path.
    pub endpoint: String,
    /// Mean prompt and output lengths asked for.
    pub input_len: usize,
    /// Mean output length asked for.
    pub output_len: usize,
    /// One per value, in the order run.
    pub points: Vec<SweepPoint>,
}

/// The summary row of a finished run.
pub fn point_from(x: f64, run: &bench::BenchRun) -> SweepPoint {
    let m = metrics::calculate(&run.outcome.outputs, run.outcome.duration, &[99.0], &Goodput::default());
    SweepPoint {
        x,
        num_prompts: run.meta.num_prompts,
        completed: m.completed,
        failed: m.failed,
        duration: run.outcome.duration,
        request_throughput: m.request_throughput,
        output_throughput: m.output_throughput,
        total_token_throughput: m.total_token_throughput,
        mean_ttft_ms: m.ttft.mean,
        median_ttft_ms: m.ttft.median,
        p99_ttft_ms: m.ttft.at(99.0).unwrap_or(0.0),
        mean_tpot_ms: m.tpot.mean,
        median_tpot_ms: m.tpot.median,
        p99_tpot_ms: m.tpot.at(99.0).unwrap_or(0.0),
        mean_itl_ms: m.itl.mean,
        median_itl_ms: m.itl.median,
        p99_itl_ms: m.itl.at(99.0).unwrap_or(0.0),
        mean_e2el_ms: m.e2el.mean,
        median_e2el_ms: m.e2el.median,
        p99_e2el_ms: m.e2el.at(99.0).unwrap_or(0.0),
    }
}

/// Column names of `sweep.csv`.
pub const CSV_COLUMNS: &str =
    "label,variable,x,num_prompts,completed,failed,duration_s,request_throughput,output_throughput,\
total_token_throughput,mean_ttft_ms,median_ttft_ms,p99_ttft_ms,mean_tpot_ms,median_tpot_ms,p99_tpot_ms,mean_itl_ms,\
median_itl_ms,p99_itl_ms,mean_ttlt_ms,median_ttlt_ms,p99_ttlt_ms";

/// The CSV of a sweep, one row per point.
pub fn to_csv(s: &SweepSummary) -> String {
    let mut out = String::from(CSV_COLUMNS);
    out.push('\n');
    let var = serde_json::to_value(s.variable).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    for p in &s.points {
        let _ = writeln!(
            out,
            "{},{var},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4}",
            s.label.replace(',', ";"),
            p.x,
            p.num_prompts,
            p.completed,
            p.failed,
            p.duration,
            p.request_throughput,
            p.output_throughput,
            p.total_token_throughput,
            p.mean_ttft_ms,
            p.median_ttft_ms,
            p.p99_ttft_ms,
            p.mean_tpot_ms,
            p.median_tpot_ms,
            p.p99_tpot_ms,
            p.mean_itl_ms,
            p.median_itl_ms,
            p.p99_itl_ms,
            p.mean_e2el_ms,
            p.median_e2el_ms,
            p.p99_e2el_ms,
        );
    }
    out
}

/// Reads `sweep.json` from a sweep directory (or the file itself).
pub fn load_summary(path: &Path) -> Result<SweepSummary> {
    let file = if path.is_dir() { path.join("sweep.json") } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a sweep summary", file.display()))
}

/// Single-run result files as a sweep: vLLM's `vllm bench serve --save-result` JSON (or
/// cleave-bench's, which has the same keys), one file or every `*.json` of a directory, one point
/// each. The swept variable is `max_concurrency` when the runs differ in it, else `request_rate`.
pub fn load_results(path: &Path) -> Result<SweepSummary> {
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut runs = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", f.display()))?;
        if v.get("output_throughput").is_some() && v.get("mean_ttft_ms").is_some() {
            runs.push(v);
        }
    }
    if runs.is_empty() {
        bail!("{}: no benchmark result JSON (output_throughput, mean_ttft_ms, ...)", path.display());
    }
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    let conc: Vec<Option<f64>> = runs.iter().map(|r| num(r, "max_concurrency")).collect();
    let rate: Vec<Option<f64>> = runs.iter().map(|r| num(r, "request_rate")).collect();
    let differ = |xs: &[Option<f64>]| xs.iter().any(|x| *x != xs[0]);
    let (variable, xs) = if conc.iter().all(Option::is_some) && (differ(&conc) || rate.iter().any(Option::is_none)) {
        (SweepVar::MaxConcurrency, conc)
    } else if rate.iter().all(Option::is_some) {
        (SweepVar::RequestRate, rate)
    } else {
        bail!("{}: the runs differ in neither max_concurrency nor a finite request_rate", path.display());
    };
    let points = runs
        .iter()
        .zip(xs)
        .map(|(r, x)| {
            let f = |k: &str| num(r, k).unwrap_or(0.0);
            let n = |k: &str| r.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
            SweepPoint {
                x: x.unwrap_or(0.0),
                num_prompts: n("num_prompts"),
                completed: n("completed"),
                failed: n("failed"),
                duration: f("duration"),
                request_throughput: f("request_throughput"),
                output_throughput: f("output_throughput"),
                total_token_throughput: f("total_token_throughput"),
                mean_ttft_ms: f("mean_ttft_ms"),
                median_ttft_ms: f("median_ttft_ms"),
                p99_ttft_ms: f("p99_ttft_ms"),
                mean_tpot_ms: f("mean_tpot_ms"),
                median_tpot_ms: f("median_tpot_ms"),
                p99_tpot_ms: f("p99_tpot_ms"),
                mean_itl_ms: f("mean_itl_ms"),
                median_itl_ms: f("median_itl_ms"),
                p99_itl_ms: f("p99_itl_ms"),
                mean_e2el_ms: f("mean_e2el_ms"),
                median_e2el_ms: f("median_e2el_ms"),
                p99_e2el_ms: f("p99_e2el_ms"),
            }
        })
        .collect();
    let first = &runs[0];
    let text = |k: &str| first.get(k).and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(SweepSummary {
        label: if stem.is_empty() { text("model_id") } else { stem },
        variable,
        model: text("model_id"),
        endpoint: text("endpoint_type"),
        input_len: 0,
        output_len: 0,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_one_row_per_point_and_roundtrips_the_summary() {
        let p = SweepPoint {
            x: 2.0,
            num_prompts: 4,
            completed: 4,
            failed: 0,
            duration: 1.5,
            request_throughput: 2.0,
            output_throughput: 30.0,
            total_token_throughput: 90.0,
            mean_ttft_ms: 10.0,
            median_ttft_ms: 9.0,
            p99_ttft_ms: 12.0,
            mean_tpot_ms: 5.0,
            median_tpot_ms: 5.0,
            p99_tpot_ms: 6.0,
            mean_itl_ms: 5.0,
            median_itl_ms: 5.0,
            p99_itl_ms: 7.0,
            mean_e2el_ms: 80.0,
            median_e2el_ms: 79.0,
            p99_e2el_ms: 90.0,
        };
        let s = SweepSummary {
            label: "a,b".into(),
            variable: SweepVar::MaxConcurrency,
            model: "m".into(),
            endpoint: "/v1/completions".into(),
            input_len: 8,
            output_len: 16,
            points: vec![p.clone(), SweepPoint { x: 4.0, ..p }],
        };
        let csv = to_csv(&s);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[1].starts_with("a;b,max_concurrency,2,4,4,0,1.5000,"));
        let back: SweepSummary = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back.points, s.points);
    }
}
