//! The printed report, in `vllm bench serve`'s layout, and the result JSON with its key names.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::client::{Endpoint, RequestOutput};
use crate::metrics::{p_word, Metrics, Stat};
use crate::runner::RunOutcome;

/// The settings of a run, stored in its result.
#[derive(Debug, Clone)]
pub struct RunMeta {
    /// `--label`.
    pub label: Option<String>,
    /// Model sent.
    pub model: String,
    /// Completions or chat.
    pub endpoint: Endpoint,
    /// Prompts sent.
    pub num_prompts: usize,
    /// Requests per second (infinite: all at once).
    pub request_rate: f64,
    /// Gamma shape of the gaps.
    pub burstiness: f64,
    /// Client-side cap.
    pub max_concurrency: Option<usize>,
}

/// `(key, display name, section header)` of each latency metric.
pub const METRIC_NAMES: [(&str, &str, &str); 4] = [
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
];

/// The stat of metric `key` (`ttft`, `tpot`, `itl`, `e2el`).
pub fn stat<'a>(m: &'a Metrics, key: &str) -> &'a Stat {
    match key {
        "ttft" => &m.ttft,
        "tpot" => &m.tpot,
        "itl" => &m.itl,
        _ => &m.e2el,
    }
}

fn line(s: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(s, "{:<40} {:<10}", label, value.to_string());
}

fn fline(s: &mut String, label: &str, value: f64) {
    let _ = writeln!(s, "{:<40} {:<10.2}", label, value);
}

/// vLLM's list of the first failures ("capping to 10"); empty when nothing failed.
pub fn format_failures(outputs: &[RequestOutput]) -> String {
    let failed: Vec<&RequestOutput> = outputs.iter().filter(|o| !o.success).collect();
    if failed.is_empty() {
        return String::new();
    }
    let mut s = String::from("Failed requests during benchmark run detected (capping to 10):\n");
    for (i, o) in failed.iter().take(10).enumerate() {
        let _ = writeln!(s, "Error {i}: {}", o.error);
    }
    s
}

/// Appends one metric section: header, mean, median, percentiles.
pub fn format_stat(s: &mut String, name: &str, header: &str, st: &Stat) {
    let _ = writeln!(s, "{:-^50}", header);
    fline(s, &format!("Mean {name} (ms):"), st.mean);
    fline(s, &format!("Median {name} (ms):"), st.median);
    for (p, v) in &st.percentiles {
        fline(s, &format!("P{} {name} (ms):", p_word(*p)), *v);
    }
}

/// The report block, line for line as vLLM prints it.
pub fn format_report(meta: &RunMeta, m: &Metrics, duration: f64, selected: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:=^50}", " Serving Benchmark Result ");
    line(&mut s, "Successful requests:", m.completed);
    line(&mut s, "Failed requests:", m.failed);
    if let Some(c) = meta.max_concurrency {
        line(&mut s, "Maximum request concurrency:", c);
    }
    if meta.request_rate.is_finite() {
        fline(&mut s, "Request rate configured (RPS):", meta.request_rate);
    }
    fline(&mut s, "Benchmark duration (s):", duration);
    line(&mut s, "Total input tokens:", m.total_input);
    line(&mut s, "Total generated tokens:", m.total_output);
    fline(&mut s, "Request throughput (req/s):", m.request_throughput);
    if let Some(g) = m.request_goodput {
        fline(&mut s, "Request goodput (req/s):", g);
    }
    fline(&mut s, "Output token throughput (tok/s):", m.output_throughput);
    fline(&mut s, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
    fline(&mut s, "Peak concurrent requests:", m.max_concurrent_requests as f64);
    fline(&mut s, "Total token throughput (tok/s):", m.total_token_throughput);
    for (key, name, header) in METRIC_NAMES {
        if selected.iter().any(|k| k == key) {
            format_stat(&mut s, name, header, stat(m, key));
        }
    }
    let _ = writeln!(s, "{}", "=".repeat(50));
    s
}

/// Adds `mean_<key>_ms`, `median_<key>_ms`, `std_<key>_ms` and `p<P>_<key>_ms`.
pub fn insert_stat(obj: &mut Map<String, Value>, key: &str, st: &Stat) {
    obj.insert(format!("mean_{key}_ms"), json!(st.mean));
    obj.insert(format!("median_{key}_ms"), json!(st.median));
    obj.insert(format!("std_{key}_ms"), json!(st.std));
    for (p, v) in &st.percentiles {
        obj.insert(format!("p{}_{key}_ms", p_word(*p)), json!(v));
    }
}

/// The result JSON: vLLM's keys, with the per-request arrays.
pub fn result_json(meta: &RunMeta, m: &Metrics, run: &RunOutcome, selected: &[String]) -> Value {
    let outs = &run.outputs;
    let mut o = Map::new();
    o.insert("date".into(), json!(now_stamp()));
    let backend = match meta.endpoint {
        Endpoint::Completions => "openai",
        Endpoint::Chat => "openai-chat",
    };
    o.insert("endpoint_type".into(), json!(backend));
    o.insert("backend".into(), json!(backend));
    o.insert("label".into(), json!(meta.label));
    o.insert("model_id".into(), json!(meta.model));
    o.insert("tokenizer_id".into(), json!(meta.model));
    o.insert("num_prompts".into(), json!(meta.num_prompts));
    o.insert(
        "request_rate".into(),
        if meta.request_rate.is_finite() { json!(meta.request_rate) } else { json!("inf") },
    );
    o.insert("burstiness".into(), json!(meta.burstiness));
    o.insert("max_concurrency".into(), json!(meta.max_concurrency));
    o.insert("duration".into(), json!(run.duration));
    o.insert("completed".into(), json!(m.completed));
    o.insert("failed".into(), json!(m.failed));
    o.insert("total_input_tokens".into(), json!(m.total_input));
    o.insert("total_output_tokens".into(), json!(m.total_output));
    o.insert("request_throughput".into(), json!(m.request_throughput));
    o.insert("request_goodput".into(), json!(m.request_goodput));
    o.insert("output_throughput".into(), json!(m.output_throughput));
    o.insert("total_token_throughput".into(), json!(m.total_token_throughput));
    o.insert("max_output_tokens_per_s".into(), json!(m.max_output_tokens_per_s));
    o.insert("max_concurrent_requests".into(), json!(m.max_concurrent_requests));
    o.insert("input_lens".into(), json!(outs.iter().map(|x| x.prompt_len).collect::<Vec<_>>()));
    o.insert("output_lens".into(), json!(m.output_lens));
    o.insert("ttfts".into(), json!(outs.iter().map(|x| x.ttft).collect::<Vec<_>>()));
    o.insert("itls".into(), json!(outs.iter().map(|x| &x.itl).collect::<Vec<_>>()));
    o.insert("latencies".into(), json!(outs.iter().map(|x| x.latency).collect::<Vec<_>>()));
    o.insert("start_times".into(), json!(outs.iter().map(|x| x.start_time).collect::<Vec<_>>()));
    o.insert("generated_texts".into(), json!(outs.iter().map(RequestOutput::full_text).collect::<Vec<_>>()));
    o.insert("errors".into(), json!(outs.iter().map(|x| &x.error).collect::<Vec<_>>()));
    for (key, _, _) in METRIC_NAMES {
        if selected.iter().any(|k| k == key) {
            insert_stat(&mut o, key, stat(m, key));
        }
    }
    Value::Object(o)
}

/// UTC time as vLLM stamps results: `YYYYMMDD-HHMMSS`.
pub fn now_stamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{calculate, Goodput};

    #[test]
    fn report_layout_matches_vllm() {
        let out = RequestOutput {
            success: true,
            ttft: 0.1,
            itl: vec![0.02, 0.03],
            latency: 0.15,
            output_tokens: Some(3),
            prompt_len: 10,
            ..Default::default()
        };
        let m = calculate(std::slice::from_ref(&out), 1.0, &[99.0], &Goodput::default());
        let meta = RunMeta {
            label: None,
            model: "m".into(),
            endpoint: Endpoint::Completions,
            num_prompts: 1,
            request_rate: f64::INFINITY,
            burstiness: 1.0,
            max_concurrency: Some(4),
        };
        let sel: Vec<String> = ["ttft", "tpot", "itl", "e2el"].map(String::from).to_vec();
        let r = format_report(&meta, &m, 1.0, &sel);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines[0], "============ Serving Benchmark Result ============");
        assert_eq!(lines[1], "Successful requests:                     1         ");
        assert_eq!(lines[3], "Maximum request concurrency:             4         ");
        assert_eq!(lines[4], "Benchmark duration (s):                  1.00      ");
        assert!(r.contains("---------------Time to First Token----------------\n"));
        assert!(r.contains("-----Time per Output Token (excl. 1st token)------\n"));
        assert!(r.contains("Mean TTFT (ms):                          100.00    \n"));
        assert!(r.contains("P99 ITL (ms):                            29.90     \n"));
        assert!(!r.contains("Request rate configured"), "only for a finite rate");
        assert_eq!(*lines.last().unwrap(), "=".repeat(50));
        let run = RunOutcome { outputs: vec![out], duration: 1.0 };
        let j = result_json(&meta, &m, &run, &sel);
        for k in [
            "completed",
            "failed",
            "duration",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p99_ttft_ms",
            "mean_tpot_ms",
            "p99_itl_ms",
            "median_e2el_ms",
            "request_goodput",
            "input_lens",
            "output_lens",
            "ttfts",
            "itls",
            "generated_texts",
            "errors",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert_eq!(j["request_rate"], "inf");
        assert!(j["request_goodput"].is_null());
        assert_eq!(j["itls"], json!([[0.02, 0.03]]));
    }

    #[test]
    fn failures_are_listed_up_to_ten() {
        let f = RequestOutput { error: "HTTP 500".into(), ..Default::default() };
        let s = format_failures(&vec![f; 12]);
        assert_eq!(s.lines().count(), 11);
        assert!(s.contains("Error 9: HTTP 500"));
        assert_eq!(format_failures(&[]), "");
    }

    #[test]
    fn stamp_has_vllm_shape() {
        let s = now_stamp();
        assert_eq!(s.len(), 15);
        assert_eq!(&s[8..9], "-");
        assert!(s.starts_with("20"));
    }
}
