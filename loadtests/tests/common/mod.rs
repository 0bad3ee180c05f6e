//! A tiny deterministic OpenAI-compatible SSE server for the end-to-end tests.
//!
//! HTTP/1.1 with keep-alive over raw tokio sockets, so every byte and every delay is under the
//! test's control. Tokenizer: one token per whitespace-separated word; `w<N>` is id N (id 0 is
//! BOS, added by /tokenize with add_special_tokens and to completions text prompts); id 7
//! decodes to the two words `w8 w9`; any other word hashes to an id in [10, 1000).
//! Streaming: the first token message is written `ttft + prefill_per_token * prompt_tokens`
//! after the request arrived, each next one `itl` after the previous write (so a late write
//! never makes a short gap), then the usage chunk and `[DONE]`. Every token-message write time
//! is logged for hand timing.
//! A prompt containing `FAIL` gets HTTP 500.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Server behaviour.
#[derive(Debug, Clone)]
pub struct MockConfig {
    pub ttft: Duration,
    pub itl: Duration,
    pub prefill_per_token: Duration,
    pub max_model_len: usize,
    /// Chat: this many leading tokens are `reasoning_content`, the rest `content`.
    pub reasoning_tokens: usize,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            ttft: Duration::from_millis(20),
            itl: Duration::from_millis(5),
            prefill_per_token: Duration::ZERO,
            max_model_len: 4096,
            reasoning_tokens: 2,
        }
    }
}

/// What the server saw and did for one generation request.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub path: String,
    pub body: Value,
    pub arrived: Instant,
    pub prompt_tokens: usize,
    /// When each token message was written (the role chunk shares the first token's write).
    pub writes: Vec<Instant>,
}

pub struct MockServer {
    pub base_url: String,
    pub log: Arc<Mutex<Vec<RequestLog>>>,
}

pub async fn start(cfg: MockConfig) -> MockServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (cfg, log2) = (Arc::new(cfg), log.clone());
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else { return };
            let _ = sock.set_nodelay(true);
            tokio::spawn(serve_conn(sock, cfg.clone(), log2.clone()));
        }
    });
    MockServer { base_url: format!("http://{addr}"), log }
}

fn word_id(w: &str) -> u32 {
    if let Some(n) = w.strip_prefix('w').and_then(|n| n.parse::<u32>().ok()) {
        return n;
    }
    let h = w.bytes().fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
    10 + h % 990
}

pub fn tokenize(text: &str, add_special: bool) -> Vec<u32> {
    add_special.then_some(0).into_iter().chain(text.split_whitespace().map(word_id)).collect()
}

pub fn detokenize(ids: &[u32]) -> String {
    ids.iter().map(|&i| if i == 7 { "w8 w9".to_string() } else { format!("w{i}") }).collect::<Vec<_>>().join(" ")
}

async fn serve_conn(mut sock: TcpStream, cfg: Arc<MockConfig>, log: Arc<Mutex<Vec<RequestLog>>>) {
    let mut buf = Vec::new();
    loop {
        // Head.
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            let mut chunk = [0u8; 8192];
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let arrived = Instant::now();
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_string();
        let len = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + 4 + len {
            let mut chunk = [0u8; 65536];
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value = serde_json::from_slice(&buf[head_end + 4..head_end + 4 + len]).unwrap_or(Value::Null);
        buf.drain(..head_end + 4 + len);
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let ok = match (method.as_str(), path.as_str()) {
            ("GET", "/v1/models") => {
                let v = json!({"object": "list", "data": [{"id": "mock-r1", "object": "model", "created": 0, "owned_by": "test",
                    "root": "mock-r1", "parent": null, "max_model_len": cfg.max_model_len}]});
                send_json(&mut sock, 200, &v).await
            }
            ("GET", "/health") => send_json(&mut sock, 200, &json!({})).await,
            ("POST", "/tokenize") => {
                let add = body.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
                let ids = tokenize(body["prompt"].as_str().unwrap_or(""), add);
                send_json(
                    &mut sock,
                    200,
                    &json!({"count": ids.len(), "max_model_len": cfg.max_model_len, "tokens": ids}),
                )
                .await
            }
            ("POST", "/detokenize") => {
                let ids: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap_or_default();
                send_json(&mut sock, 200, &json!({"prompt": detokenize(&ids)})).await
            }
            ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {
                generate(&mut sock, &cfg, &log, path.clone(), body, arrived).await
            }
            _ => {
                send_json(
                    &mut sock,
                    404,
                    &json!({"error": {"message": "not found", "type": "NotFound", "param": null, "code": 404}}),
                )
                .await
            }
        };
        if !ok {
            return;
        }
    }
}

async fn send_json(sock: &mut TcpStream, status: u16, v: &Value) -> bool {
    let body = v.to_string();
    let reason = if status == 200 { "OK" } else { "Error" };
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(msg.as_bytes()).await.is_ok()
}

async fn write_chunk(sock: &mut TcpStream, data: &str) -> bool {
    sock.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes()).await.is_ok()
}

async fn generate(
    sock: &mut TcpStream,
    cfg: &MockConfig,
    log: &Mutex<Vec<RequestLog>>,
    path: String,
    body: Value,
    arrived: Instant,
) -> bool {
    let chat = path.ends_with("chat/completions");
    let (prompt_tokens, text_for_fail) = if chat {
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let words: usize = msgs.iter().map(|m| tokenize(m["content"].as_str().unwrap_or(""), false).len() + 2).sum();
        (1 + words + 1, msgs.iter().map(|m| m["content"].as_str().unwrap_or("").to_string()).collect::<String>())
    } else {
        match &body["prompt"] {
            Value::String(s) => (tokenize(s, true).len(), s.clone()),
            Value::Array(a) => (a.len(), String::new()),
            _ => (0, String::new()),
        }
    };
    if text_for_fail.contains("FAIL") {
        let v = json!({"error": {"message": "injected failure", "type": "InternalServerError", "param": null, "code": 500}});
        return send_json(sock, 500, &v).await;
    }
    let n = body.get(if chat { "max_completion_tokens" } else { "max_tokens" }).and_then(Value::as_u64).unwrap_or(16)
        as usize;
    let usage = body["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
    if sock.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut due = arrived + cfg.ttft + cfg.prefill_per_token * prompt_tokens as u32;
    let mut writes: Vec<Instant> = vec![];
    for k in 0..n {
        if let Some(prev) = writes.last() {
            due = *prev + cfg.itl;
        }
        tokio::time::sleep_until(due.into()).await;
        let finish = if k + 1 == n { json!("length") } else { Value::Null };
        let word = format!(" w{}", 100 + k);
        let mut data = String::new();
        if chat {
            if k == 0 {
                let role = json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "mock-r1",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]});
                data.push_str(&format!("data: {role}\n\n"));
            }
            let delta =
                if k < cfg.reasoning_tokens { json!({"reasoning_content": word}) } else { json!({"content": word}) };
            let c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "mock-r1",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
            data.push_str(&format!("data: {c}\n\n"));
        } else {
            let c = json!({"id": "c1", "object": "text_completion", "created": 0, "model": "mock-r1",
                "choices": [{"index": 0, "text": word, "logprobs": null, "finish_reason": finish}]});
            data.push_str(&format!("data: {c}\n\n"));
        }
        if !write_chunk(sock, &data).await {
            return false;
        }
        writes.push(Instant::now());
    }
    // Logged before the last chunks, so a client that has seen [DONE] always finds its entry.
    log.lock().unwrap().push(RequestLog { path, body, arrived, prompt_tokens, writes });
    if usage {
        let u = json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "mock-r1", "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}});
        if !write_chunk(sock, &format!("data: {u}\n\n")).await {
            return false;
        }
    }
    write_chunk(sock, "data: [DONE]\n\n").await && sock.write_all(b"0\r\n\r\n").await.is_ok()
}

/// Runs the cleave-bench binary with `args`, off the async runtime; returns (success, stdout, stderr).
pub async fn run_bench(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cleave-bench"))
            .args(&args)
            .output()
            .expect("running cleave-bench");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    })
    .await
    .unwrap()
}

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cleave-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

pub fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}
