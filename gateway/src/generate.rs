//! Running a validated request: admission, one backend request per choice, then either an SSE
//! body fed by a task or one collected JSON body.
//!
//! Admission holds one slot per choice until the response is complete: for a stream, until its
//! body is finished or dropped. When the client goes away, hyper drops the body; the task sees
//! its channel close, drops the backend streams, and the backend aborts the requests and frees
//! their KV blocks.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{select_all, BoxStream};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::backend::TokenEvents;
use crate::choice::{OutputParsing, ResponseMeta};
use crate::collect::Collector;
use crate::errors::ApiError;
use crate::reasoning::ReasoningSplitter;
use crate::sse::StreamFormatter;
use crate::validate::{Endpoint, GenerateRequest};
use crate::State;

/// Chunks buffered between the generating task and a slow client.
const STREAM_BUFFER: usize = 64;
/// Events gathered into one body write when they are already waiting.
const MAX_BATCH: usize = 64;

type Merged = BoxStream<'static, (usize, Result<cleave_engine::TokenOutput, ApiError>)>;

/// The requests of one response in the gateway's in-flight gauge, lowered on drop. Admission
/// itself is the backend's (the cluster counts a request until no rank holds it any more).
pub(crate) struct Admission {
    gauge: prometheus::IntGauge,
    n: i64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gauge.sub(self.n);
    }
}

fn count_in_flight(state: &State, n: usize) -> Admission {
    state.metrics.in_flight.add(n as i64);
    Admission { gauge: state.metrics.in_flight.clone(), n: n as i64 }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A response id: a prefix and 32 hex digits from the clock, the process id and a counter,
/// mixed, so ids are unique within the process and unlikely to repeat across processes.
pub(crate) fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fn mix(mut x: u64) -> u64 {
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
        x ^ (x >> 31)
    }
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = mix(nanos ^ (u64::from(std::process::id()) << 40));
    format!("{prefix}-{a:016x}{:016x}", mix(a ^ c.wrapping_mul(0x9e3779b97f4a7c15)))
}

/// Submits one backend request per prompt and choice (prompt `p`'s choice `j` is choice
/// `p n + j`, with seed `seed + j`, as vLLM indexes them) and merges their streams, each item
/// tagged with its choice index.
async fn submit_all(state: &State, reqs: &[GenerateRequest], n: usize) -> Result<Merged, ApiError> {
    let at_limit = |limit| {
        state.metrics.rejected.inc();
        ApiError::TooManyRequests { limit, retry_after_s: state.cfg.retry_after_s }
    };
    // All choices fit, or none is submitted (a partial submit would hold slots while it aborts).
    let limit = state.cfg.max_concurrent_requests;
    if state.backend.load().running + reqs.len() * n > limit {
        return Err(at_limit(limit));
    }
    let mut streams: Vec<TokenEvents> = Vec::with_capacity(reqs.len() * n);
    for req in reqs {
        for j in 0..n {
            let mut params = req.params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            // On an error the streams submitted so far are dropped here, which aborts them.
            match state.backend.submit(req.prompt.clone(), params).await {
                Ok(s) => streams.push(s),
                Err(ApiError::TooManyRequests { limit, .. }) => return Err(at_limit(limit)),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(select_all(streams.into_iter().enumerate().map(|(i, s)| s.map(move |e| (i, e)))).boxed())
}

/// Serves a validated generation request: one per prompt, alike but for the prompt and its
/// `max_tokens` (a chat has one).
pub(crate) async fn run(state: Arc<State>, reqs: Vec<GenerateRequest>) -> Result<warp::reply::Response, ApiError> {
    let Some(req) = reqs.first() else { return Err(ApiError::Internal("a request without a prompt".into())) };
    let choices = reqs.len() * req.n;
    let admission = count_in_flight(&state, choices);
    let prefix = if req.endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let meta = ResponseMeta {
        id: new_id(prefix),
        created: unix_now(),
        model: state.info.served_model_name.clone(),
        endpoint: req.endpoint,
        prompt_tokens: reqs.iter().map(|r| r.prompt.len()).sum(),
        choices_per_prompt: req.n,
        include_usage: req.include_usage,
        logprobs: req.logprobs.is_some(),
    };
    info!(request_id = %meta.id, prompt_tokens = meta.prompt_tokens, prompts = reqs.len(), n = req.n, stream = req.stream, max_tokens = req.params.max_tokens, "admitted");
    let merged = submit_all(&state, &reqs, req.n)
        .await
        .inspect_err(|e| warn!(request_id = %meta.id, error = %e, "submit failed"))?;
    let think_start = state.tokenizer.as_ref().and_then(|t| t.token_to_id("<think>"));
    let parsing = OutputParsing {
        splitter: ReasoningSplitter::for_prompt(&req.prompt, think_start, state.info.think_end_id),
        include_reasoning: req.include_reasoning,
        tools: req.tools.clone(),
    };
    if req.stream {
        let fmt = StreamFormatter::new(meta, state.tokenizer.clone(), choices, parsing);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(stream_task(state.clone(), merged, fmt, tx));
        let body = SseBody { rx, _admission: admission };
        let mut res = warp::reply::Reply::into_response(warp::reply::stream(body));
        let h = res.headers_mut();
        h.insert("content-type", warp::http::HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", warp::http::HeaderValue::from_static("no-cache"));
        return Ok(res);
    }
    let collector = Collector::new(meta.clone(), state.tokenizer.clone(), choices, parsing);
    let body = collect(&state, &meta, merged, collector).await?;
    drop(admission);
    let mut res = warp::reply::Response::new(Bytes::from(body).into());
    res.headers_mut().insert("content-type", warp::http::HeaderValue::from_static("application/json"));
    Ok(res)
}

async fn collect(
    state: &State,
    meta: &ResponseMeta,
    mut merged: Merged,
    mut c: Collector,
) -> Result<Vec<u8>, ApiError> {
    let start = Instant::now();
    while let Some((i, ev)) = merged.next().await {
        match ev {
            Ok(t) => c.on_token(i, &t),
            Err(e) => {
                warn!(request_id = %meta.id, error = %e, "generation failed");
                return Err(e);
            }
        }
    }
    if !c.all_finished() {
        warn!(request_id = %meta.id, "a token stream ended without a finish reason");
        return Err(ApiError::Internal("a token stream ended without a finish reason".into()));
    }
    let usage = c.usage();
    state.metrics.completion_tokens.inc_by(usage.completion_tokens as u64);
    info!(request_id = %meta.id, completion_tokens = usage.completion_tokens, elapsed_ms = start.elapsed().as_millis() as u64, "finished");
    Ok(c.into_json())
}

/// Drives the merged token streams into SSE bytes until every choice finishes, an error occurs,
/// or the client goes away.
async fn stream_task(state: Arc<State>, mut merged: Merged, mut fmt: StreamFormatter, tx: mpsc::Sender<Bytes>) {
    let start = Instant::now();
    let id = fmt.id().to_string();
    let mut buf = Vec::with_capacity(1024);
    let mut done = false;
    while !done {
        let first = tokio::select! {
            biased;
            _ = tx.closed() => None,
            ev = merged.next() => Some(ev),
        };
        let Some(mut ev) = first else {
            state.metrics.client_disconnects.inc();
            debug!(request_id = %id, "client disconnected; aborting");
            break;
        };
        let mut batched = 0;
        loop {
            match ev {
                Some((i, Ok(t))) => fmt.on_token(i, &t, &mut buf),
                Some((_, Err(e))) => {
                    warn!(request_id = %id, error = %e, "generation failed after the stream started");
                    fmt.error(&e, &mut buf);
                    done = true;
                }
                None if fmt.all_finished() => {
                    fmt.finish(&mut buf);
                    done = true;
                }
                None => {
                    warn!(request_id = %id, "a token stream ended without a finish reason");
                    fmt.error(&ApiError::Internal("a token stream ended without a finish reason".into()), &mut buf);
                    done = true;
                }
            }
            batched += 1;
            if done || batched >= MAX_BATCH {
                break;
            }
            match merged.next().now_or_never() {
                Some(next) => ev = next,
                None => break,
            }
        }
        if buf.is_empty() {
            continue;
        }
        let chunk = Bytes::from(std::mem::replace(&mut buf, Vec::with_capacity(1024)));
        if tx.send(chunk).await.is_err() {
            state.metrics.client_disconnects.inc();
            debug!(request_id = %id, "client disconnected; aborting");
            break;
        }
    }
    let usage = fmt.usage();
    state.metrics.sse_events.inc_by(fmt.events());
    state.metrics.completion_tokens.inc_by(usage.completion_tokens as u64);
    info!(request_id = %id, completion_tokens = usage.completion_tokens, complete = done, elapsed_ms = start.elapsed().as_millis() as u64, "stream ended");
    // `merged` drops here: unfinished backend requests are aborted.
}

/// The body of a streaming response: chunks from the task, plus the admission slot it holds
/// until the body is finished or dropped.
struct SseBody {
    rx: mpsc::Receiver<Bytes>,
    _admission: Admission,
}

impl Stream for SseBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_prefixed_unique_hex() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| super::new_id("chatcmpl")).collect();
        assert_eq!(ids.len(), 10_000);
        let id = ids.iter().next().unwrap();
        assert!(id.starts_with("chatcmpl-") && id.len() == 9 + 32 && id[9..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
