//! The gateway's own Prometheus counters, appended to the cluster's text at `/metrics`.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// Counters of one gateway instance (each instance has its own registry, so several servers can
/// run in one process, as the tests do).
#[derive(Clone)]
pub struct GatewayMetrics {
    registry: Registry,
    /// HTTP requests by route and status code.
    pub requests: IntCounterVec,
    /// SSE events written (chunks, usage, errors, `[DONE]`).
    pub sse_events: IntCounter,
    /// Streams whose client went away before the end.
    pub client_disconnects: IntCounter,
    /// Requests refused by admission control (429).
    pub rejected: IntCounter,
    /// Generation requests holding an admission slot now (one per choice).
    pub in_flight: IntGauge,
    /// Completion tokens sent.
    pub completion_tokens: IntCounter,
}

impl GatewayMetrics {
    /// Registers the gateway's metrics in a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("cleave_gateway_http_requests_total", "HTTP requests by route and status"),
            &["route", "status"],
        )
        .expect("valid metric");
        let sse_events =
            IntCounter::new("cleave_gateway_sse_events_total", "SSE events written").expect("valid metric");
        let client_disconnects =
            IntCounter::new("cleave_gateway_client_disconnects_total", "Streams aborted because the client went away")
                .expect("valid metric");
        let rejected = IntCounter::new(
            "cleave_gateway_admission_rejected_total",
            "Requests refused with 429 by admission control",
        )
        .expect("valid metric");
        let in_flight =
            IntGauge::new("cleave_gateway_requests_in_flight", "Admitted generation requests (one per choice)")
                .expect("valid metric");
        let completion_tokens =
            IntCounter::new("cleave_gateway_completion_tokens_total", "Completion tokens sent to clients")
                .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(sse_events.clone()),
            Box::new(client_disconnects.clone()),
            Box::new(rejected.clone()),
            Box::new(in_flight.clone()),
            Box::new(completion_tokens.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        GatewayMetrics { registry, requests, sse_events, client_disconnects, rejected, in_flight, completion_tokens }
    }

    /// Counts one answered HTTP request.
    pub fn observe(&self, route: &str, status: u16) {
        self.requests.with_label_values(&[route, &status.to_string()]).inc();
    }

    /// The gateway's metrics in Prometheus text format.
    pub fn text(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}
