//! The cluster's Prometheus registry. Counters and histograms are updated where things happen;
//! per-rank gauges are refreshed from the ranks' published state when the text is rendered.
//! Every series carries a `model_name` label (the served model name), as vLLM's do.

use std::collections::HashMap;

use prometheus::{
    Counter, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric of the control plane, prefixed `cleave_`.
pub struct Metrics {
    registry: Registry,
    /// `route` = `prefill_pool` | `decode_local`.
    pub router_requests: IntCounterVec,
    /// `reason` = `stop` | `length` | `error` | `abort`.
    pub requests_finished: IntCounterVec,
    /// `pool` = `prefill` | `decode`: requests assigned to the pool and not yet scheduled.
    pub queue_depth: IntGaugeVec,
    /// `rank`, `pool`: sequences in the rank's running batch.
    pub running: IntGaugeVec,
    /// `rank`, `pool`: sequences waiting on the rank.
    pub waiting: IntGaugeVec,
    /// `rank`, `pool`: KV blocks allocated (running, held for transfer, reserved for one).
    pub kv_blocks_in_use: IntGaugeVec,
    /// `rank`, `pool`: KV blocks of the rank.
    pub kv_blocks_total: IntGaugeVec,
    /// `rank`, `pool`: fraction of the rank's KV blocks in use (vLLM's `kv_cache_usage_perc`).
    pub kv_usage: GaugeVec,
    /// `rank`, `pool`: running sequences preempted (their KV freed, recomputed later).
    pub preemptions: IntCounterVec,
    /// `rank`, `pool`: prompt tokens looked up in the prefix cache, and those found there
    /// (vLLM's `prefix_cache_queries` / `prefix_cache_hits`).
    pub prefix_queries: IntCounterVec,
    pub prefix_hits: IntCounterVec,
    /// `rank`, `pool`: hits over queries since the rank started (0-1).
    pub prefix_hit_rate: GaugeVec,
    /// `rank`, `pool`: blocks holding a cached prefix (in use or evictable).
    pub prefix_cached_blocks: IntGaugeVec,
    /// `rank`, `pool`: cached blocks evicted to make room.
    pub prefix_evictions: IntCounterVec,
    /// Requests admitted and not yet gone from every rank.
    pub in_flight: IntGauge,
    pub kv_transfers: IntCounter,
    pub kv_transfer_bytes: IntCounter,
    pub kv_transfer_seconds: Counter,
    /// Time from the first token to the decode rank admitting the sequence, per transfer.
    pub kv_transfer_latency: Histogram,
    /// Bytes of KV per transfer.
    pub kv_transfer_size: Histogram,
    /// `reason` = `timeout` | `error` | `rank_failed`.
    pub kv_transfer_failures: IntCounterVec,
    /// `pool`: rank restarts after a panic, an error or a missed heartbeat.
    pub rank_restarts: IntCounterVec,
    /// Requests re-run on a decode rank after a failure (`failure_policy: recompute`).
    pub recomputes: IntCounter,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// Submission to the request's first computed chunk.
    pub queue_time: Histogram,
    /// First computed chunk to the first token.
    pub prefill_time: Histogram,
    /// First token to the last.
    pub decode_time: Histogram,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone())).expect("metric names are unique");
    m
}

impl Metrics {
    /// A fresh registry (one per cluster, so that tests do not share counters) whose series
    /// carry `model_name`.
    pub fn new(model_name: &str) -> Self {
        let labels = HashMap::from([("model_name".to_string(), model_name.to_string())]);
        let r = Registry::new_custom(None, Some(labels)).expect("a valid constant label");
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(&r, IntCounterVec::new(Opts::new(name, help), labels).unwrap())
        };
        let gauge_vec =
            |name: &str, help: &str, labels: &[&str]| reg(&r, IntGaugeVec::new(Opts::new(name, help), labels).unwrap());
        let counter = |name: &str, help: &str| reg(&r, IntCounter::new(name, help).unwrap());
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            reg(&r, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).unwrap())
        };
        let m = Metrics {
            router_requests: counter_vec("cleave_router_requests_total", "Requests routed, by route", &["route"]),
            requests_finished: counter_vec("cleave_requests_finished_total", "Requests ended, by reason", &["reason"]),
            queue_depth: gauge_vec("cleave_queue_depth", "Requests queued on a pool and not yet scheduled", &["pool"]),
            running: gauge_vec("cleave_num_requests_running", "Sequences in a rank's running batch", &["rank", "pool"]),
            waiting: gauge_vec("cleave_num_requests_waiting", "Sequences waiting on a rank", &["rank", "pool"]),
            kv_blocks_in_use: gauge_vec(
                "cleave_kv_blocks_in_use",
                "KV cache blocks allocated on a rank",
                &["rank", "pool"],
            ),
            kv_blocks_total: gauge_vec("cleave_kv_blocks_total", "KV cache blocks of a rank", &["rank", "pool"]),
            kv_usage: reg(
                &r,
                GaugeVec::new(
                    Opts::new("cleave_kv_cache_usage_perc", "Fraction of a rank's KV cache blocks in use (0-1)"),
                    &["rank", "pool"],
                )
                .unwrap(),
            ),
            preemptions: counter_vec(
                "cleave_num_preemptions_total",
                "Running sequences preempted for lack of KV blocks",
                &["rank", "pool"],
            ),
            prefix_queries: counter_vec(
                "cleave_prefix_cache_queries_total",
                "Prompt tokens looked up in a rank's prefix cache",
                &["rank", "pool"],
            ),
            prefix_hits: counter_vec(
                "cleave_prefix_cache_hits_total",
                "Prompt tokens found in a rank's prefix cache",
                &["rank", "pool"],
            ),
            prefix_hit_rate: reg(
                &r,
                GaugeVec::new(
                    Opts::new("cleave_prefix_cache_hit_rate", "Prompt tokens found cached over those looked up (0-1)"),
                    &["rank", "pool"],
                )
                .unwrap(),
            ),
            prefix_cached_blocks: gauge_vec(
                "cleave_prefix_cache_blocks",
                "KV blocks holding a cached prefix on a rank (in use or evictable)",
                &["rank", "pool"],
            ),
            prefix_evictions: counter_vec(
                "cleave_prefix_cache_evictions_total",
                "Cached KV blocks evicted to make room",
                &["rank", "pool"],
            ),
            in_flight: reg(
                &r,
                IntGauge::new("cleave_num_requests_in_flight", "Requests admitted and not yet finished").unwrap(),
            ),
            kv_transfers: counter("cleave_kv_transfers_total", "Completed prefill-to-decode KV transfers"),
            kv_transfer_bytes: counter(
                "cleave_kv_transfer_bytes_total",
                "Bytes of KV moved from prefill to decode ranks",
            ),
            kv_transfer_seconds: reg(
                &r,
                Counter::new(
                    "cleave_kv_transfer_seconds_total",
                    "Time from first token to the decode rank admitting the sequence",
                )
                .unwrap(),
            ),
            kv_transfer_latency: hist(
                "cleave_kv_transfer_latency_seconds",
                "Time from the first token to the decode rank admitting the sequence",
                &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
            ),
            kv_transfer_size: hist(
                "cleave_kv_transfer_size_bytes",
                "Bytes of latent KV moved per transfer",
                &[1e4, 1e5, 1e6, 4e6, 1.6e7, 6.4e7, 2.56e8, 1e9, 4e9],
            ),
            kv_transfer_failures: counter_vec(
                "cleave_kv_transfer_failures_total",
                "KV transfers that failed, by reason",
                &["reason"],
            ),
            rank_restarts: counter_vec("cleave_rank_restarts_total", "Ranks restarted after a failure", &["pool"]),
            recomputes: counter("cleave_recomputes_total", "Requests recomputed on a decode rank after a failure"),
            prompt_tokens: counter("cleave_prompt_tokens_total", "Prompt tokens of admitted requests"),
            generation_tokens: counter("cleave_generation_tokens_total", "Tokens sent to clients"),
            ttft: hist(
                "cleave_time_to_first_token_seconds",
                "Time from submission to the first token",
                &[
                    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0,
                ],
            ),
            itl: hist(
                "cleave_inter_token_latency_seconds",
                "Time between consecutive tokens of a request",
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                    0.5, 0.75, 1.0, 2.5,
                ],
            ),
            e2e: hist(
                "cleave_e2e_request_latency_seconds",
                "Time from submission to the last token",
                &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0],
            ),
            queue_time: hist(
                "cleave_request_queue_time_seconds",
                "Time from submission to the request's first computed chunk",
                PHASE_BUCKETS,
            ),
            prefill_time: hist(
                "cleave_request_prefill_time_seconds",
                "Time from the first computed chunk to the first token",
                PHASE_BUCKETS,
            ),
            decode_time: hist(
                "cleave_request_decode_time_seconds",
                "Time from the first token to the last",
                PHASE_BUCKETS,
            ),
            registry: r,
        };
        // Every series of a known label value exists from the start (at 0), so dashboards and
        // rate() see it before the first event.
        for route in ["prefill_pool", "decode_local"] {
            m.router_requests.with_label_values(&[route]);
        }
        for reason in ["timeout", "error", "rank_failed"] {
            m.kv_transfer_failures.with_label_values(&[reason]);
        }
        for pool in ["prefill", "decode"] {
            m.rank_restarts.with_label_values(&[pool]);
        }
        m
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
    }
}

/// Buckets of the request phases (vLLM's request_*_time_seconds).
const PHASE_BUCKETS: &[f64] =
    &[0.003, 0.01, 0.03, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1200.0];
