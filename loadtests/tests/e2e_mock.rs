//! End-to-end tests of cleave-bench against the deterministic SSE server in `common`.

mod common;

use std::time::{Duration, Instant};

use cleave_bench::client::{ApiClient, Endpoint, Prompt, RequestInput};
use cleave_bench::runner::Target;
use common::{args, read_json, run_bench, start, temp_dir, MockConfig};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The tests measure time: run them one at a time so they do not steal each other's cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The 20-prompt benchmark: the binary end to end, model auto-detected, exact random input
/// lengths (the server's own count comes back in usage), report layout, result JSON keys, and
/// latencies that match the server's schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_20_prompts_report_and_result_json() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig { ttft: ms(30), itl: ms(10), ..Default::default() }).await;
    let dir = temp_dir("bench20");
    let out = dir.join("result.json");
    let (ok, stdout, stderr) = run_bench(args(&[
        "--base-url",
        &server.base_url,
        "--num-prompts",
        "20",
        "--random-input-len",
        "48",
        "--random-output-len",
        "8",
        "--max-concurrency",
        "4",
        "--seed",
        "3",
        "--disable-tqdm",
        "--goodput",
        "ttft:1000",
        "tpot:1000",
        "--save-result",
        out.to_str().unwrap(),
        "--save-detailed",
    ]))
    .await;
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    println!("{stdout}");
    for needle in [
        "============ Serving Benchmark Result ============",
        "Successful requests:                     20        ",
        "Failed requests:                         0         ",
        "Maximum request concurrency:             4         ",
        "Total input tokens:                      960       ",
        "Total generated tokens:                  160       ",
        "Request goodput (req/s):",
        "---------------Time to First Token----------------",
        "-----Time per Output Token (excl. 1st token)------",
        "---------------Inter-token Latency----------------",
        "----------------End-to-end Latency----------------",
        "P99 ITL (ms):",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in\n{stdout}");
    }
    let j = read_json(&out);
    assert_eq!(j["completed"], 20);
    assert_eq!(j["failed"], 0);
    assert_eq!(j["model_id"], "mock-r1");
    assert_eq!(j["total_output_tokens"], 160);
    assert!(j["input_lens"].as_array().unwrap().iter().all(|x| x == 48), "exact input lengths: {}", j["input_lens"]);
    assert!(j["output_lens"].as_array().unwrap().iter().all(|x| x == 8));
    assert_eq!(j["request_goodput"], j["request_throughput"], "every request meets 1 s SLOs");
    let f = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} missing"));
    // Server schedule: first token 30 ms after arrival, then one every 10 ms (loose bounds: the
    // hand-timing test checks exactness; the machine may be busy).
    assert!((29.0..150.0).contains(&f("mean_ttft_ms")), "{}", f("mean_ttft_ms"));
    assert!((7.0..30.0).contains(&f("mean_tpot_ms")), "{}", f("mean_tpot_ms"));
    assert!((7.0..30.0).contains(&f("mean_itl_ms")), "{}", f("mean_itl_ms"));
    assert!((99.0..300.0).contains(&f("mean_e2el_ms")), "{}", f("mean_e2el_ms"));
    assert!(f("p99_itl_ms") >= f("median_itl_ms"));
    assert!((f("output_throughput") - 160.0 / f("duration")).abs() < 1e-6);
    assert!((f("total_token_throughput") - 1120.0 / f("duration")).abs() < 1e-6);
    assert_eq!(j["itls"].as_array().unwrap().len(), 20);
    assert!(j["itls"][0].as_array().unwrap().len() == 7, "8 tokens, 7 gaps");
    assert!(j["generated_texts"][0].as_str().unwrap().starts_with(" w100 w101"));
    // 20 measured requests plus the initial test request, each with ignore_eos (random dataset).
    let log = server.log.lock().unwrap();
    assert_eq!(log.len(), 21);
    assert!(log.iter().all(|r| r.body["ignore_eos"] == true && r.body["stream_options"]["include_usage"] == true));
}

/// Chat endpoint: role chunk, reasoning_content and content deltas all count as token
/// messages; generated text holds reasoning then content; a finite request rate is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_endpoint_with_poisson_rate() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig { reasoning_tokens: 3, ..Default::default() }).await;
    let dir = temp_dir("chat");
    let out = dir.join("r.json");
    let (ok, stdout, stderr) = run_bench(args(&[
        "--base-url",
        &server.base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--num-prompts",
        "10",
        "--random-input-len",
        "16",
        "--random-output-len",
        "6",
        "--request-rate",
        "40",
        "--burstiness",
        "2",
        "--disable-tqdm",
        "--save-result",
        out.to_str().unwrap(),
        "--save-detailed",
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("Request rate configured (RPS):           40.00"), "{stdout}");
    assert!(stdout.contains("Burstiness factor: 2.0 (Gamma distribution)"), "{stdout}");
    let j = read_json(&out);
    assert_eq!(j["completed"], 10);
    assert_eq!(j["endpoint_type"], "openai-chat");
    assert_eq!(j["request_rate"], 40.0);
    assert!(j["duration"].as_f64().unwrap() >= 0.25, "10 requests at 40/s: the last leaves at 0.25 s");
    // 6 tokens + the role chunk = 7 token messages, 6 gaps.
    assert_eq!(j["itls"][0].as_array().unwrap().len(), 6);
    assert_eq!(j["output_lens"][0], 6, "output count from usage, not from message count");
    assert_eq!(j["generated_texts"][0], " w100 w101 w102 w103 w104 w105");
    let log = server.log.lock().unwrap();
    assert!(log.iter().all(|r| r.body["max_completion_tokens"] == 6 && r.body["messages"][0]["role"] == "user"));
}

/// Failed requests are counted, excluded from the latency numbers, and their errors shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_counted_and_shown() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig::default()).await;
    let dir = temp_dir("fail");
    let data = dir.join("d.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"w1 w2 w3\"}\n{\"prompt\": \"please FAIL\"}\n{\"prompt\": \"w4\", \"output_len\": 3}\n",
    )
    .unwrap();
    let out = dir.join("r.json");
    let (ok, stdout, stderr) = run_bench(args(&[
        "--base-url",
        &server.base_url,
        "--dataset",
        "jsonl",
        "--dataset-path",
        data.to_str().unwrap(),
        "--num-prompts",
        "6",
        "--random-output-len",
        "5",
        "--disable-tqdm",
        "--save-result",
        out.to_str().unwrap(),
        "--save-detailed",
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("Failed requests during benchmark run detected (capping to 10):"), "{stdout}");
    assert!(stdout.contains("Error 0: HTTP 500 Internal Server Error: injected failure"), "{stdout}");
    assert!(stdout.contains("Error 1: HTTP 500"), "{stdout}");
    let j = read_json(&out);
    assert_eq!((j["completed"].as_u64(), j["failed"].as_u64()), (Some(4), Some(2)));
    assert_eq!(j["output_lens"], serde_json::json!([5, 0, 3, 5, 0, 3]));
    assert_eq!(j["input_lens"][0], 4, "BOS + 3 words, from usage");
    assert_eq!(j["total_output_tokens"], 16);
    assert!(j["errors"][1].as_str().unwrap().contains("injected failure"));
    assert_eq!(j["errors"][0], "");
}

/// One request's TTFT, ITL, TPOT and E2EL against timings taken by hand: the server logs the
/// instant it wrote each token message, and its schedule is known (first token 120 ms after
/// arrival, then one every 40 ms). On a loaded 2-core machine the client can be descheduled
/// for a while, so a measurement is retried up to 5 times; a systematic error (wrong start,
/// counting the usage chunk, a lost message) fails every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_timings_match_hand_measurements() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig { ttft: ms(120), itl: ms(40), ..Default::default() }).await;
    let client = ApiClient::new(&server.base_url).unwrap();
    for endpoint in [Endpoint::Completions, Endpoint::Chat] {
        let mut failures = vec![];
        for _ in 0..5 {
            match measure_once(&server, &client, endpoint).await {
                Ok(()) => break,
                Err(e) => failures.push(e),
            }
        }
        assert!(failures.len() < 5, "{endpoint:?}: every attempt failed: {failures:#?}");
        if !failures.is_empty() {
            eprintln!("{endpoint:?}: passed after {} noisy attempt(s): {failures:?}", failures.len());
        }
    }
}

async fn measure_once(server: &common::MockServer, client: &ApiClient, endpoint: Endpoint) -> Result<(), String> {
    let path = if endpoint == Endpoint::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    let target = Target { api_url: client.url(path), client: client.clone(), endpoint, model: "mock-r1".into() };
    let input = RequestInput {
        prompt: Prompt::Text("w1 w2".into()),
        prompt_len: 3,
        output_len: 5,
        ignore_eos: true,
        extra_body: None,
    };
    // Warm the pooled connection so the measured request does not pay for the connect.
    assert!(target.send(&RequestInput { output_len: 1, ..input.clone() }, Instant::now()).await.success);
    let epoch = Instant::now();
    let out = target.send(&input, epoch).await;
    assert!(out.success, "{}", out.error);
    assert_eq!(out.output_tokens, Some(5));
    let log = server.log.lock().unwrap().last().cloned().unwrap();
    let sent = epoch + Duration::from_secs_f64(out.start_time);
    // By hand: each token message's write instant, relative to the client's send.
    let hand: Vec<f64> = log.writes.iter().map(|w| w.duration_since(sent).as_secs_f64()).collect();
    let (hand_ttft, hand_e2el) = (hand[0], hand[4]);
    let hand_itl: Vec<f64> = hand.windows(2).map(|w| w[1] - w[0]).collect();
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    let tol = 0.008;
    check((out.ttft - hand_ttft).abs() < tol, format!("ttft {} vs hand {hand_ttft}", out.ttft))?;
    check((out.latency - hand_e2el).abs() < tol, format!("e2el {} vs hand {hand_e2el}", out.latency))?;
    // Chat sends the role chunk in the same write as the first token: one extra, ~0 gap.
    let itl = if endpoint == Endpoint::Chat {
        assert_eq!(out.itl.len(), 5, "role chunk + 5 tokens = 6 token messages");
        check(out.itl[0] < 0.005, format!("role chunk and first token arrive together: {}", out.itl[0]))?;
        out.itl[1..].to_vec()
    } else {
        out.itl.clone()
    };
    assert_eq!(itl.len(), 4, "5 token messages, 4 gaps; the usage chunk is not a token");
    for (got, want) in itl.iter().zip(&hand_itl) {
        check((got - want).abs() < tol, format!("itl {got} vs hand {want}"))?;
    }
    // TPOT = (E2EL - TTFT) / (5 - 1), by hand.
    let tpot = cleave_bench::metrics::tpot(out.latency, out.ttft, out.output_len()).unwrap();
    let hand_tpot = (hand_e2el - hand_ttft) / 4.0;
    check((tpot - hand_tpot).abs() < tol / 2.0, format!("tpot {tpot} vs hand {hand_tpot}"))?;
    // And against the server's schedule, which counts from its receipt of the request.
    check((0.119..0.200).contains(&out.ttft), format!("ttft {} vs schedule 120 ms", out.ttft))?;
    check((0.039..0.060).contains(&tpot), format!("tpot {tpot} vs schedule 40 ms"))?;
    Ok(())
}

/// The 3-point sweep: one JSON per point, sweep.csv, sweep.json, PNG and SVG charts; then the
/// chart command overlays two result sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_three_points_with_charts_and_overlay() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig { ttft: ms(15), itl: ms(4), ..Default::default() }).await;
    let dir = temp_dir("sweep");
    let (ok, stdout, stderr) = run_bench(args(&[
        "sweep",
        "--base-url",
        &server.base_url,
        "--max-concurrency",
        "1,2,4",
        "--prompts-per-concurrency",
        "3",
        "--random-input-len",
        "32",
        "--random-output-len",
        "6",
        "--disable-tqdm",
        "--label",
        "mock",
        "--output-dir",
        dir.to_str().unwrap(),
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    for c in [1, 2, 4] {
        let j = read_json(&dir.join(format!("mock-concurrency{c}.json")));
        assert_eq!(j["max_concurrency"], c);
        assert_eq!(j["completed"], 3 * c);
    }
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(csv.lines().nth(3).unwrap().starts_with("mock,max_concurrency,4,12,12,0,"));
    assert_non_trivial_charts(&dir.join("sweep"));
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).unwrap();
    for text in [
        "Token throughput",
        "Request rate (req/s): server vs client",
        "Inter-token latency (ms, log)",
        "Time per output token",
        "Time to first token",
        "P99 TTFT",
        "Mean time to last token",
        "max concurrency",
    ] {
        assert!(svg.contains(text), "chart text {text:?} missing");
    }
    let overlay = dir.join("overlay");
    chart_as_two_sets(&dir, &overlay).await;
    assert_non_trivial_charts(&overlay);
    let svg = std::fs::read_to_string(overlay.with_extension("svg")).unwrap();
    assert!(svg.contains("colocated output") && svg.contains("1p1d P99 ITL"), "legend entries for both sets");
}

/// `cleave-bench chart` over `input` twice, labelled as two sets ("colocated" and "1p1d"), to
/// `output`; asserts that it succeeded.
async fn chart_as_two_sets(input: &std::path::Path, output: &std::path::Path) {
    let (input, output) = (input.to_str().unwrap(), output.to_str().unwrap());
    let (ok, stdout, stderr) = run_bench(args(&[
        "chart",
        "--input",
        input,
        "--input",
        input,
        "--label",
        "colocated",
        "--label",
        "1p1d",
        "--output",
        output,
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
}

fn assert_non_trivial_charts(base: &std::path::Path) {
    let png = std::fs::read(base.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 20_000, "png is {} bytes", png.len());
    let svg = std::fs::read_to_string(base.with_extension("svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.len() > 10_000, "svg is {} bytes", svg.len());
    assert!(svg.matches("<polyline").count() + svg.matches("<path").count() >= 3, "svg has lines");
}

/// Batch: tagged prompts with and without a system prompt, answers in input order with
/// reasoning and content apart, a failure reported in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_run_writes_tagged_responses_in_order() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig { reasoning_tokens: 2, itl: ms(2), ..Default::default() }).await;
    let dir = temp_dir("batch");
    let input = dir.join("prompts.json");
    let output = dir.join("responses.json");
    let items: Vec<serde_json::Value> = (0..7)
        .map(|i| {
            if i == 4 {
                serde_json::json!({"tag": "t4", "prompt": "FAIL please"})
            } else if i % 2 == 0 {
                serde_json::json!({"tag": format!("t{i}"), "prompt": format!("w{i} w{i}"), "system": "be brief"})
            } else {
                serde_json::json!({"tag": format!("t{i}"), "prompt": "w1"})
            }
        })
        .collect();
    std::fs::write(&input, serde_json::to_string(&items).unwrap()).unwrap();
    let (ok, stdout, stderr) = run_bench(args(&[
        "batch",
        "--base-url",
        &server.base_url,
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--max-concurrency",
        "3",
        "--max-tokens",
        "4",
        "--disable-tqdm",
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("7 prompts, 6 answered, 1 failed"), "{stdout}");
    let r = read_json(&output);
    let r = r.as_array().unwrap();
    assert_eq!(r.len(), 7);
    for (i, x) in r.iter().enumerate() {
        assert_eq!(x["tag"], format!("t{i}"), "input order");
        if i == 4 {
            assert!(x["error"].as_str().unwrap().contains("injected failure"));
            assert!(x["content"].is_null());
            continue;
        }
        assert!(x["error"].is_null());
        assert_eq!(x["reasoning"], " w100 w101");
        assert_eq!(x["content"], " w102 w103");
        assert_eq!(x["finish_reason"], "length");
        assert_eq!(x["usage"]["completion_tokens"], 4);
    }
    let log = server.log.lock().unwrap();
    let with_system = log.iter().find(|l| l.body["messages"][1]["content"] == "w2 w2").unwrap();
    assert_eq!(with_system.body["messages"][0], serde_json::json!({"role": "system", "content": "be brief"}));
    assert!(log.iter().all(|l| l.path == "/v1/chat/completions"));
}

/// The mixed scenario: background streams and long prompts reported apart (long prompts have
/// a longer prefill), gaps during long prefills picked out, and the mixed bar charts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_scenario_reports_background_and_long_prompts_apart() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig {
        ttft: ms(10),
        itl: ms(5),
        prefill_per_token: Duration::from_micros(500),
        ..Default::default()
    })
    .await;
    let dir = temp_dir("mixed");
    let out = dir.join("mixed.json");
    let (ok, stdout, stderr) = run_bench(args(&[
        "mixed",
        "--base-url",
        &server.base_url,
        "--background-concurrency",
        "2",
        "--background-input-len",
        "8",
        "--background-output-len",
        "30",
        "--long-input-len",
        "300",
        "--long-output-len",
        "4",
        "--long-interval",
        "0.3",
        "--num-long",
        "2",
        "--warmup",
        "0.1",
        "--disable-tqdm",
        "--label",
        "mock",
        "--save-result",
        out.to_str().unwrap(),
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    for needle in [
        "Mixed Scenario Result",
        "Background streams: Inter-token Latency",
        "Background ITL during long prefills",
        "Long prompts: Time to First Token",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}\n{stdout}");
    }
    let j = read_json(&out);
    assert_eq!(j["long"]["completed"], 2);
    assert!(j["background"]["completed"].as_u64().unwrap() >= 2);
    assert_eq!(j["long"]["input_lens"], serde_json::json!([300, 300]));
    // Long prompts: 10 ms + 300 * 0.5 ms = 160 ms to first token; background: 10 ms + 4.5 ms.
    let long_ttft = j["long_mean_ttft_ms"].as_f64().unwrap();
    let bg_ttft = j["background_mean_ttft_ms"].as_f64().unwrap();
    assert!((150.0..260.0).contains(&long_ttft), "{long_ttft}");
    assert!(bg_ttft < 60.0, "{bg_ttft}");
    assert!(
        j["background_itl_during_long_prefill"]["count"].as_u64().unwrap() > 0,
        "background kept streaming during prefills"
    );
    let mean_itl = j["background"]["mean_itl_ms"].as_f64().unwrap();
    assert!((4.0..30.0).contains(&mean_itl), "server writes every 5 ms: {mean_itl}");
    let base = dir.join("mixed-chart");
    chart_as_two_sets(&out, &base).await;
    for suffix in ["itl", "ttft"] {
        let png = std::fs::read(dir.join(format!("mixed-chart-{suffix}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
        let svg = std::fs::read_to_string(dir.join(format!("mixed-chart-{suffix}.svg"))).unwrap();
        assert!(svg.contains("colocated") && svg.contains("1p1d"));
    }
}

/// Random prompts sent as token ids (completions): BOS first, exact lengths, spread by the
/// range ratio, as the server counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_id_prompts_with_range_ratio() {
    let _serial = SERIAL.lock().await;
    let server = start(MockConfig::default()).await;
    let dir = temp_dir("ids");
    let out = dir.join("r.json");
    let (ok, stdout, stderr) = run_bench(args(&[
        "--base-url",
        &server.base_url,
        "--num-prompts",
        "12",
        "--random-input-len",
        "40",
        "--random-output-len",
        "10",
        "--random-range-ratio",
        "0.5",
        "--prompt-token-ids",
        "--max-concurrency",
        "1",
        "--disable-tqdm",
        "--save-result",
        out.to_str().unwrap(),
        "--save-detailed",
    ]))
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    let j = read_json(&out);
    // One at a time, so the server's log is in input order (after the initial test request).
    let log = server.log.lock().unwrap();
    assert_eq!(log.len(), 13);
    for (i, r) in log.iter().skip(1).enumerate() {
        let ids = r.body["prompt"].as_array().expect("token ids sent");
        assert_eq!(ids[0], 0, "BOS first");
        assert_eq!(j["input_lens"][i].as_u64().unwrap() as usize, ids.len());
        assert!((20..=60).contains(&ids.len()), "{}", ids.len()); // 1 + [19, 59]
        let n = r.body["max_tokens"].as_u64().unwrap();
        assert!((5..=15).contains(&n) && j["output_lens"][i] == n);
    }
}
