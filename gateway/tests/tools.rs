//! Tool calling over HTTP on the default model (tiny-r1, trained to call a calculator), with the
//! KV of every prompt moved from the prefill rank to the decode rank:
//! - `auto`: the model's own call is parsed into `tool_calls` (streamed: name first, then the
//!   arguments), `finish_reason: tool_calls`, and the turn with the tool's result is answered;
//! - `required` and a named function give valid calls whose arguments fit the parameters even
//!   for a tool the model never saw, at temperature 0.7;
//! - `none` renders no tools; bad tools and tool messages are 400s naming the field.

mod common;

use common::{gather_chat, tiny_r1_config, TestServer};
use serde_json::{json, Value};

async fn server() -> Option<TestServer> {
    let text = tiny_r1_config("cpu-tiny.yaml")?.replace("prefill_threshold: 256", "prefill_threshold: 8");
    Some(TestServer::from_yaml(&text, |_| {}).await)
}

fn calculator() -> Value {
    json!({"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}})
}

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}})
}

fn ask(text: &str, tools: Value, extra: Value) -> Value {
    let mut b = json!({"model": "tiny-r1", "messages": [{"role": "user", "content": text}], "tools": tools,
                       "max_tokens": 300, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// The arguments of a call, parsed.
fn args(call: &Value) -> Value {
    let text = call["function"]["arguments"].as_str().expect("arguments are a string");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {text:?}"))
}

/// Checks a call against the tools above.
fn fits(call: &Value) {
    let a = args(call);
    let keys: Vec<&String> = a.as_object().expect("an object").keys().collect();
    match call["function"]["name"].as_str().unwrap() {
        "calculator" => assert!(a["expression"].is_string(), "{a}"),
        "get_weather" => {
            assert!(a["city"].is_string() && ["celsius", "fahrenheit"].contains(&a["unit"].as_str().unwrap()), "{a}");
            assert_eq!(keys.len(), 2, "no other properties: {a}");
        }
        other => panic!("unknown tool {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_calls_the_calculator_streams_the_call_and_answers_the_result() {
    let Some(s) = server().await else { return };
    let body = ask("What is 347 + 589?", json!([weather(), calculator()]), json!({}));
    let (status, v) = s.json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let msg = &choice["message"];
    assert_eq!(msg["content"], Value::Null, "an answer of calls only: {msg}");
    assert!(msg["reasoning_content"].as_str().unwrap().contains("347 + 589"), "{msg}");
    let calls = msg["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{msg}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"), "{msg}");
    assert_eq!(calls[0]["function"]["name"], "calculator");
    assert_eq!(args(&calls[0]), json!({"expression": "347 + 589"}));

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (streamed, _) = gather_chat(&s.stream("/v1/chat/completions", &sb).await, 1);
    assert_eq!(streamed[0].finish.as_deref(), Some("tool_calls"));
    assert_eq!(streamed[0].tool_calls.len(), 1);
    assert_eq!(streamed[0].tool_calls[0]["function"], calls[0]["function"], "the stream reassembles the same call");
    assert!(streamed[0].content.trim().is_empty(), "{:?}", streamed[0].content);

    // The tool's result comes back: the model answers with it.
    let mut turn = body.clone();
    turn["messages"] = json!([
        {"role": "user", "content": "What is 347 + 589?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "936"},
    ]);
    let (status, v) = s.json("/v1/chat/completions", &turn).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "347 + 589 = 936", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");

    // tool_choice none: the tools are not shown; the model works the sum itself.
    let (status, v) = s
        .json("/v1/chat/completions", &ask("What is 12 + 7?", json!([calculator()]), json!({"tool_choice": "none"})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "\n\n12 + 7 = 19", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_choices_give_calls_that_fit_the_parameters() {
    let Some(s) = server().await else { return };
    for seed in 0..3 {
        let sampled = json!({"temperature": 0.7, "seed": seed});
        // A tool the model never saw, named: the grammar makes the call valid.
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let mut extra = sampled.clone();
        extra["tool_choice"] = named;
        let body = ask("What's the weather in Paris?", json!([calculator(), weather()]), extra);
        let (status, v) = s.json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls").clone();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        fits(&calls[0]);
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (streamed, _) = gather_chat(&s.stream("/v1/chat/completions", &sb).await, 1);
        assert_eq!(streamed[0].tool_calls.len(), 1);
        fits(&streamed[0].tool_calls[0]);

        let mut extra = sampled.clone();
        extra["tool_choice"] = json!("required");
        let (status, v) =
            s.json("/v1/chat/completions", &ask("Hello there", json!([weather(), calculator()]), extra.clone())).await;
        assert_eq!(status, 200, "{v}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls");
        assert!(!calls.is_empty(), "{v}");
        calls.iter().for_each(fits);
        extra["parallel_tool_calls"] = json!(false);
        let (status, v) =
            s.json("/v1/chat/completions", &ask("What is 5 - 3?", json!([weather(), calculator()]), extra)).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 1, "{v}");
    }
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tools_and_tool_messages_are_400s_naming_the_field() {
    let Some(s) = server().await else { return };
    let cases = [
        (json!({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}), "tools[0].function.name"),
        (
            json!({"tools": [calculator()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"arguments": "{}"}}]}]}),
            "messages[1].tool_calls[0].function.name",
        ),
        (json!({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}), "messages[0].tool_calls"),
        (json!({"messages": [{"role": "tool", "content": "1", "tool_call_id": 5}]}), "messages[0].tool_call_id"),
    ];
    for (extra, param) in cases {
        let mut b = json!({"model": "tiny-r1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, v) = s.json("/v1/chat/completions", &b).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    // A schema llguidance cannot compile is a 400 too (checked when the engine compiles it).
    let bad = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}});
    let (status, v) =
        s.json("/v1/chat/completions", &ask("hi", json!([bad]), json!({"tool_choice": "required"}))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}
