//! `cleave-bench mixed`: the workload cleave exists for. A background of long reasoning streams
//! (short prompts, long outputs, a fixed number always in flight) plus a long prompt every few
//! seconds. Background streams and long prompts are reported apart, and so are the background
//! gaps that overlap a long prompt's prefill (send to first token): with prefill disaggregated,
//! those should look like every other gap.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::bench::{self, write_json};
use crate::charts::{self, BarGroup};
use crate::cli::{ChartArgs, MixedArgs};
use crate::client::{RequestInput, RequestOutput};
use crate::dataset::{self, RandomSpec, ServerTokenizer};
use crate::metrics::{self, Goodput, Metrics, Stat};
use crate::report::{self, format_stat};
use crate::runner::{self, progress_bar};

/// Token arrival times (seconds after the epoch) of a successful output.
pub fn token_times(o: &RequestOutput) -> Vec<f64> {
    let mut t = o.start_time + o.ttft;
    let mut v = vec![t];
    for g in &o.itl {
        t += g;
        v.push(t);
    }
    v
}

/// The ITLs of `outputs` whose gap overlaps any `(start, end)` window.
pub fn itl_during(outputs: &[RequestOutput], windows: &[(f64, f64)]) -> Vec<f64> {
    let mut out = vec![];
    for o in outputs.iter().filter(|o| o.success) {
        let times = token_times(o);
        for (k, gap) in o.itl.iter().enumerate() {
            let (a, b) = (times[k], times[k + 1]);
            if windows.iter().any(|&(s, e)| a < e && b > s) {
                out.push(*gap);
            }
        }
    }
    out
}

fn group_json(m: &Metrics, outs: &[RequestOutput]) -> Value {
    let mut o = Map::new();
    o.insert("completed".into(), json!(m.completed));
    o.insert("failed".into(), json!(m.failed));
    o.insert("total_input_tokens".into(), json!(m.total_input));
    o.insert("total_output_tokens".into(), json!(m.total_output));
    o.insert("output_throughput".into(), json!(m.output_throughput));
    for (key, _, _) in report::METRIC_NAMES {
        report::insert_stat(&mut o, key, report::stat(m, key));
    }
    o.insert("input_lens".into(), json!(outs.iter().map(|x| x.prompt_len).collect::<Vec<_>>()));
    o.insert("output_lens".into(), json!(m.output_lens));
    o.insert("start_times".into(), json!(outs.iter().map(|x| x.start_time).collect::<Vec<_>>()));
    o.insert("ttfts".into(), json!(outs.iter().map(|x| x.ttft).collect::<Vec<_>>()));
    o.insert("itls".into(), json!(outs.iter().map(|x| &x.itl).collect::<Vec<_>>()));
    o.insert("latencies".into(), json!(outs.iter().map(|x| x.latency).collect::<Vec<_>>()));
    o.insert("errors".into(), json!(outs.iter().map(|x| &x.error).collect::<Vec<_>>()));
    Value::Object(o)
}

/// `cleave-bench mixed`.
pub async fn main(args: MixedArgs) -> Result<()> {
    if args.background_concurrency == 0 && args.num_long == 0 {
        bail!("nothing to send: --background-concurrency and --num-long are both 0");
    }
    let pcts: Vec<f64> = args
        .metric_percentiles
        .split(',')
        .map(|s| s.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .context("--metric-percentiles")?;
    let (target, _) = bench::resolve_target(&args.server).await?;
    let extra = args.server.extra_body()?;
    let tok = ServerTokenizer { client: &target.client, model: target.model.clone() };
    let spec = |input_len, output_len, num_prompts, seed| RandomSpec {
        input_len,
        prefix_len: 0,
        output_len,
        range_ratio: 0.0,
        num_prompts,
        token_id_range: args.token_id_range,
        as_token_ids: false,
        seed,
    };
    let n_bg = (args.background_concurrency * 4).max(16);
    let bg =
        dataset::random_requests(&tok, &spec(args.background_input_len, args.background_output_len, n_bg, args.seed))
            .await?;
    let long =
        dataset::random_requests(&tok, &spec(args.long_input_len, args.long_output_len, args.num_long, args.seed + 1))
            .await?;
    let bg_inputs = Arc::new(bench::to_inputs(&bg, true, &extra));
    let long_inputs = bench::to_inputs(&long, true, &extra);
    let probe = RequestInput { output_len: 4, ..bg_inputs[0].clone() };
    println!("Starting initial single prompt test run...");
    runner::ready_check(&target, &probe, 0.0).await?;
    println!(
        "Mixed scenario: {} background streams ({} in / {} out), a {}-token prompt every {} s ({} in all)",
        args.background_concurrency,
        args.background_input_len,
        args.background_output_len,
        args.long_input_len,
        args.long_interval,
        args.num_long
    );

    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let bg_outs = Arc::new(Mutex::new(Vec::new()));
    let target = Arc::new(target);
    let mut workers = vec![];
    for _ in 0..args.background_concurrency {
        let (t, stop, next, outs, inputs) =
            (target.clone(), stop.clone(), next.clone(), bg_outs.clone(), bg_inputs.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let input = &inputs[next.fetch_add(1, Ordering::Relaxed) % inputs.len()];
                let o = t.send(input, epoch).await;
                let failed = !o.success;
                outs.lock().expect("lock").push(o);
                if failed {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    let pb = progress_bar(args.num_long, !args.disable_tqdm);
    let mut longs = vec![];
    for (i, input) in long_inputs.into_iter().enumerate() {
        let due = epoch + Duration::from_secs_f64(args.warmup + i as f64 * args.long_interval);
        tokio::time::sleep_until(due.into()).await;
        let (t, pb) = (target.clone(), pb.clone());
        longs.push(tokio::spawn(async move {
            let o = t.send(&input, epoch).await;
            pb.inc(1);
            o
        }));
    }
    let mut long_outs = vec![];
    for h in longs {
        long_outs.push(h.await?);
    }
    if args.num_long == 0 {
        tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    }
    stop.store(true, Ordering::Relaxed);
    pb.finish_and_clear();
    for w in workers {
        w.await?;
    }
    let duration = epoch.elapsed().as_secs_f64();
    let bg_outs = std::mem::take(&mut *bg_outs.lock().expect("lock"));

    let none = Goodput::default();
    let bm = metrics::calculate(&bg_outs, duration, &pcts, &none);
    let lm = metrics::calculate(&long_outs, duration, &pcts, &none);
    let windows: Vec<(f64, f64)> =
        long_outs.iter().map(|o| (o.start_time, o.start_time + if o.success { o.ttft } else { o.latency })).collect();
    let during_gaps = itl_during(&bg_outs, &windows);
    let during = Stat::from_seconds(&during_gaps, &pcts);
    let n_during = during_gaps.len();
    let max_during = during_gaps.iter().copied().fold(0.0, f64::max) * 1000.0;
    let total_out = bm.total_output + lm.total_output;

    let mut all = bg_outs.clone();
    all.extend(long_outs.iter().cloned());
    let mut s = report::format_failures(&all);
    let _ = writeln!(s, "{:=^50}", " Mixed Scenario Result ");
    let line = |s: &mut String, l: &str, v: String| {
        let _ = writeln!(s, "{:<40} {:<10}", l, v);
    };
    line(&mut s, "Background streams:", args.background_concurrency.to_string());
    line(&mut s, "Background requests completed:", bm.completed.to_string());
    line(&mut s, "Long prompts completed:", lm.completed.to_string());
    line(&mut s, "Failed requests:", (bm.failed + lm.failed).to_string());
    line(&mut s, "Benchmark duration (s):", format!("{duration:.2}"));
    line(&mut s, "Output token throughput (tok/s):", format!("{:.2}", total_out as f64 / duration));
    format_stat(&mut s, "ITL", "Background streams: Inter-token Latency", &bm.itl);
    format_stat(&mut s, "TTFT", "Background streams: Time to First Token", &bm.ttft);
    format_stat(&mut s, "TPOT", "Background streams: Time per Output Token", &bm.tpot);
    format_stat(&mut s, "ITL", "Background ITL during long prefills", &during);
    line(&mut s, "Gaps overlapping a long prefill:", n_during.to_string());
    line(&mut s, "Max ITL (ms):", format!("{max_during:.2}"));
    format_stat(&mut s, "TTFT", "Long prompts: Time to First Token", &lm.ttft);
    format_stat(&mut s, "ITL", "Long prompts: Inter-token Latency", &lm.itl);
    let _ = writeln!(s, "{}", "=".repeat(50));
    print!("{s}");

    let p99 = |st: &Stat| st.at(99.0).map_or(Value::Null, |v| json!(v));
    let mut during_json = Map::new();
    during_json.insert("count".into(), json!(n_during));
    during_json.insert("max_itl_ms".into(), json!(max_during));
    report::insert_stat(&mut during_json, "itl", &during);
    let result = json!({
        "scenario": "mixed",
        "date": report::now_stamp(),
        "label": args.label,
        "model_id": target.model,
        "endpoint": args.server.endpoint(),
        "background_concurrency": args.background_concurrency,
        "background_input_len": args.background_input_len,
        "background_output_len": args.background_output_len,
        "long_input_len": args.long_input_len,
        "long_output_len": args.long_output_len,
        "long_interval": args.long_interval,
        "num_long": args.num_long,
        "duration": duration,
        "output_throughput": total_out as f64 / duration,
        "background_median_itl_ms": bm.itl.median,
        "background_p99_itl_ms": p99(&bm.itl),
        "background_mean_ttft_ms": bm.ttft.mean,
        "background_p99_ttft_ms": p99(&bm.ttft),
        "background_p99_itl_during_long_prefill_ms": p99(&during),
        "long_mean_ttft_ms": lm.ttft.mean,
        "long_p99_ttft_ms": p99(&lm.ttft),
        "background": group_json(&bm, &bg_outs),
        "long": group_json(&lm, &long_outs),
        "background_itl_during_long_prefill": Value::Object(during_json),
    });
    if let Some(path) = &args.save_result {
        write_json(path, &result)?;
        println!("Result saved to {}", path.display());
    }
    Ok(())
}

/// Reads a mixed-scenario result file (one whose `scenario` is `mixed`).
pub fn load_result(path: &Path) -> Result<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    if v.get("scenario").and_then(Value::as_str) != Some("mixed") {
        bail!("{} is not a mixed-scenario result", path.display());
    }
    Ok(v)
}

/// `cleave-bench chart` on mixed results: `<output>-itl` (background ITL) and `<output>-ttft`
/// (TTFT of background streams and long prompts), as grouped bars.
pub fn chart(args: &ChartArgs) -> Result<()> {
    let results: Vec<Value> = args.input.iter().map(|p| load_result(p)).collect::<Result<_>>()?;
    let labels: Vec<String> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            args.label
                .get(i)
                .cloned()
                .or_else(|| r["label"].as_str().map(String::from))
                .unwrap_or_else(|| format!("set {}", i + 1))
        })
        .collect();
    let get = |key: &str| results.iter().map(|r| r[key].as_f64().unwrap_or(0.0)).collect::<Vec<_>>();
    let group = |name: &str, key: &str| BarGroup { name: name.to_string(), values: get(key) };
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| "Mixed scenario: background reasoning streams + periodic long prompts".into());
    let base = args.output.to_string_lossy().to_string();
    let itl = [
        group("background median ITL", "background_median_itl_ms"),
        group("background P99 ITL", "background_p99_itl_ms"),
        group("background P99 ITL during long prefills", "background_p99_itl_during_long_prefill_ms"),
    ];
    let (a, b) = charts::draw_bars(&labels, &itl, "ms", &format!("{title}: ITL"), Path::new(&format!("{base}-itl")))?;
    let ttft = [
        group("background mean TTFT", "background_mean_ttft_ms"),
        group("long-prompt mean TTFT", "long_mean_ttft_ms"),
        group("long-prompt P99 TTFT", "long_p99_ttft_ms"),
    ];
    let (c, d) =
        charts::draw_bars(&labels, &ttft, "ms", &format!("{title}: TTFT"), Path::new(&format!("{base}-ttft")))?;
    println!("Wrote {}, {}, {} and {}", a.display(), b.display(), c.display(), d.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_overlapping_a_prefill_window_are_picked() {
        // Tokens at 1.0, 1.1, 1.6, 1.7: gaps (1.0,1.1) (1.1,1.6) (1.6,1.7).
        let o =
            RequestOutput { success: true, start_time: 0.5, ttft: 0.5, itl: vec![0.1, 0.5, 0.1], ..Default::default() };
        let t = token_times(&o);
        assert!((t[3] - 1.7).abs() < 1e-9);
        let got = itl_during(std::slice::from_ref(&o), &[(1.2, 1.4)]);
        assert_eq!(got, vec![0.5]);
        assert_eq!(itl_during(std::slice::from_ref(&o), &[(2.0, 3.0)]), Vec::<f64>::new());
        assert_eq!(itl_during(&[o], &[(0.0, 1.05), (1.65, 1.66)]).len(), 2);
    }
}
