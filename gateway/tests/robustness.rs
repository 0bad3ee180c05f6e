//! Validation errors, body limits, admission, floods of bad requests and disconnecting clients,
//! over real HTTP against a real cluster.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};

async fn expect_error(
    s: &TestServer,
    path: &str,
    body: Value,
    status: u16,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    let (got, v) = s.json(path, &body).await;
    assert_eq!(got, status, "{body} -> {v}");
    let e = &v["error"];
    assert_eq!(e.as_object().map(|o| o.len()), Some(4), "{{message, type, param, code}}: {v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(e["type"].is_string());
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{v}");
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invalid_request_gets_its_openai_error() {
    let s = TestServer::from_yaml(&yaml(&golden(), MODEL, 8, false), |g| g.max_body_bytes = 64 << 10).await;
    let chat = "/v1/chat/completions";
    let ok = || chat_body();
    fn chat_body() -> Value {
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    }
    let with = |k: &str, v: Value| {
        let mut b = ok();
        b[k] = v;
        b
    };
    // Malformed JSON and a non-object body.
    let r = s.post_raw(chat, "{\"messages\": [").await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_json");
    let r = s.post_raw(chat, "[1, 2]").await;
    assert_eq!(r.status(), 400);
    // Missing and mistyped fields name the field.
    expect_error(&s, chat, json!({"model": MODEL}), 400, Some("messages"), None).await;
    expect_error(&s, chat, with("temperature", json!("hot")), 400, Some("temperature"), None).await;
    expect_error(
        &s,
        chat,
        with("messages", json!([{"role": "user", "content": 5}])),
        400,
        Some("messages[0].content"),
        None,
    )
    .await;
    expect_error(&s, chat, with("messages", json!([{"content": "x"}])), 400, Some("messages[0].role"), None).await;
    expect_error(
        &s,
        chat,
        with("messages", json!([{"role": "user", "content": [{"type": "image_url"}]}])),
        400,
        Some("messages[0].content[0].type"),
        None,
    )
    .await;
    expect_error(&s, chat, with("stop", json!(7)), 400, Some("stop"), None).await;
    expect_error(&s, chat, with("stream", json!("yes")), 400, Some("stream"), None).await;
    // Out-of-range values.
    expect_error(&s, chat, with("temperature", json!(-0.5)), 400, Some("temperature"), None).await;
    expect_error(&s, chat, with("top_p", json!(0)), 400, Some("top_p"), None).await;
    expect_error(&s, chat, with("top_p", json!(1.5)), 400, Some("top_p"), None).await;
    // Values beyond f32, and ids outside the vocabulary, name their field too.
    expect_error(&s, chat, with("temperature", json!(1e39)), 400, Some("temperature"), None).await;
    expect_error(&s, chat, with("repetition_penalty", json!(1e300)), 400, Some("repetition_penalty"), None).await;
    expect_error(&s, chat, with("stop_token_ids", json!([3, 100_000])), 400, Some("stop_token_ids"), None).await;
    expect_error(&s, chat, with("min_tokens", json!(2000)), 400, Some("min_tokens"), None).await;
    // Text that no tokenizer fits into 1024 tokens is refused before it is tokenized.
    let huge = json!([{"role": "user", "content": "ab ".repeat(15_000)}]);
    let v = expect_error(&s, chat, with("messages", huge), 400, Some("messages"), None).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("bytes of text"), "{v}");
    let stops: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
    expect_error(&s, chat, with("stop", json!(stops)), 400, Some("stop"), None).await;
    expect_error(&s, chat, with("stop", json!(["x".repeat(5000)])), 400, Some("stop"), None).await;
    expect_error(&s, chat, with("max_tokens", json!(0)), 400, Some("max_tokens"), None).await;
    expect_error(&s, chat, with("max_tokens", json!(-3)), 400, Some("max_tokens"), None).await;
    expect_error(&s, chat, with("max_completion_tokens", json!(0)), 400, Some("max_completion_tokens"), None).await;
    expect_error(&s, chat, with("n", json!(0)), 400, Some("n"), None).await;
    expect_error(&s, chat, with("top_logprobs", json!(3)), 400, Some("top_logprobs"), None).await;
    expect_error(&s, chat, with("stream_options", json!({"include_usage": true})), 400, Some("stream_options"), None)
        .await;
    // Context length: 1024 tokens in all.
    let v =
        expect_error(&s, chat, with("max_tokens", json!(1020)), 400, Some("messages"), Some("context_length_exceeded"))
            .await;
    assert!(v["error"]["message"].as_str().unwrap().contains("1024"));
    let long = "word ".repeat(1200);
    expect_error(
        &s,
        chat,
        with("messages", json!([{"role": "user", "content": long}])),
        400,
        None,
        Some("context_length_exceeded"),
    )
    .await;
    expect_error(
        &s,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 5000}),
        400,
        Some("prompt"),
        Some("context_length_exceeded"),
    )
    .await;
    expect_error(&s, "/v1/completions", json!({"prompt": [1, 2, 999999]}), 400, Some("prompt"), None).await;
    // Unknown model.
    expect_error(&s, chat, with("model", json!("gpt-4o")), 404, Some("model"), Some("model_not_found")).await;
    // A body over the limit (declared length, and chunked without one).
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(100 << 10));
    let r = s.post_raw("/v1/completions", big.clone()).await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "payload_too_large");
    let chunks = futures::stream::iter(
        big.into_bytes().chunks(8192).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>(),
    );
    let r = s.post_raw("/v1/completions", reqwest::Body::wrap_stream(chunks)).await;
    assert_eq!(r.status(), 413);
    // Unknown fields are ignored; reasoning_content on assistant turns is accepted.
    let mut b = with("frobnicate", json!({"x": 1}));
    b["messages"] = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]}
    ]);
    b["chat_template_kwargs"] = json!({"thinking": true});
    let (status, v) = s.json(chat, &b).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.wait_idle().blocks_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_beyond_the_limit_with_retry_after() {
    let s = TestServer::golden(2).await;
    let mut body = chat("long", 1000);
    body["stream"] = json!(true);
    // Two streams hold both slots while their bodies stay open.
    let mut held = Vec::new();
    for _ in 0..2 {
        let r = s.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let mut stream = r.bytes_stream();
        let first = stream.next().await.expect("a first chunk").expect("bytes");
        assert!(first.starts_with(b"data: "));
        held.push(stream);
    }
    let r = s.post("/v1/chat/completions", &chat("third", 4)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    // n counts against the limit too.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut two = chat("two", 4);
    two["n"] = json!(2);
    assert_eq!(s.post("/v1/chat/completions", &two).await.status(), 429);
    let (status, _) = s.json("/v1/chat/completions", &chat("fits", 4)).await;
    assert_eq!(status, 200, "a freed slot is usable at once");
    drop(held);
    let stats = s.wait_idle();
    assert_eq!((stats.in_flight, stats.blocks_in_use()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_malformed_requests_leave_the_server_healthy_and_empty() {
    let s = TestServer::golden(8).await;
    let bad: Vec<(String, String)> = vec![
        ("/v1/chat/completions".into(), "{not json".into()),
        ("/v1/chat/completions".into(), r#"{"messages": "hi"}"#.into()),
        (
            "/v1/chat/completions".into(),
            r#"{"messages": [{"role": "user", "content": "x"}], "temperature": -1}"#.into(),
        ),
        ("/v1/completions".into(), r#"{"prompt": "x", "max_tokens": 0}"#.into()),
        ("/v1/completions".into(), r#"{"prompt": "x", "max_tokens": 99999}"#.into()),
        ("/v1/completions".into(), "\u{0}\u{1}\u{2}".into()),
        ("/v1/completions".into(), r#"{"prompt": {"a": 1}}"#.into()),
        ("/v1/chat/completions".into(), r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into()),
        ("/tokenize".into(), "null".into()),
        ("/v1/completions".into(), r#"{"prompt": [1, -2]}"#.into()),
    ];
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..1000 {
        let (path, body) = &bad[i % bad.len()];
        let r = s.post_raw(path, body.clone()).await;
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
        let v: Value = r.json().await.expect("an OpenAI error body");
        assert!(v["error"]["message"].is_string());
    }
    assert_eq!(statuses, [(400u16, 1000)].into_iter().collect());
    assert_eq!(s.get("/health").await.status(), 200);
    let stats = s.wait_idle();
    assert_eq!((stats.in_flight, stats.blocks_in_use()), (0, 0));
    let (status, _) = s.json("/v1/chat/completions", &chat("still fine", 4)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_clients_disconnecting_mid_stream_leave_nothing_running() {
    let s = TestServer::golden(256).await;
    let mut body = json!({"prompt": "go", "max_tokens": 1000, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut tasks = Vec::new();
    for i in 0..100 {
        body["prompt"] = json!(format!("client {i} says go"));
        let (client, url, b) = (s.client.clone(), s.url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let r = client.post(format!("{url}/v1/completions")).json(&b).send().await.expect("sent");
            assert_eq!(r.status(), 200);
            let mut stream = r.bytes_stream();
            let first = stream.next().await.expect("first chunk").expect("bytes");
            assert!(first.starts_with(b"data: "));
            // Dropping the response closes the connection mid-stream.
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = s.wait_idle();
    assert_eq!((stats.in_flight, stats.blocks_in_use()), (0, 0), "{stats:?}");
    assert!(stats.ranks.iter().all(|r| r.running == 0 && r.waiting == 0));
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("cleave_gateway_requests_in_flight 0"), "{metrics}");
    let disconnects = metrics.lines().find(|l| l.starts_with("cleave_gateway_client_disconnects_total ")).unwrap();
    let n: u64 = disconnects.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 90, "the gateway saw the disconnects: {disconnects}");
    assert_eq!(aborted(&s).await, 100, "the cluster aborted every one");
}

/// `cleave_requests_finished_total{reason="abort"}` of the cluster.
async fn aborted(s: &TestServer) -> u64 {
    let metrics = s.get("/metrics").await.text().await.unwrap();
    metrics
        .lines()
        .find(|l| l.starts_with("cleave_requests_finished_total{") && l.contains("reason=\"abort\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_clients_that_give_up_abort_their_requests() {
    let s = TestServer::golden(64).await;
    let client = reqwest::Client::builder().timeout(Duration::from_millis(150)).build().unwrap();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (client, url) = (client.clone(), s.url.clone());
            let body =
                json!({"prompt": format!("patience {i}"), "max_tokens": 1000, "temperature": 0, "ignore_eos": true});
            tokio::spawn(async move { client.post(format!("{url}/v1/completions")).json(&body).send().await.is_err() })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap(), "the client timed out before 1000 tokens");
    }
    let stats = s.wait_idle();
    assert_eq!((stats.in_flight, stats.blocks_in_use()), (0, 0), "{stats:?}");
    eprintln!("20 abandoned requests cleaned up {:?} after the start", started.elapsed());
    assert_eq!(aborted(&s).await, 20, "every abandoned request was aborted, none ran to the end");
}

/// A browser's cross-site "simple" request (text/plain or a form, no preflight) is refused
/// before anything runs; JSON (with a charset) and a body without a Content-Type are read. No
/// CORS header unless the origin is allowed; an allowed one gets its preflight and headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_json_bodies_run_and_cors_is_off_unless_allowed() {
    let s = TestServer::golden(8).await;
    let body = serde_json::to_vec(&chat("hi", 2)).unwrap();
    let post = |ct: Option<&'static str>, origin: &'static str| {
        let mut r = s.client.post(format!("{}/v1/chat/completions", s.url)).header("origin", origin).body(body.clone());
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        r.send()
    };
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let r = post(Some(ct), "https://evil.example").await.unwrap();
        assert_eq!(r.status(), 415, "{ct}");
        assert!(r.headers().get("access-control-allow-origin").is_none());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unsupported_media_type");
    }
    assert_eq!(metric_requests(&s).await, 0.0, "nothing was submitted");
    let r = post(Some("application/json; charset=utf-8"), "https://evil.example").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none(), "no CORS unless configured");
    assert_eq!(post(None, "https://evil.example").await.unwrap().status(), 200);
    let pre = s.client.request(reqwest::Method::OPTIONS, format!("{}/v1/chat/completions", s.url));
    assert_eq!(pre.header("origin", "https://evil.example").send().await.unwrap().status(), 405);
    drop(s);

    let yaml = yaml(&golden(), MODEL, 8, false).replace(
        "max_concurrent_requests: 8}",
        "max_concurrent_requests: 8, allowed_origins: [\"https://app.example\"]}",
    );
    let s = TestServer::from_yaml(&yaml, |_| {}).await;
    let pre = s.client.request(reqwest::Method::OPTIONS, format!("{}/v1/chat/completions", s.url));
    let r = pre.header("origin", "https://app.example").send().await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example");
    assert!(r.headers()["access-control-allow-headers"].to_str().unwrap().contains("authorization"));
    let get = |origin: &'static str| s.client.get(format!("{}/v1/models", s.url)).header("origin", origin).send();
    assert_eq!(
        get("https://app.example").await.unwrap().headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(get("https://evil.example").await.unwrap().headers().get("access-control-allow-origin").is_none());
}

/// Requests the cluster admitted, from its metrics.
async fn metric_requests(s: &TestServer) -> f64 {
    let m = s.get("/metrics").await.text().await.unwrap();
    m.lines()
        .filter(|l| l.starts_with("cleave_router_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Right after a client disconnects, its request still holds its slot until the rank lets go of
/// it: a newcomer then gets 429 with Retry-After (never a 503 server error), and the slot is
/// usable once it is free. One gate decides: the cluster's count of requests alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_never_turns_the_next_request_into_a_server_error() {
    let s = TestServer::golden(1).await;
    let mut body = chat("long", 1000);
    body["stream"] = json!(true);
    for _ in 0..10 {
        let r = s.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let mut stream = r.bytes_stream();
        stream.next().await.expect("a first chunk").expect("bytes");
        drop(stream);
        let r = s.post("/v1/chat/completions", &chat("next", 2)).await;
        match r.status().as_u16() {
            200 => {}
            429 => assert_eq!(r.headers()["retry-after"], "1"),
            other => panic!("status {other} right after a disconnect"),
        }
        s.wait_idle();
    }
    let (status, _) = s.json("/v1/chat/completions", &chat("fits", 2)).await;
    assert_eq!(status, 200);
}

/// Fault drills against a running server: `POST /admin/fault` exists only when enabled
/// (`CLEAVE_FAULT_INJECTION=1` for `cleave serve`); a panic injected so restarts the rank and
/// the server serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_drills_over_http_only_when_enabled() {
    let off = TestServer::golden(4).await;
    assert_eq!(off.post("/admin/fault", &json!({"rank": 0, "fault": "panic"})).await.status(), 404);
    drop(off);
    let s = TestServer::from_yaml(&yaml(&golden(), MODEL, 4, false), |g| g.fault_injection = true).await;
    let (status, v) = s.json("/admin/fault", &json!({"rank": 0, "fault": "nope"})).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("fault")), "{v}");
    let (status, v) = s.json("/admin/fault", &json!({"rank": 9, "fault": "panic"})).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("rank")), "{v}");
    let (status, v) = s.json("/admin/fault", &json!({"rank": 0, "fault": "hang"})).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("ms")), "{v}");
    let (status, _) = s.json("/admin/fault", &json!({"rank": 0, "fault": "panic"})).await;
    assert_eq!(status, 200);
    for _ in 0..400 {
        if s.cluster.stats().ranks.iter().any(|r| r.restarts == 1 && r.status == cleave_actors::RankStatus::Up) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(s.cluster.stats().ranks.iter().any(|r| r.restarts == 1), "{:?}", s.cluster.stats());
    let (status, _) = s.json("/v1/chat/completions", &chat("after", 2)).await;
    assert_eq!(status, 200);
}

/// Idle and slow clients cannot hold the server: a connection that sends no request head within
/// the header timeout is closed, connections are capped, and a body that does not arrive in
/// time gets 408. A normal client gets through while the cap is full of idle sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_time_out_and_cannot_lock_others_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::from_yaml(&yaml(&golden(), MODEL, 4, false), |g| {
        g.header_timeout = Duration::from_millis(400);
        g.body_timeout = Duration::from_millis(400);
        g.max_connections = 2;
    })
    .await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let t0 = std::time::Instant::now();
    let (status, _) = s.json("/v1/chat/completions", &chat("through", 2)).await;
    assert_eq!(status, 200, "a client gets a slot once idle sockets time out");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    for mut c in idle {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf)).await.expect("closed in time");
        assert!(n.as_ref().map_or(true, |&n| n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408")), "{n:?}");
    }
    // A body that stops arriving.
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"pro";
    c.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf)).await.expect("answered in time").unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}
