//! One timed streaming request, measured as `vllm bench serve` measures it.
//!
//! The clock starts just before the request is sent. Every SSE message whose `choices` is
//! non-empty is a token message: the first one gives TTFT, the gaps between consecutive ones
//! are the ITLs, and the last one ends the request (E2EL). The usage chunk (`choices: []`)
//! carries the output token count and is not a token message.

use std::time::Instant;

use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::sse::{SseEvent, SseParser};
use super::{error_message, snippet};

/// Which OpenAI API a benchmark talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: `prompt` in, `choices[].text` out.
    Completions,
    /// `/v1/chat/completions`: `messages` in, `choices[].delta.{reasoning_content,content}` out.
    Chat,
}

impl Endpoint {
    /// Chat when the path ends in `chat/completions`, completions otherwise.
    pub fn from_path(path: &str) -> Self {
        if path.trim_end_matches('/').ends_with("chat/completions") {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        }
    }
}

/// What a request sends as its prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text (a completions `prompt`, or one user message for chat).
    Text(String),
    /// Token ids (completions only; servers that accept them skip tokenization).
    Tokens(Vec<u32>),
    /// Chat messages as given (`[{"role", "content"}, ...]`).
    Messages(Vec<Value>),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct RequestInput {
    /// The prompt.
    pub prompt: Prompt,
    /// Prompt tokens as the dataset counted them (the usage chunk overrides it).
    pub prompt_len: usize,
    /// `max_tokens` / `max_completion_tokens`.
    pub output_len: usize,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
    /// Extra fields merged into the body last (sampling parameters, ...).
    pub extra_body: Option<Map<String, Value>>,
}

/// What came back, with the timings. Times are seconds.
#[derive(Debug, Clone, Default)]
pub struct RequestOutput {
    /// A 200 with at least one token message and no error event.
    pub success: bool,
    /// Completions `text`, or chat `content`, concatenated.
    pub generated_text: String,
    /// Chat `reasoning_content` (or `reasoning`), concatenated.
    pub reasoning_text: String,
    /// `usage.completion_tokens` from the usage chunk, when the server sent one.
    pub output_tokens: Option<usize>,
    /// The input's `prompt_len`, replaced by `usage.prompt_tokens` when present.
    pub prompt_len: usize,
    /// Time to the first token message.
    pub ttft: f64,
    /// Gaps between consecutive token messages.
    pub itl: Vec<f64>,
    /// Time to the last token message (E2EL).
    pub latency: f64,
    /// When the request was sent, in seconds after the run's epoch.
    pub start_time: f64,
    /// Why it failed (empty on success).
    pub error: String,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// The usage object as sent.
    pub usage: Option<Value>,
}

impl RequestOutput {
    /// The output token count used for metrics: usage when present, else the number of token
    /// messages (the best a client without a tokenizer can do).
    pub fn output_len(&self) -> usize {
        self.output_tokens.unwrap_or(self.itl.len() + usize::from(self.success))
    }

    /// Reasoning followed by content: everything the model generated.
    pub fn full_text(&self) -> String {
        format!("{}{}", self.reasoning_text, self.generated_text)
    }
}

/// The arrival times of a request's token messages, turned into vLLM's metrics.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// When the request was sent.
    pub start: Instant,
    /// When each token message arrived.
    pub tokens: Vec<Instant>,
}

impl Timeline {
    /// Seconds from send to the first token message (0 when none came).
    pub fn ttft(&self) -> f64 {
        self.tokens.first().map_or(0.0, |t| t.duration_since(self.start).as_secs_f64())
    }

    /// Seconds between consecutive token messages.
    pub fn itl(&self) -> Vec<f64> {
        self.tokens.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64()).collect()
    }

    /// Seconds from send to the last token message (0 when none came).
    pub fn latency(&self) -> f64 {
        self.tokens.last().map_or(0.0, |t| t.duration_since(self.start).as_secs_f64())
    }
}

/// The JSON body for `input`, streaming with `stream_options.include_usage`.
pub fn build_payload(endpoint: Endpoint, model: &str, input: &RequestInput) -> Value {
    let mut body = match endpoint {
        Endpoint::Completions => {
            let prompt = match &input.prompt {
                Prompt::Text(t) => json!(t),
                Prompt::Tokens(ids) => json!(ids),
                Prompt::Messages(m) => json!(flatten_messages(m)),
            };
            json!({"model": model, "prompt": prompt, "max_tokens": input.output_len})
        }
        Endpoint::Chat => {
            let messages = match &input.prompt {
                Prompt::Text(t) => vec![json!({"role": "user", "content": t})],
                Prompt::Tokens(ids) => vec![json!({"role": "user", "content": format!("{ids:?}")})],
                Prompt::Messages(m) => m.clone(),
            };
            json!({"model": model, "messages": messages, "max_completion_tokens": input.output_len})
        }
    };
    let obj = body.as_object_mut().expect("object");
    obj.insert("stream".into(), json!(true));
    obj.insert("stream_options".into(), json!({"include_usage": true}));
    if input.ignore_eos {
        obj.insert("ignore_eos".into(), json!(true));
    }
    if let Some(extra) = &input.extra_body {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    body
}

/// Chat messages sent to a completions endpoint: their contents joined by blank lines.
fn flatten_messages(messages: &[Value]) -> String {
    messages.iter().filter_map(|m| m.get("content").and_then(Value::as_str)).collect::<Vec<_>>().join("\n\n")
}

/// Sends one streaming request to `url` and times it. Never fails: errors land in the output.
pub async fn send_request(
    http: &reqwest::Client,
    url: &str,
    endpoint: Endpoint,
    model: &str,
    input: &RequestInput,
    epoch: Instant,
) -> RequestOutput {
    let payload = build_payload(endpoint, model, input);
    let mut out = RequestOutput { prompt_len: input.prompt_len, ..Default::default() };
    let start = Instant::now();
    out.start_time = start.duration_since(epoch).as_secs_f64();
    let mut timeline = Timeline { start, tokens: Vec::new() };
    let result = stream_into(http, url, &payload, &mut out, &mut timeline).await;
    out.ttft = timeline.ttft();
    out.itl = timeline.itl();
    out.latency = timeline.latency();
    match result {
        Err(e) => {
            out.success = false;
            out.error = e;
        }
        Ok(()) if timeline.tokens.is_empty() => {
            out.success = false;
            out.error =
                "Never received a valid chunk to calculate TTFT. This response will be marked as failed!".into();
        }
        Ok(()) => out.success = true,
    }
    out
}

async fn stream_into(
    http: &reqwest::Client,
    url: &str,
    payload: &Value,
    out: &mut RequestOutput,
    timeline: &mut Timeline,
) -> Result<(), String> {
    let resp = http.post(url).json(payload).send().await.map_err(|e| format!("{url}: {}", error_chain(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        let msg = serde_json::from_slice::<Value>(&body).map(|v| error_message(&v)).unwrap_or_else(|_| snippet(&body));
        return Err(format!("HTTP {status}: {msg}"));
    }
    let mut parser = SseParser::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("reading the stream: {}", error_chain(&e)))?;
        for event in parser.push(&chunk) {
            if handle_event(event, out, timeline)? {
                return Ok(());
            }
        }
    }
    if let Some(event) = parser.finish() {
        handle_event(event, out, timeline)?;
    }
    Ok(())
}

/// Applies one SSE event; `Ok(true)` at `[DONE]`.
fn handle_event(event: SseEvent, out: &mut RequestOutput, timeline: &mut Timeline) -> Result<bool, String> {
    let data = match event {
        SseEvent::Done => return Ok(true),
        SseEvent::Data(d) => d,
    };
    let now = Instant::now();
    let v: Value =
        serde_json::from_str(&data).map_err(|e| format!("bad SSE JSON ({e}): {}", snippet(data.as_bytes())))?;
    apply_chunk(&v, now, out, timeline)
}

/// Applies one parsed chunk that arrived at `now`. Public for tests.
pub fn apply_chunk(v: &Value, now: Instant, out: &mut RequestOutput, timeline: &mut Timeline) -> Result<bool, String> {
    if v.get("error").is_some() {
        return Err(format!("stream error: {}", error_message(v)));
    }
    match v.get("choices").and_then(Value::as_array) {
        Some(choices) if !choices.is_empty() => {
            timeline.tokens.push(now);
            let c = &choices[0];
            if let Some(t) = c.get("text").and_then(Value::as_str) {
                out.generated_text.push_str(t);
            }
            if let Some(delta) = c.get("delta") {
                if let Some(t) = delta.get("content").and_then(Value::as_str) {
                    out.generated_text.push_str(t);
                }
                let reasoning = delta.get("reasoning_content").or_else(|| delta.get("reasoning"));
                if let Some(t) = reasoning.and_then(Value::as_str) {
                    out.reasoning_text.push_str(t);
                }
            }
            if let Some(r) = c.get("finish_reason").and_then(Value::as_str) {
                out.finish_reason = Some(r.to_string());
            }
        }
        _ => {}
    }
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        if let Some(n) = usage.get("completion_tokens").and_then(Value::as_u64) {
            out.output_tokens = Some(n as usize);
        }
        if let Some(n) = usage.get("prompt_tokens").and_then(Value::as_u64) {
            out.prompt_len = n as usize;
        }
        out.usage = Some(usage.clone());
    }
    Ok(false)
}

/// An error with its sources, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn timeline_gives_ttft_itl_and_latency() {
        let start = Instant::now();
        let tl = Timeline { start, tokens: vec![start + ms(100), start + ms(130), start + ms(150), start + ms(200)] };
        assert!((tl.ttft() - 0.100).abs() < 1e-9);
        let itl = tl.itl();
        assert_eq!(itl.len(), 3);
        for (got, want) in itl.iter().zip([0.030, 0.020, 0.050]) {
            assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
        assert!((tl.latency() - 0.200).abs() < 1e-9);
        let empty = Timeline { start, tokens: vec![] };
        assert_eq!((empty.ttft(), empty.itl().len(), empty.latency()), (0.0, 0, 0.0));
    }

    #[test]
    fn chunks_with_choices_are_tokens_usage_is_not() {
        let start = Instant::now();
        let mut out = RequestOutput::default();
        let mut tl = Timeline { start, tokens: vec![] };
        let chunks = [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning": " ok"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}),
        ];
        for (i, c) in chunks.iter().enumerate() {
            assert!(!apply_chunk(c, start + ms(10 * (i as u64 + 1)), &mut out, &mut tl).unwrap());
        }
        assert_eq!(tl.tokens.len(), 4, "the usage chunk is not a token message");
        assert_eq!(out.generated_text, "Hi");
        assert_eq!(out.reasoning_text, "hmm ok");
        assert_eq!(out.output_tokens, Some(3));
        assert_eq!(out.prompt_len, 9);
        assert_eq!(out.finish_reason.as_deref(), Some("stop"));
        assert!((tl.latency() - 0.040).abs() < 1e-9, "E2EL ends at the last token message, not the usage chunk");
        let err = apply_chunk(&json!({"error": {"message": "boom"}}), start, &mut out, &mut tl).unwrap_err();
        assert!(err.contains("boom"));
    }

    #[test]
    fn payloads_match_vllm_shapes() {
        let input = RequestInput {
            prompt: Prompt::Text("hello".into()),
            prompt_len: 1,
            output_len: 7,
            ignore_eos: true,
            extra_body: Some(serde_json::from_str(r#"{"temperature": 0}"#).unwrap()),
        };
        let c = build_payload(Endpoint::Completions, "m", &input);
        assert_eq!(c["prompt"], "hello");
        assert_eq!(c["max_tokens"], 7);
        assert_eq!(c["stream"], true);
        assert_eq!(c["stream_options"]["include_usage"], true);
        assert_eq!(c["ignore_eos"], true);
        assert_eq!(c["temperature"], 0);
        let ch = build_payload(Endpoint::Chat, "m", &input);
        assert_eq!(ch["messages"], json!([{"role": "user", "content": "hello"}]));
        assert_eq!(ch["max_completion_tokens"], 7);
        let toks = RequestInput { prompt: Prompt::Tokens(vec![1, 2]), ignore_eos: false, extra_body: None, ..input };
        let c = build_payload(Endpoint::Completions, "m", &toks);
        assert_eq!(c["prompt"], json!([1, 2]));
        assert!(c.get("ignore_eos").is_none());
        assert_eq!(Endpoint::from_path("/v1/chat/completions"), Endpoint::Chat);
        assert_eq!(Endpoint::from_path("/v1/completions"), Endpoint::Completions);
    }
}
