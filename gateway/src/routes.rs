//! HTTP routing: one warp filter that reads the method, path and (size-limited) body and
//! dispatches by hand, so every answer, including unknown paths and wrong methods, goes through
//! [`ApiError::into_response`] and is counted.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde_json::json;
use warp::http::{HeaderMap, Method, StatusCode};
use warp::reply::Response;
use warp::Filter;

use crate::errors::ApiError;
use crate::validate::Validator;
use crate::{generate, State};

/// The whole API as one filter.
pub(crate) fn api(state: Arc<State>) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::method().and(warp::path::full()).and(warp::header::headers_cloned()).and(warp::body::stream()).then(
        move |method: Method, path: warp::path::FullPath, headers: HeaderMap, body| {
            let state = state.clone();
            async move { handle(state, method, path.as_str(), headers, body).await }
        },
    )
}

/// Known paths and the method each takes.
const ROUTES: &[(&str, Method)] = &[
    ("/v1/chat/completions", Method::POST),
    ("/v1/completions", Method::POST),
    ("/v1/models", Method::GET),
    ("/health", Method::GET),
    ("/metrics", Method::GET),
    ("/tokenize", Method::POST),
    ("/detokenize", Method::POST),
    ("/version", Method::GET),
    ("/admin/fault", Method::POST),
];

async fn handle<S, B>(state: Arc<State>, method: Method, path: &str, headers: HeaderMap, body: S) -> Response
where
    S: Stream<Item = Result<B, warp::Error>> + Send + 'static,
    B: Buf,
{
    let known = ROUTES.iter().find(|(p, _)| *p == path && (*p != "/admin/fault" || state.cfg.fault_injection));
    let route = known.map_or("other", |(p, _)| *p);
    let locked = path.starts_with("/v1/") || path == "/v1" || path.starts_with("/admin/");
    let cors = allowed_origin(&headers, &state.cfg.allowed_origins);
    if method == Method::OPTIONS && known.is_some() && cors.is_some() {
        return with_cors(preflight(), cors);
    }
    let result = match known {
        _ if locked && !authorized(&headers, state.cfg.api_key.as_deref()) => Err(ApiError::Unauthorized),
        None => Err(ApiError::NotFound(path.to_string())),
        Some((_, m)) if *m != method && !(method == Method::HEAD && *m == Method::GET) => {
            Err(ApiError::MethodNotAllowed)
        }
        Some((p, m)) if *m == Method::GET => get(&state, p).await,
        Some((p, _)) => match json_body(&headers) {
            Ok(()) => match read_body(&headers, body, state.cfg.max_body_bytes, state.cfg.body_timeout).await {
                Ok(bytes) => post(&state, p, bytes).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
    };
    let res = result.unwrap_or_else(|e| {
        tracing::debug!(route, error = %e, "request refused");
        e.into_response()
    });
    state.metrics.observe(route, res.status().as_u16());
    with_cors(res, cors)
}

/// Refuses a body declared as anything but JSON (`application/json`, `*/*+json`); a body
/// without a Content-Type is read as JSON (curl without `-H`).
fn json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get("content-type") else { return Ok(()) };
    let text = String::from_utf8_lossy(ct.as_bytes()).to_ascii_lowercase();
    let mime = text.split(';').next().unwrap_or("").trim();
    if mime == "application/json" || mime.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(mime.to_string()))
    }
}

/// The request's Origin when it is allowed.
fn allowed_origin(headers: &HeaderMap, allowed: &[String]) -> Option<warp::http::HeaderValue> {
    let origin = headers.get("origin")?;
    let o = origin.to_str().ok()?;
    allowed.iter().any(|a| a == "*" || a == o).then(|| origin.clone())
}

/// A CORS preflight's answer (only for allowed origins).
fn preflight() -> Response {
    let mut res = Response::new(Bytes::new().into());
    *res.status_mut() = StatusCode::NO_CONTENT;
    let h = res.headers_mut();
    h.insert("access-control-allow-methods", warp::http::HeaderValue::from_static("GET, POST, OPTIONS"));
    h.insert("access-control-allow-headers", warp::http::HeaderValue::from_static("authorization, content-type"));
    h.insert("access-control-max-age", warp::http::HeaderValue::from_static("600"));
    res
}

fn with_cors(mut res: Response, origin: Option<warp::http::HeaderValue>) -> Response {
    if let Some(o) = origin {
        res.headers_mut().insert("access-control-allow-origin", o);
        res.headers_mut().insert("vary", warp::http::HeaderValue::from_static("origin"));
    }
    res
}

/// Whether `headers` carry `Authorization: Bearer <key>` (always, when no key is set). The
/// comparison takes the same time wherever the first difference is.
fn authorized(headers: &HeaderMap, key: Option<&str>) -> bool {
    let Some(key) = key else { return true };
    let Some(value) = headers.get("authorization").map(|v| v.as_bytes()) else { return false };
    let Some(token) = value.get(..7).filter(|s| s.eq_ignore_ascii_case(b"bearer ")).map(|_| &value[7..]) else {
        return false;
    };
    constant_time_eq(token, key.as_bytes())
}

/// `a == b` in time that depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let diff = (0..n).fold(a.len() ^ b.len(), |acc, i| {
        acc | (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize
    });
    diff == 0
}

/// How much of a refused (413) body is still read and dropped, and for how long, so that a client
/// still writing it gets the 413 rather than a broken connection (a bounded lingering close).
const DRAIN_BYTES: usize = 4 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and drops what is left of a refused body, up to [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain<S, B>(mut body: std::pin::Pin<&mut S>)
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let deadline = tokio::time::Instant::now() + DRAIN_TIME;
    let mut seen = 0;
    while seen <= DRAIN_BYTES {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(chunk))) => seen += chunk.remaining(),
            _ => return,
        }
    }
}

/// Reads the body, refusing it (413) once it exceeds `limit` bytes and (408) when it has not
/// arrived within `timeout`.
async fn read_body<S, B>(headers: &HeaderMap, body: S, limit: usize, timeout: Duration) -> Result<Bytes, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>> + Send + 'static,
    B: Buf,
{
    let declared = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let mut body = std::pin::pin!(body);
    if declared.is_some_and(|n| n > limit as u64) {
        drain(body).await;
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    let deadline = tokio::time::Instant::now() + timeout;
    let late = || ApiError::BodyTimeout(timeout.as_secs());
    while let Some(chunk) = tokio::time::timeout_at(deadline, body.next()).await.map_err(|_| late())? {
        let mut chunk = chunk.map_err(|e| ApiError::InvalidRequest(format!("cannot read the request body: {e}")))?;
        if buf.len() + chunk.remaining() > limit {
            drain(body).await;
            return Err(ApiError::PayloadTooLarge { limit });
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            let n = part.len();
            buf.extend_from_slice(part);
            chunk.advance(n);
        }
    }
    Ok(buf.freeze())
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut res = Response::new(Bytes::from(value.to_string()).into());
    *res.status_mut() = status;
    res.headers_mut().insert("content-type", warp::http::HeaderValue::from_static("application/json"));
    res
}

async fn get(state: &State, path: &str) -> Result<Response, ApiError> {
    match path {
        "/health" => {
            let status = if state.backend.healthy() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            let mut res = Response::new(Bytes::new().into());
            *res.status_mut() = status;
            Ok(res)
        }
        "/v1/models" => {
            let info = &state.info;
            let model = json!({
                "id": info.served_model_name,
                "object": "model",
                "created": state.started,
                "owned_by": "cleave",
                "root": state.cfg.model_root,
                "parent": null,
                "max_model_len": info.max_model_len,
                "permission": [],
            });
            Ok(json_response(StatusCode::OK, &json!({"object": "list", "data": [model]})))
        }
        "/metrics" => {
            let mut text = state.backend.metrics_text();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&state.metrics.text());
            let mut res = Response::new(Bytes::from(text).into());
            res.headers_mut().insert("content-type", warp::http::HeaderValue::from_static("text/plain; version=0.0.4"));
            Ok(res)
        }
        "/version" => Ok(json_response(StatusCode::OK, &json!({"version": env!("CARGO_PKG_VERSION")}))),
        _ => Err(ApiError::NotFound(path.to_string())),
    }
}

/// A POST body, parsed and tokenized.
enum Parsed {
    /// One request per prompt (chat: one).
    Generate(Vec<crate::validate::GenerateRequest>),
    Tokenized(Vec<u32>),
    Detokenize(Vec<u32>),
}

/// Parses and tokenizes `body` on a blocking thread, at most `state.parsing` at once: a large
/// prompt never stalls the runtime that serves every other connection.
async fn parse(state: &Arc<State>, path: &'static str, body: Bytes) -> Result<Parsed, ApiError> {
    let permit = state.parsing.clone().acquire_owned().await.map_err(|_| ApiError::Internal("parser closed".into()))?;
    let st = state.clone();
    let work = move || {
        let _permit = permit;
        let v = Validator {
            info: &st.info,
            tokenizer: st.tokenizer.as_deref(),
            defaults: &st.cfg.defaults,
            max_n: st.max_n(),
        };
        match path {
            "/v1/chat/completions" => v.chat(&body).map(|r| Parsed::Generate(vec![r])),
            "/v1/completions" => v.completion(&body).map(Parsed::Generate),
            "/tokenize" => v.tokenize(&body).map(Parsed::Tokenized),
            "/detokenize" => v.detokenize(&body).map(Parsed::Detokenize),
            _ => Err(ApiError::NotFound(path.to_string())),
        }
    };
    tokio::task::spawn_blocking(work).await.map_err(|e| ApiError::Internal(format!("request parser: {e}")))?
}

async fn post(state: &Arc<State>, path: &'static str, body: Bytes) -> Result<Response, ApiError> {
    if path == "/admin/fault" {
        return inject_fault(state, &body);
    }
    match parse(state, path, body).await? {
        Parsed::Generate(reqs) => generate::run(state.clone(), reqs).await,
        Parsed::Tokenized(tokens) => Ok(json_response(
            StatusCode::OK,
            &json!({"count": tokens.len(), "max_model_len": state.info.max_model_len, "tokens": tokens, "token_strs": null}),
        )),
        Parsed::Detokenize(tokens) => {
            let tok = state
                .tokenizer
                .as_deref()
                .ok_or_else(|| ApiError::InvalidRequest("this model has no tokenizer".into()))?;
            Ok(json_response(StatusCode::OK, &json!({"prompt": tok.decode(&tokens, false)?})))
        }
    }
}

/// `POST /admin/fault {"rank": R, "fault": "panic" | "panic_on_kv_send" | "fail_kv_send" |
/// "hang" | "slow_step" | "panic_on_group_rank", "ms": for hang and slow_step, "group_rank":
/// for panic_on_group_rank}`: a one-shot fault, as the Rust API's `Cluster::inject_fault`.
fn inject_fault(state: &State, body: &[u8]) -> Result<Response, ApiError> {
    use cleave_actors::Fault;
    let obj = crate::validate::parse_object(body)?;
    let int = |k: &str| obj.get(k).and_then(serde_json::Value::as_u64);
    let rank = int("rank").ok_or_else(|| ApiError::field("rank", "`rank` (a configured rank id) is required"))?;
    let ms =
        || int("ms").map(std::time::Duration::from_millis).ok_or_else(|| ApiError::field("ms", "`ms` is required"));
    let fault = match obj.get("fault").and_then(serde_json::Value::as_str) {
        Some("panic") => Fault::Panic,
        Some("panic_on_kv_send") => Fault::PanicOnKvSend,
        Some("fail_kv_send") => Fault::FailKvSend,
        Some("hang") => Fault::Hang(ms()?),
        Some("slow_step") => Fault::SlowStep(ms()?),
        Some("panic_on_group_rank") => Fault::PanicOnGroupRank(
            int("group_rank").ok_or_else(|| ApiError::field("group_rank", "`group_rank` is required"))? as usize,
        ),
        other => {
            return Err(ApiError::field(
                "fault",
                format!(
                    "`fault` must be panic, panic_on_kv_send, fail_kv_send, hang, slow_step or panic_on_group_rank, got {other:?}"
                ),
            ))
        }
    };
    if !state.backend.inject_fault(rank as usize, fault) {
        return Err(ApiError::field("rank", format!("no rank {rank} in this deployment")));
    }
    tracing::warn!(rank, ?fault, "fault injected through /admin/fault");
    Ok(json_response(StatusCode::OK, &json!({"injected": format!("{fault:?}"), "rank": rank})))
}

/// Answers a rejection warp raised itself (only possible when the body was taken twice).
pub(crate) async fn recover(_: warp::Rejection) -> Result<Response, Infallible> {
    Ok(ApiError::Internal("unhandled request".into()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_key_is_authorized() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("authorization", v.parse().unwrap());
            h
        };
        assert!(authorized(&HeaderMap::new(), None));
        assert!(!authorized(&HeaderMap::new(), Some("k1")));
        assert!(authorized(&with("Bearer k1"), Some("k1")));
        assert!(authorized(&with("bearer k1"), Some("k1")));
        for bad in ["Bearer k2", "Bearer k1x", "Bearer k", "Bearer ", "k1", "Basic k1", "Bearer  k1"] {
            assert!(!authorized(&with(bad), Some("k1")), "{bad}");
        }
        assert!(constant_time_eq(b"", b"") && !constant_time_eq(b"a", b"") && !constant_time_eq(b"ab", b"ac"));
    }
}
