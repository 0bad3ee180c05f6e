//! Helpers for the HTTP tests: a real cluster on the golden bf16-qlora checkpoint (random
//! weights, but a tokenizer with `</think>` and the R1 chat template) behind a real gateway on a
//! free port, and an SSE parser that reads events the way `vllm bench serve` does.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cleave_actors::config::DeployConfig;
use cleave_actors::{Cluster, ClusterStats};
use cleave_gateway::{GatewayConfig, Server};
use serde_json::{json, Value};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

pub fn golden() -> PathBuf {
    repo().join("models/golden/bf16-qlora")
}

/// The served name of the golden model in these tests.
pub const MODEL: &str = "golden";

/// A deployment of `model` on one CPU rank (colocated), or one prefill and one decode rank.
pub fn yaml(model: &std::path::Path, name: &str, max_concurrent: usize, disaggregated: bool) -> String {
    let pools = if disaggregated {
        "prefill: {ranks: [0], tensor_parallel_size: 1, max_num_batched_tokens: 2048}\ndecode: {ranks: [1], tensor_parallel_size: 1, max_num_seqs: 128, max_num_batched_tokens: 512}\nrouter: {prefill_threshold: 16, max_prefill_queue: 32}"
    } else {
        "prefill: {ranks: []}\ndecode: {ranks: [0], tensor_parallel_size: 1, max_num_seqs: 128, max_num_batched_tokens: 512}"
    };
    format!(
        "model: {}\nserved_model_name: {name}\ndevice: cpu\nserver: {{host: 127.0.0.1, port: 0, max_concurrent_requests: {max_concurrent}}}\n{pools}\nkv_cache: {{block_size: 64, num_blocks: 256}}\nkv_transfer: {{timeout_ms: 10000, failure_policy: recompute}}\n",
        model.display()
    )
}

/// A shipped config (`configs/NAME`) serving the trained default, tiny-r1, on a free port;
/// `None` (with a message) when the trained weights are absent.
pub fn tiny_r1_config(name: &str) -> Option<String> {
    let model = repo().join("models/tiny-r1");
    if !model.join("model.safetensors").is_file() {
        eprintln!("skipping: models/tiny-r1 has no trained weights");
        return None;
    }
    let text = std::fs::read_to_string(repo().join("configs").join(name)).expect("shipped config");
    Some(text.replace("model: models/tiny-r1", &format!("model: {}", model.display())).replace("port: 8000", "port: 0"))
}

/// Writes `text` to a fresh temp file and returns its path.
pub fn temp_file(text: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "cleave-gw-test-{}-{}.yaml",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).expect("write temp config");
    path
}

/// A cluster and the gateway in front of it.
pub struct TestServer {
    pub url: String,
    pub cluster: Cluster,
    pub server: Option<Server>,
    pub client: reqwest::Client,
}

impl TestServer {
    /// The golden model, colocated, with `max_concurrent` admission slots.
    pub async fn golden(max_concurrent: usize) -> TestServer {
        Self::from_yaml(&yaml(&golden(), MODEL, max_concurrent, false), |_| {}).await
    }

    /// Starts the deployment in `yaml` (written to a temp file and read back as `cleave serve`
    /// does), with `edit` applied to the gateway settings.
    pub async fn from_yaml(yaml: &str, edit: impl FnOnce(&mut GatewayConfig)) -> TestServer {
        let path = temp_file(yaml);
        let cfg = DeployConfig::from_yaml_file(&path).expect("valid test config");
        let _ = std::fs::remove_file(&path);
        let mut gw = GatewayConfig::from_deploy(&cfg).expect("gateway config");
        edit(&mut gw);
        // With an API key, the test client sends it on every request (as an OpenAI client does).
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &gw.api_key {
            headers.insert("authorization", format!("Bearer {key}").parse().expect("header value"));
        }
        let client = reqwest::Client::builder().default_headers(headers).build().expect("client");
        let cluster = tokio::task::spawn_blocking(move || Cluster::start(cfg)).await.unwrap().expect("cluster starts");
        let server =
            Server::start(Arc::new(cluster.clone()), gw, "127.0.0.1:0".parse().unwrap()).await.expect("gateway starts");
        let url = format!("http://{}", server.local_addr());
        TestServer { url, cluster, server: Some(server), client }
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client.post(format!("{}{path}", self.url)).json(body).send().await.expect("request sent")
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(format!("{}{path}", self.url)).send().await.expect("request sent")
    }

    /// POSTs and returns (status, JSON body).
    pub async fn json(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.post(path, body).await;
        let status = r.status().as_u16();
        (status, r.json().await.expect("JSON body"))
    }

    /// POSTs a streaming request and returns the parsed events (checking the framing).
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Event> {
        let r = self.post(path, body).await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        parse_sse(&r.text().await.expect("body"))
    }

    /// Waits for the cluster to hold no request and no KV block.
    pub fn wait_idle(&self) -> ClusterStats {
        self.cluster.wait_idle(Duration::from_secs(20))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.cluster.shutdown();
    }
}

/// One SSE event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Json(Value),
    Done,
}

impl Event {
    pub fn json(&self) -> &Value {
        match self {
            Event::Json(v) => v,
            Event::Done => panic!("[DONE] has no JSON"),
        }
    }
}

/// Parses a complete SSE body exactly as `vllm bench serve` does: events end with a blank line,
/// each is `data: ` (with the space) and JSON, the last is `data: [DONE]`.
pub fn parse_sse(body: &str) -> Vec<Event> {
    assert!(body.ends_with("\n\n"), "the stream ends with a blank line: {body:?}");
    let events: Vec<Event> = body[..body.len() - 2]
        .split("\n\n")
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("event without `data: `: {e:?}"));
            assert!(!data.contains('\n'), "one line per event");
            if data == "[DONE]" {
                Event::Done
            } else {
                Event::Json(serde_json::from_str(data).unwrap_or_else(|err| panic!("bad JSON {data:?}: {err}")))
            }
        })
        .collect();
    assert_eq!(events.last(), Some(&Event::Done), "the stream ends with [DONE]");
    assert_eq!(events.iter().filter(|e| **e == Event::Done).count(), 1);
    events
}

/// What a chat stream said, per choice.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ChatStreamed {
    pub reasoning: String,
    pub content: String,
    pub finish: Option<String>,
    pub chunks: usize,
    pub logprobs: Vec<Value>,
    /// Reassembled `{id, type, function: {name, arguments}}` calls, as in a message.
    pub tool_calls: Vec<Value>,
}

/// Gathers the chat chunks of a stream by choice; checks the role chunk comes first per choice
/// and nothing follows a choice's finish.
pub fn gather_chat(events: &[Event], n: usize) -> (Vec<ChatStreamed>, Option<Value>) {
    let mut out = vec![ChatStreamed::default(); n];
    let mut usage = None;
    let first = events[0].json();
    for e in events {
        let Event::Json(v) = e else { continue };
        assert_eq!(v["id"], first["id"]);
        assert_eq!(v["created"], first["created"]);
        assert_eq!(v["object"], "chat.completion.chunk");
        let choices = v["choices"].as_array().expect("choices");
        if choices.is_empty() {
            assert!(usage.is_none(), "one usage chunk");
            usage = Some(v["usage"].clone());
            continue;
        }
        assert!(usage.is_none(), "usage comes last");
        for c in choices {
            let s = &mut out[c["index"].as_u64().unwrap() as usize];
            assert!(s.finish.is_none(), "nothing after the finish chunk");
            let d = &c["delta"];
            if s.chunks == 0 {
                assert_eq!(d, &json!({"role": "assistant", "content": ""}), "the role chunk comes first");
            } else {
                assert!(d.get("role").is_none());
            }
            s.chunks += 1;
            s.reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            s.content.push_str(d["content"].as_str().unwrap_or(""));
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                let i = t["index"].as_u64().expect("tool call index") as usize;
                if i == s.tool_calls.len() {
                    assert!(t["id"].is_string() && t["type"] == "function", "a call's first delta names it: {t}");
                    let f = json!({"name": t["function"]["name"], "arguments": ""});
                    s.tool_calls.push(json!({"id": t["id"], "type": "function", "function": f}));
                } else {
                    assert!(t.get("id").is_none() && t["function"].get("name").is_none(), "later deltas: {t}");
                }
                let args = s.tool_calls[i]["function"]["arguments"].as_str().unwrap().to_string();
                s.tool_calls[i]["function"]["arguments"] = json!(args + t["function"]["arguments"].as_str().unwrap());
            }
            if let Some(lp) = c["logprobs"]["content"].as_array() {
                s.logprobs.extend(lp.iter().cloned());
            }
            s.finish = c["finish_reason"].as_str().map(str::to_string);
        }
    }
    (out, usage)
}

/// A chat request body for the golden model.
pub fn chat(text: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}
