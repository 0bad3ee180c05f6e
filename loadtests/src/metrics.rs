//! The benchmark's numbers, computed exactly as `vllm bench serve` computes them.
//!
//! Means, medians, population standard deviations and percentiles by linear interpolation
//! (numpy's defaults); an empty list counts as `[0]`, as `np.mean(x or 0)` does. TPOT per
//! request is `(E2EL - TTFT) / (output_tokens - 1)` for requests with more than one token;
//! throughputs divide by the run's wall time; goodput counts requests that meet every SLO.

use anyhow::{bail, Context, Result};

use crate::client::RequestOutput;

/// numpy's `percentile(values, p)` with the default linear interpolation; 0 for no values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let idx = (v.len() - 1) as f64 * p / 100.0;
    let lo = idx.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    let t = idx - lo as f64;
    let (a, b) = (v[lo], v[hi]);
    // numpy's _lerp: exact at both ends.
    if t >= 0.5 {
        b - (b - a) * (1.0 - t)
    } else {
        a + (b - a) * t
    }
}

/// Arithmetic mean; 0 for no values.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Population standard deviation (numpy's `std`, ddof 0); 0 for no values.
pub fn std_dev(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / values.len() as f64).sqrt()
}

/// Summary of one latency metric, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Median (the 50th percentile).
    pub median: f64,
    /// Population standard deviation.
    pub std: f64,
    /// `(p, value)` for each requested percentile.
    pub percentiles: Vec<(f64, f64)>,
}

impl Stat {
    /// Summarizes `seconds` into milliseconds.
    pub fn from_seconds(seconds: &[f64], pcts: &[f64]) -> Self {
        Stat {
            mean: mean(seconds) * 1000.0,
            median: percentile(seconds, 50.0) * 1000.0,
            std: std_dev(seconds) * 1000.0,
            percentiles: pcts.iter().map(|&p| (p, percentile(seconds, p) * 1000.0)).collect(),
        }
    }

    /// The value at percentile `p`, if it was requested.
    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles.iter().find(|(q, _)| *q == p).map(|(_, v)| *v)
    }
}

/// vLLM's spelling of a percentile in key names: `99`, `99.9`.
pub fn p_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Service-level objectives for goodput, in milliseconds (`--goodput ttft:500 tpot:50`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Goodput {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// Time per output token.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency.
    pub e2el_ms: Option<f64>,
}

impl Goodput {
    /// Parses `KEY:VALUE` pairs; keys are `ttft`, `tpot`, `e2el`, values milliseconds >= 0.
    pub fn parse(pairs: &[String]) -> Result<Self> {
        let mut g = Goodput::default();
        for pair in pairs.iter().flat_map(|s| s.split([',', ' '])).filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once(':').with_context(|| format!("goodput SLO {pair:?} is not KEY:VALUE"))?;
            let v: f64 = v.trim().parse().with_context(|| format!("goodput SLO {pair:?}: value is not a number"))?;
            if v < 0.0 {
                bail!("goodput SLO {pair:?}: the value must be non-negative");
            }
            match k.trim() {
                "ttft" => g.ttft_ms = Some(v),
                "tpot" => g.tpot_ms = Some(v),
                "e2el" => g.e2el_ms = Some(v),
                other => bail!("goodput SLO {other:?}: the name must be one of ttft, tpot, e2el"),
            }
        }
        Ok(g)
    }

    /// True when any SLO was given.
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2el_ms.is_some()
    }

    /// Whether a request with these timings (seconds) meets every given SLO.
    pub fn is_good(&self, ttft: f64, tpot: f64, e2el: f64) -> bool {
        let ok = |slo: Option<f64>, v: f64| slo.is_none_or(|ms| ms / 1000.0 >= v);
        ok(self.ttft_ms, ttft) && ok(self.tpot_ms, tpot) && ok(self.e2el_ms, e2el)
    }
}

/// TPOT of one request in seconds: `(latency - ttft) / (output_len - 1)`, or `None` for one
/// token or fewer.
pub fn tpot(latency: f64, ttft: f64, output_len: usize) -> Option<f64> {
    (output_len > 1).then(|| (latency - ttft) / (output_len - 1) as f64)
}

/// Everything the report prints and the result JSON holds, except per-request arrays.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Prompt tokens of successful requests.
    pub total_input: usize,
    /// Output tokens of successful requests.
    pub total_output: usize,
    /// completed / duration.
    pub request_throughput: f64,
    /// Good requests / duration, when SLOs were given.
    pub request_goodput: Option<f64>,
    /// total_output / duration.
    pub output_throughput: f64,
    /// (total_input + total_output) / duration.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: Stat,
    /// Time per output token, excluding the first.
    pub tpot: Stat,
    /// Inter-token latency, over all gaps of all requests.
    pub itl: Stat,
    /// End-to-end latency.
    pub e2el: Stat,
    /// Most token messages received in one wall-clock second.
    pub max_output_tokens_per_s: f64,
    /// Most requests in flight at once.
    pub max_concurrent_requests: usize,
    /// Output tokens per request, 0 for failed ones (vLLM's `output_lens`).
    pub output_lens: Vec<usize>,
}

/// Computes the metrics of a run that took `duration_s` seconds.
pub fn calculate(outputs: &[RequestOutput], duration_s: f64, pcts: &[f64], goodput: &Goodput) -> Metrics {
    let (mut ttfts, mut tpots, mut itls, mut e2els, mut output_lens) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut completed, mut total_input, mut good) = (0, 0, 0);
    for o in outputs {
        if !o.success {
            output_lens.push(0);
            continue;
        }
        let n = o.output_len();
        output_lens.push(n);
        total_input += o.prompt_len;
        let t = tpot(o.latency, o.ttft, n);
        if let Some(t) = t {
            tpots.push(t);
        }
        if goodput.is_good(o.ttft, t.unwrap_or(0.0), o.latency) {
            good += 1;
        }
        itls.extend_from_slice(&o.itl);
        ttfts.push(o.ttft);
        e2els.push(o.latency);
        completed += 1;
    }
    let total_output: usize = output_lens.iter().sum();
    let (max_output_tokens_per_s, max_concurrent_requests) = peaks(outputs);
    Metrics {
        completed,
        failed: outputs.len() - completed,
        total_input,
        total_output,
        request_throughput: completed as f64 / duration_s,
        request_goodput: goodput.is_set().then(|| good as f64 / duration_s),
        output_throughput: total_output as f64 / duration_s,
        total_token_throughput: (total_input + total_output) as f64 / duration_s,
        ttft: Stat::from_seconds(&ttfts, pcts),
        tpot: Stat::from_seconds(&tpots, pcts),
        itl: Stat::from_seconds(&itls, pcts),
        e2el: Stat::from_seconds(&e2els, pcts),
        max_output_tokens_per_s,
        max_concurrent_requests,
        output_lens,
    }
}

/// vLLM's peak numbers over successful requests: token messages per one-second bucket
/// (buckets counted from the earliest send), and the most requests in flight at once
/// (half-open `[start, start + latency)` intervals).
pub fn peaks(outputs: &[RequestOutput]) -> (f64, usize) {
    let ok: Vec<&RequestOutput> = outputs.iter().filter(|o| o.success).collect();
    if ok.is_empty() {
        return (0.0, 0);
    }
    let t0 = ok.iter().map(|o| o.start_time).fold(f64::INFINITY, f64::min);
    let t1 = ok.iter().map(|o| o.start_time + o.latency).fold(f64::NEG_INFINITY, f64::max);
    let buckets = (t1 - t0).ceil() as usize + 1;
    let mut per_second = vec![0usize; buckets];
    for o in &ok {
        let mut t = o.start_time + o.ttft;
        let mut times = vec![t];
        for gap in &o.itl {
            t += gap;
            times.push(t);
        }
        for t in times {
            let b = (t - t0).floor();
            if b >= 0.0 && (b as usize) < buckets {
                per_second[b as usize] += 1;
            }
        }
    }
    let mut events: Vec<(f64, i32)> =
        ok.iter().flat_map(|o| [(o.start_time, 1), (o.start_time + o.latency, -1)]).collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut peak) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        peak = peak.max(cur);
    }
    (*per_second.iter().max().unwrap_or(&0) as f64, peak as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + b.abs())
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        // Expected values from numpy 2.x: np.percentile(x, p).
        let x: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(percentile(&x, 99.0), 9.91));
        let y = [50.0, 15.0, 40.0, 20.0, 35.0];
        assert!(close(percentile(&y, 99.0), 49.6));
        assert!(close(percentile(&y, 50.0), 35.0));
        assert!(close(percentile(&[1.0, 3.0, 2.0, 4.0], 25.0), 1.75));
        let z = [3.2, 0.1, 7.7, 2.5, 9.9, 4.4, 6.1];
        for (p, want) in [(90.0, 8.58), (99.0, 9.768), (99.9, 9.8868), (12.5, 1.9), (0.0, 0.1), (100.0, 9.9)] {
            assert!(close(percentile(&z, p), want), "p{p}: {} vs {want}", percentile(&z, p));
        }
        assert_eq!(percentile(&[0.5], 99.0), 0.5);
        assert_eq!(percentile(&[], 99.0), 0.0);
        assert!(close(std_dev(&[1.0, 2.0, 3.0, 4.0]), 1.118033988749895));
        assert_eq!((mean(&[]), std_dev(&[])), (0.0, 0.0));
        assert_eq!(
            (p_word(99.0), p_word(99.9), p_word(50.0)),
            ("99".to_string(), "99.9".to_string(), "50".to_string())
        );
    }

    fn req(start: f64, ttft: f64, itl: &[f64], out_tokens: usize, prompt: usize) -> RequestOutput {
        RequestOutput {
            success: true,
            start_time: start,
            ttft,
            itl: itl.to_vec(),
            latency: ttft + itl.iter().sum::<f64>(),
            output_tokens: Some(out_tokens),
            prompt_len: prompt,
            ..Default::default()
        }
    }

    #[test]
    fn synthetic_timeline_gives_tpot_itl_e2el_and_throughputs() {
        // Request A: first token at 100 ms, then 4 more at +20, +30, +20, +30 ms (5 tokens).
        // Request B: first token at 300 ms, then 1 more at +50 ms (2 tokens).
        let a = req(0.0, 0.100, &[0.020, 0.030, 0.020, 0.030], 5, 10);
        let b = req(0.5, 0.300, &[0.050], 2, 30);
        let failed = RequestOutput { success: false, error: "x".into(), prompt_len: 99, ..Default::default() };
        let m = calculate(&[a, b, failed], 2.0, &[99.0], &Goodput::default());
        assert_eq!((m.completed, m.failed, m.total_input, m.total_output), (2, 1, 40, 7));
        assert_eq!(m.output_lens, vec![5, 2, 0]);
        assert!(close(m.request_throughput, 1.0));
        assert!(close(m.output_throughput, 3.5));
        assert!(close(m.total_token_throughput, 23.5));
        assert_eq!(m.request_goodput, None);
        // TPOT A = (0.2 - 0.1) / 4 = 25 ms; TPOT B = (0.35 - 0.3) / 1 = 50 ms.
        assert!(close(m.tpot.mean, 37.5));
        assert!(close(m.ttft.mean, 200.0));
        assert!(close(m.ttft.median, 200.0));
        assert!(close(m.ttft.std, 100.0));
        // ITLs pooled over both requests: [20, 30, 20, 30, 50] ms.
        assert!(close(m.itl.mean, 30.0));
        assert!(close(m.itl.median, 30.0));
        assert!(close(m.itl.at(99.0).unwrap(), 49.2));
        assert!(close(m.e2el.mean, 275.0));
        // Peaks: A's 5 tokens and B's 2 all land in second 0; both in flight at t = 0.5.
        assert_eq!(m.max_output_tokens_per_s, 7.0);
        assert_eq!(m.max_concurrent_requests, 1, "A ends at 0.2, before B starts at 0.5");
    }

    #[test]
    fn single_token_requests_have_no_tpot_but_count_for_goodput() {
        let one = req(0.0, 0.010, &[], 1, 1);
        let m = calculate(&[one], 1.0, &[99.0], &Goodput::parse(&["tpot:1".into()]).unwrap());
        assert_eq!(m.tpot.mean, 0.0);
        assert_eq!(m.request_goodput, Some(1.0), "TPOT counts as 0 for goodput");
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let fast = req(0.0, 0.050, &[0.010; 9], 10, 5); // ttft 50 ms, tpot 10 ms, e2el 140 ms
        let slow_first = req(0.0, 0.500, &[0.010; 9], 10, 5); // ttft 500 ms
        let slow_decode = req(0.0, 0.050, &[0.100; 9], 10, 5); // tpot 100 ms
        let outs = [fast, slow_first, slow_decode];
        let g = Goodput::parse(&["ttft:100".into(), "tpot:20".into()]).unwrap();
        assert!(close(calculate(&outs, 2.0, &[99.0], &g).request_goodput.unwrap(), 0.5));
        let g = Goodput::parse(&["e2el:600".into()]).unwrap(); // e2el 140, 590, 950 ms
        assert!(close(calculate(&outs, 1.0, &[99.0], &g).request_goodput.unwrap(), 2.0));
        // An SLO equal to the value is met (vLLM: slo >= value).
        let g = Goodput { ttft_ms: Some(50.0), ..Default::default() };
        assert!(g.is_good(0.050, 0.0, 0.0));
        assert!(Goodput::parse(&["ttft=5".into()]).is_err());
        assert!(Goodput::parse(&["itl:5".into()]).is_err());
        assert!(Goodput::parse(&["ttft:-1".into()]).is_err());
        assert_eq!(Goodput::parse(&["ttft:5,e2el:9".into()]).unwrap().e2el_ms, Some(9.0));
    }

    #[test]
    fn peak_concurrency_uses_half_open_intervals() {
        let a = req(0.0, 0.5, &[0.5], 2, 1); // [0, 1)
        let b = req(1.0, 0.5, &[0.5], 2, 1); // [1, 2): touches A's end, not concurrent
        let c = req(0.5, 0.2, &[], 1, 1); // [0.5, 0.7): overlaps A
        assert_eq!(peaks(&[a, b, c]).1, 2);
    }
}
