//! Structured outputs over HTTP on the default model (tiny-r1), with the KV of every prompt moved
//! from the prefill rank to the decode rank (so the constraint also survives the handoff):
//! `response_format` json_schema answers parse and fit the schema, streamed or not, at
//! temperature 0.7; vLLM's `guided_choice` / `structured_outputs.regex` constrain completions;
//! bad constraints, and a forced tool call beside `response_format`, are 400s naming the field.

mod common;

use common::{gather_chat, tiny_r1_config, TestServer};
use serde_json::{json, Value};

async fn server() -> Option<TestServer> {
    let text = tiny_r1_config("cpu-tiny.yaml")?.replace("prefill_threshold: 256", "prefill_threshold: 8");
    Some(TestServer::from_yaml(&text, |_| {}).await)
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": false
    })
}

fn fits(content: &str) {
    let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("not JSON ({e}): {content:?}"));
    assert!(v["answer"].is_i64() && v["sure"].is_boolean() && v.as_object().unwrap().len() == 2, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_choice_and_regex_constrain_answers_and_bad_ones_are_400s() {
    let Some(s) = server().await else { return };
    let rf = json!({"type": "json_schema", "json_schema": {"name": "sum", "schema": schema(), "strict": true}});
    for seed in 0..3 {
        let body = json!({
            "model": "tiny-r1", "messages": [{"role": "user", "content": format!("What is {} + 58?", 20 + seed)}],
            "temperature": 0.7, "seed": seed, "max_tokens": 400, "response_format": rf,
        });
        let (status, v) = s.json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let msg = &v["choices"][0]["message"];
        assert!(!msg["reasoning_content"].as_str().unwrap_or("").is_empty(), "the reasoning stays free: {msg}");
        fits(msg["content"].as_str().expect("content"));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (c, _) = gather_chat(&s.stream("/v1/chat/completions", &sb).await, 1);
        fits(&c[0].content);
    }
    let body = json!({"model": "tiny-r1", "prompt": "Is 3 + 4 = 7? Answer:", "max_tokens": 8, "temperature": 0.7,
                      "guided_choice": ["yes", "no"]});
    let (status, v) = s.json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(["yes", "no"].contains(&v["choices"][0]["text"].as_str().unwrap()), "{v}");
    let body = json!({"model": "tiny-r1", "prompt": "12 + 30 =", "max_tokens": 8, "structured_outputs": {"regex": " ?[0-9]{1,3}"}});
    let (status, v) = s.json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().trim().to_string();
    assert!(!text.is_empty() && text.len() <= 3 && text.chars().all(|c| c.is_ascii_digit()), "{v}");

    let chat = |extra: Value| {
        let mut b = json!({"model": "tiny-r1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            Value::from("response_format.json_schema.schema"),
        ),
        (json!({"guided_regex": "(unclosed"}), Value::Null),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}}),
            Value::Null,
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
                   "tool_choice": "required", "response_format": {"type": "json_object"}}),
            Value::from("tool_choice"),
        ),
    ] {
        let (status, v) = s.json("/v1/chat/completions", &chat(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        if !param.is_null() {
            assert_eq!(v["error"]["param"], param, "{v}");
        }
        assert!(v["error"]["message"].as_str().unwrap().len() > 10, "{v}");
    }
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}
