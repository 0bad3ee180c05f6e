//! Serving through the actors on CPU ranks with the golden checkpoint: outputs equal the
//! engine's own in every deployment shape, routing shows in the metrics, validation happens at
//! submit, and the cluster is empty afterwards.

mod common;

use cleave_actors::config::DeployConfig;
use cleave_actors::{ActorError, Route};
use common::*;
use futures::future::join_all;

const MAX_TOKENS: usize = 24;

fn prompts() -> Vec<Vec<u32>> {
    // Short prompts (local route) and long ones (>= 256 tokens: prefill route where there is a
    // prefill pool), one of them spanning several 64-token blocks with a partial last block.
    vec![prompt(7, 1), prompt(40, 2), prompt(300, 3), prompt(64, 4), prompt(611, 5), prompt(256, 6)]
}

async fn run_all(cfg_name: &str, edit: impl FnOnce(&mut DeployConfig)) -> (Vec<Outcome>, String) {
    let c = start(config(cfg_name, edit));
    let streams = join_all(prompts().into_iter().map(|p| c.submit(p, greedy(MAX_TOKENS)))).await;
    let outs = join_all(streams.into_iter().map(|s| collect(s.expect("submitted")))).await;
    assert_no_leaks(&c);
    (outs, c.metrics_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_match_the_engine_in_colocated_1p1d_2p2d_and_parallel_groups() {
    let want = reference(&prompts(), MAX_TOKENS);
    // cpu-groups.yaml moves KV from a TP2 prefill group's rank 0 into one rank of a DP2 decode
    // group; swapped, from either rank of a DP2 prefill group into both ranks of a TP2 decode group.
    let swap = |c: &mut DeployConfig| {
        (c.prefill.tensor_parallel_size, c.prefill.data_parallel_size, c.prefill.enable_expert_parallel) = (1, 2, true);
        (c.decode.tensor_parallel_size, c.decode.data_parallel_size, c.decode.enable_expert_parallel) = (2, 1, false);
    };
    type Edit<'a> = &'a dyn Fn(&mut DeployConfig);
    let cfgs: [(&str, f64, Edit); 5] = [
        ("cpu-colocated.yaml", 0.0, &|_| {}),
        ("cpu-tiny.yaml", 3.0, &|_| {}),
        ("cpu-2p2d.yaml", 3.0, &|_| {}),
        ("cpu-groups.yaml", 3.0, &|_| {}),
        ("cpu-groups.yaml", 3.0, &swap),
    ];
    for (cfg, long_routes, edit) in cfgs {
        let (got, metrics) = run_all(cfg, edit).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.error, None, "{cfg} prompt {i}");
            assert_eq!(g.tokens, w.tokens, "{cfg} prompt {i}: tokens differ from the engine's");
            assert_eq!(g.text, w.text, "{cfg} prompt {i}");
            assert_eq!(g.finish, w.finish, "{cfg} prompt {i}");
        }
        let routed = |r: Route| metric(&metrics, &format!("cleave_router_requests_total{{route=\"{}\"}}", r.as_str()));
        assert_eq!(routed(Route::PrefillPool), long_routes, "{cfg}: long prompts take the prefill route\n{metrics}");
        assert_eq!(routed(Route::DecodeLocal), 6.0 - long_routes, "{cfg}: short prompts take the local route");
        let transfers = metric(&metrics, "cleave_kv_transfers_total");
        assert_eq!(transfers, long_routes, "{cfg}");
        assert_eq!(metric(&metrics, "cleave_kv_transfer_latency_seconds_count"), long_routes, "{cfg}");
        assert_eq!(metric(&metrics, "cleave_request_decode_time_seconds_count"), 6.0, "{cfg}");
        if long_routes > 0.0 {
            assert!(metric(&metrics, "cleave_kv_transfer_bytes_total") > 0.0, "{cfg}");
            assert!(metric(&metrics, "cleave_kv_transfer_seconds_total") > 0.0, "{cfg}");
        }
        assert_eq!(metric(&metrics, "cleave_kv_transfer_failures_total{reason=\"error\"}"), 0.0);
        assert_eq!(metric(&metrics, "cleave_generation_tokens_total"), (6 * MAX_TOKENS) as f64, "{cfg}");
        assert_eq!(metric(&metrics, "cleave_time_to_first_token_seconds_count"), 6.0, "{cfg}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_text_has_the_architecture_names() {
    let c = start(config("cpu-tiny.yaml", |_| {}));
    let s = c.submit(prompt(20, 9), greedy(4)).await.unwrap();
    collect(s).await;
    assert_no_leaks(&c);
    let labelled = c.metrics_text();
    let model = c.model_info().served_model_name;
    let series: Vec<&str> = labelled.lines().filter(|l| l.starts_with("cleave_")).collect();
    assert!(!series.is_empty() && series.iter().all(|l| l.contains(&format!("model_name=\"{model}\""))));
    let text: String = labelled.lines().map(without_model_name).collect::<Vec<_>>().join("\n");
    for name in [
        "cleave_router_requests_total",
        "cleave_queue_depth{pool=\"prefill\"}",
        "cleave_queue_depth{pool=\"decode\"}",
        "cleave_num_requests_running{pool=\"decode\",rank=\"1\"}",
        "cleave_kv_blocks_in_use{pool=\"prefill\",rank=\"0\"}",
        "cleave_kv_blocks_total{pool=\"decode\",rank=\"1\"}",
        "cleave_kv_transfer_bytes_total",
        "cleave_kv_transfer_seconds_total",
        "cleave_time_to_first_token_seconds_bucket",
        "cleave_inter_token_latency_seconds_bucket",
        "cleave_e2e_request_latency_seconds_bucket",
        "cleave_generation_tokens_total 4",
        "cleave_num_requests_in_flight 0",
        "cleave_kv_cache_usage_perc{pool=\"decode\",rank=\"1\"} 0",
        "cleave_kv_transfer_latency_seconds_count 0",
        "cleave_kv_transfer_size_bytes_bucket",
        "cleave_request_queue_time_seconds_count 1",
        "cleave_request_prefill_time_seconds_count 1",
        "cleave_request_decode_time_seconds_count 1",
        "cleave_num_preemptions_total{pool=\"decode\",rank=\"1\"} 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    // Every series the Grafana dashboard in deploy/ queries exists.
    let dash = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/cleave-dashboard.json"))
        .expect("the dashboard");
    let mut queried: Vec<&str> =
        dash.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("cleave_")).collect();
    queried.dedup();
    assert!(queried.len() >= 10, "{queried:?}");
    for q in queried {
        assert!(text.lines().any(|l| l.starts_with(q)), "the dashboard queries {q}, which is not exported");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_on_2p2d_finish_without_leaks() {
    let c = start(config("cpu-2p2d.yaml", |_| {}));
    let n = 200;
    // One in five is long enough for the prefill pool.
    let ps: Vec<Vec<u32>> = (0..n).map(|i| prompt(if i % 5 == 0 { 260 + i } else { 8 + i % 50 }, i)).collect();
    let streams = join_all(ps.iter().map(|p| c.submit(p.clone(), greedy(6 + (p.len() % 7))))).await;
    let outs = join_all(streams.into_iter().map(|s| collect(s.expect("submitted")))).await;
    for (i, (o, p)) in outs.iter().zip(&ps).enumerate() {
        assert_eq!(o.error, None, "request {i}");
        assert_eq!(o.tokens.len(), 6 + (p.len() % 7), "request {i}");
    }
    let stats = assert_no_leaks(&c);
    assert!(stats.ranks.iter().all(|r| r.blocks_in_use == 0 && r.blocks_total == 256), "{stats:#?}");
    let m = c.metrics_text();
    assert_eq!(
        metric(&m, "cleave_router_requests_total{route=\"prefill_pool\"}")
            + metric(&m, "cleave_router_requests_total{route=\"decode_local\"}"),
        200.0
    );
    assert!(metric(&m, "cleave_router_requests_total{route=\"prefill_pool\"}") >= 1.0, "{m}");
    assert_eq!(metric(&m, "cleave_requests_finished_total{reason=\"length\"}"), 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_streams_aborts_wherever_the_request_is() {
    let c = start(config("cpu-2p2d.yaml", |cfg| cfg.router.prefill_threshold = 100));
    // Long outputs so that nothing finishes by itself during the test.
    let mut streams = Vec::new();
    for i in 0..24 {
        let len = if i % 2 == 0 { 150 + 10 * i } else { 10 + i };
        streams.push(c.submit(prompt(len, i), greedy(600)).await.unwrap());
    }
    // A third are dropped at once (queued or prefilling), a third after their first token
    // (in transfer or decoding), a third after several tokens (decoding).
    let mut later = Vec::new();
    for (i, mut s) in streams.into_iter().enumerate() {
        match i % 3 {
            0 => drop(s),
            1 => {
                assert!(s.recv_async().await.is_some());
                drop(s);
            }
            _ => later.push(s),
        }
    }
    for mut s in later {
        for _ in 0..5 {
            assert!(matches!(s.recv_async().await, Some(cleave_actors::StreamEvent::Token(_))));
        }
        drop(s);
    }
    assert_no_leaks(&c);
    let m = c.metrics_text();
    assert_eq!(metric(&m, "cleave_requests_finished_total{reason=\"abort\"}"), 24.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_excess_requests_are_refused_at_submit() {
    let c = start(config("cpu-tiny.yaml", |cfg| cfg.server.max_concurrent_requests = 2));
    let info = c.model_info();
    assert_eq!((info.max_model_len, info.vocab_size, info.served_model_name.as_str()), (1024, 400, "tiny-r1"));
    assert!(info.eos_token_ids.contains(&1));
    let too_long = c.submit(prompt(1000, 1), greedy(100)).await.err();
    assert!(matches!(&too_long, Some(ActorError::Invalid(m)) if m.contains("maximum context length")), "{too_long:?}");
    let bad_token = c.submit(vec![5, 400], greedy(3)).await.err();
    assert!(matches!(bad_token, Some(ActorError::Invalid(_))), "{bad_token:?}");
    assert!(matches!(c.submit(vec![], greedy(3)).await.err(), Some(ActorError::Invalid(_))));
    assert!(matches!(c.submit(vec![5], greedy(0)).await.err(), Some(ActorError::Invalid(_))));
    let a = c.submit(prompt(10, 1), greedy(500)).await.unwrap();
    let b = c.submit(prompt(10, 2), greedy(500)).await.unwrap();
    let third = c.submit(prompt(10, 3), greedy(5)).await.err();
    assert!(matches!(&third, Some(e @ ActorError::AtCapacity { limit: 2 }) if e.is_retryable()), "{third:?}");
    drop((a, b));
    assert_no_leaks(&c);
    assert!(c.submit(prompt(10, 3), greedy(2)).await.is_ok());
    c.shutdown();
    assert!(matches!(c.submit(prompt(10, 3), greedy(2)).await.err(), Some(ActorError::ShuttingDown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_token_requests_queue_limit_and_seeded_sampling() {
    let c = start(config("cpu-tiny.yaml", |cfg| cfg.router.max_prefill_queue = 1));
    // The first token is also the last: the request ends on the prefill rank, nothing moves.
    let p = prompt(300, 1);
    let one = collect(c.submit(p.clone(), greedy(1)).await.unwrap()).await;
    assert_eq!(one.tokens, reference(std::slice::from_ref(&p), 1)[0].tokens);
    assert_eq!(one.finish, Some(cleave_engine::FinishReason::Length));
    assert_no_leaks(&c);
    let m = c.metrics_text();
    assert_eq!(metric(&m, "cleave_router_requests_total{route=\"prefill_pool\"}"), 1.0);
    assert_eq!(metric(&m, "cleave_kv_transfers_total"), 0.0);

    // With the prefill rank stalled, one long prompt fills its queue (limit 1): the others are
    // prefilled locally on the decode rank.
    assert!(c.inject_fault(0, cleave_actors::Fault::Hang(std::time::Duration::from_millis(300))));
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let ps: Vec<Vec<u32>> = (0..4).map(|i| prompt(300 + i, 50 + i)).collect();
    let streams = join_all(ps.iter().map(|p| c.submit(p.clone(), greedy(MAX_TOKENS)))).await;
    let got = join_all(streams.into_iter().map(|s| collect(s.unwrap()))).await;
    for (g, w) in got.iter().zip(reference(&ps, MAX_TOKENS)) {
        assert_eq!(g.tokens, w.tokens);
    }
    let m = c.metrics_text();
    assert_eq!(metric(&m, "cleave_router_requests_total{route=\"prefill_pool\"}"), 2.0, "{m}");
    assert_eq!(metric(&m, "cleave_router_requests_total{route=\"decode_local\"}"), 3.0);

    // Seeded sampling gives the same tokens through a KV transfer as on one rank.
    let seeded = cleave_engine::SamplingParams {
        temperature: 1.1,
        top_p: 0.9,
        seed: Some(3),
        ignore_eos: true,
        ..greedy(MAX_TOKENS)
    };
    let far = collect(c.submit(prompt(400, 7), seeded.clone()).await.unwrap()).await;
    let colocated = start(config("cpu-colocated.yaml", |_| {}));
    let local = collect(colocated.submit(prompt(400, 7), seeded).await.unwrap()).await;
    assert_eq!(far.tokens, local.tokens);
    assert_eq!(metric(&c.metrics_text(), "cleave_router_requests_total{route=\"prefill_pool\"}"), 3.0);
    assert_no_leaks(&c);
    assert_no_leaks(&colocated);
}
