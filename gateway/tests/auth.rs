//! An API key (vLLM's `--api-key`): /v1/* needs `Authorization: Bearer <key>`, answered 401 with
//! an OpenAI error body otherwise; /health, /version, /metrics and /tokenize stay open.

mod common;

use common::{golden, yaml, TestServer, MODEL};
use serde_json::{json, Value};

const KEY: &str = "sk-test-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_needs_the_key_and_the_probes_stay_open() {
    let s = TestServer::from_yaml(&yaml(&golden(), MODEL, 8, false), |g| g.api_key = Some(KEY.into())).await;
    let bare = reqwest::Client::new();
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let completion = json!({"model": MODEL, "prompt": [5, 9], "max_tokens": 2});
    for (auth, want) in [
        (None, 401),
        (Some("Bearer wrong".to_string()), 401),
        (Some(format!("Bearer {KEY}x")), 401),
        (Some(KEY.to_string()), 401),
        (Some(format!("Bearer {KEY}")), 200),
    ] {
        for (method, path) in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")] {
            let mut r = match method {
                "GET" => bare.get(format!("{}{path}", s.url)),
                _ => bare.post(format!("{}{path}", s.url)).json(if path.ends_with("chat/completions") {
                    &chat
                } else {
                    &completion
                }),
            };
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            let res = r.send().await.unwrap();
            assert_eq!(res.status().as_u16(), want, "{method} {path} with {auth:?}");
            if want == 401 {
                let v: Value = res.json().await.unwrap();
                assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
                assert_eq!(v["error"]["type"], "invalid_request_error");
                assert!(v["error"]["message"].as_str().unwrap().contains("Bearer"));
            }
        }
    }
    // An unknown /v1 path is refused for the key before it is found missing, as in vLLM.
    assert_eq!(bare.get(format!("{}/v1/nothing", s.url)).send().await.unwrap().status(), 401);
    for path in ["/health", "/version", "/metrics"] {
        assert_eq!(bare.get(format!("{}{path}", s.url)).send().await.unwrap().status(), 200, "{path}");
    }
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}
