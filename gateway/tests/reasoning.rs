//! The R1 reasoning split over HTTP: a scripted backend (exact token sequences, so every edge is
//! pinned), the trained tiny-r1 model end to end, and the official `openai` Python client.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::{FinishReason, SamplingParams, TokenOutput};
use cleave_gateway::{ApiError, Backend, GatewayConfig, ModelInfo, Server, TokenEvents};
use common::*;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};

/// `</think>` in the golden tokenizer.
const THINK_END: u32 = 383;

/// Replays one fixed token sequence for every request, a few milliseconds apart.
struct Scripted {
    tokenizer: Arc<Tokenizer>,
    script: Vec<(u32, &'static str)>,
}

impl Backend for Scripted {
    fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        Some(self.tokenizer.clone())
    }
    fn model_info(&self) -> ModelInfo {
        ModelInfo {
            served_model_name: "scripted".into(),
            max_model_len: 1024,
            vocab_size: 400,
            think_end_id: Some(THINK_END),
        }
    }
    fn submit(&self, _prompt: Vec<u32>, params: SamplingParams) -> BoxFuture<'static, Result<TokenEvents, ApiError>> {
        let n = self.script.len().min(params.max_tokens);
        let items: Vec<Result<TokenOutput, ApiError>> = self.script[..n]
            .iter()
            .enumerate()
            .map(|(i, &(token, text))| {
                let finish = (i + 1 == n).then_some(if n == self.script.len() {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                });
                Ok(TokenOutput {
                    id: 0,
                    token,
                    logprob: -0.5,
                    top_logprobs: vec![],
                    text: text.into(),
                    finish,
                    ..TokenOutput::default()
                })
            })
            .collect();
        let s = futures::stream::iter(items).then(|t| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            t
        });
        futures::future::ready(Ok(s.boxed() as TokenEvents)).boxed()
    }
}

async fn scripted_server() -> (Server, String) {
    let tokenizer = Arc::new(Tokenizer::from_dir(&golden()).unwrap());
    let script = vec![
        (10, "Let me"),
        (11, " add"),
        (12, " them"),
        (THINK_END, "</think>"),
        (13, "\n\nThe answer"),
        (14, " is 4."),
    ];
    let server = Server::start(
        Arc::new(Scripted { tokenizer, script }),
        GatewayConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let url = format!("http://{}", server.local_addr());
    (server, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_reasoning_split_streaming_and_not() {
    let (_server, url) = scripted_server().await;
    let client = reqwest::Client::new();
    let post = |body: Value| client.post(format!("{url}/v1/chat/completions")).json(&body).send();
    let base = json!({"messages": [{"role": "user", "content": "2+2?"}], "stream": true, "stream_options": {"include_usage": true}});

    let body = post(base.clone()).await.unwrap().text().await.unwrap();
    let events = parse_sse(&body);
    let (c, usage) = gather_chat(&events, 1);
    assert_eq!(c[0].reasoning, "Let me add them");
    assert_eq!(c[0].content, "\n\nThe answer is 4.");
    assert_eq!(c[0].finish.as_deref(), Some("stop"));
    assert_eq!(usage.unwrap()["completion_tokens"], 6, "the </think> token counts");
    assert!(!body.contains("think>"), "the </think> token sends nothing");
    // role, 3 reasoning, 2 content chunks (the </think> token makes none), usage, [DONE].
    assert_eq!(events.len(), 8);
    let deltas: Vec<&Value> = events[1..6].iter().map(|e| &e.json()["choices"][0]["delta"]).collect();
    assert!(deltas[..3].iter().all(|d| d.get("content").is_none() && d["reasoning_content"].is_string()));
    // Current vLLM's name for the same text, in every reasoning delta.
    assert!(deltas[..3].iter().all(|d| d["reasoning"] == d["reasoning_content"]));
    assert!(deltas[3..].iter().all(|d| d.get("reasoning_content").is_none() && d.get("reasoning").is_none()));
    assert!(deltas[3..].iter().all(|d| d["content"].is_string()));

    let mut no_reasoning = base.clone();
    no_reasoning["include_reasoning"] = json!(false);
    let (c, _) = gather_chat(&parse_sse(&post(no_reasoning).await.unwrap().text().await.unwrap()), 1);
    assert_eq!((c[0].reasoning.as_str(), c[0].content.as_str()), ("", "\n\nThe answer is 4."));

    let v: Value =
        post(json!({"messages": [{"role": "user", "content": "2+2?"}]})).await.unwrap().json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "reasoning_content": "Let me add them", "reasoning": "Let me add them",
               "content": "\n\nThe answer is 4."})
    );
    // Cut before </think>: all reasoning, content null.
    let v: Value = post(json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Let me add");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // A prompt that does not open a reasoning section (no `<think>` at its end) is not split.
    let v: Value = post(json!({"messages": [{"role": "user", "content": "2+2?"}], "add_generation_prompt": false}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "reasoning_content": null, "reasoning": null,
               "content": "Let me add them</think>\n\nThe answer is 4."})
    );
    // Completions have no split.
    let v: Value = client
        .post(format!("{url}/v1/completions"))
        .json(&json!({"prompt": "2+2?"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], "Let me add them</think>\n\nThe answer is 4.");
}

const TINY_KEY: &str = "sk-cleave-test-key";

/// Starts the shipped default deployment (configs/cpu-tiny.yaml, tiny-r1) when the trained
/// model is present.
async fn tiny_r1() -> Option<TestServer> {
    let text = tiny_r1_config("cpu-tiny.yaml")?;
    // Behind an API key, so the official client is checked sending one.
    Some(TestServer::from_yaml(&text, |g| g.api_key = Some(TINY_KEY.into())).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_r1_reasons_then_answers_and_openai_python_client_agrees() {
    let Some(s) = tiny_r1().await else { return };
    let body = json!({"model": "tiny-r1", "messages": [{"role": "user", "content": "What is 347 + 589?"}], "temperature": 0, "max_tokens": 300});
    let (status, v) = s.json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"].as_str().expect("reasoning");
    let content = msg["content"].as_str().expect("content after </think>");
    assert!(!reasoning.is_empty() && !reasoning.contains("think>"), "{reasoning:?}");
    assert!(content.contains("936"), "tiny-r1 adds: {content:?}");
    assert!(!content.contains("think>"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (c, _) = gather_chat(&s.stream("/v1/chat/completions", &sb).await, 1);
    assert_eq!((c[0].reasoning.as_str(), c[0].content.as_str()), (reasoning, content), "streaming agrees");

    run_python_client(&s.url);
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

/// Runs gateway/tests/python/test_openai_client.py against `url`; skips when python3 or the
/// `openai` package is missing (the CI script installs it).
fn run_python_client(url: &str) {
    let script = repo().join("gateway/tests/python/test_openai_client.py");
    let has_openai =
        std::process::Command::new("python3").args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !has_openai {
        eprintln!("skipping the openai Python client test: `python3 -c 'import openai'` fails");
        return;
    }
    let out = std::process::Command::new("python3")
        .arg(&script)
        .env("CLEAVE_URL", url)
        .env("CLEAVE_API_KEY", TINY_KEY)
        .output()
        .expect("python3 runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "python client test failed:\n{text}");
    assert!(text.contains("ALL OK"), "{text}");
    eprintln!("{text}");
}
