//! Failures: a prefill rank killed in the middle of a transfer, a failed or timed-out transfer,
//! a decode rank that panics or hangs while decoding. Under `recompute` every stream completes
//! with exactly the tokens of an undisturbed run; under `fail` it ends with an error event. No
//! stream hangs and no KV block leaks.

mod common;

use std::time::Duration;

use cleave_actors::config::FailurePolicy;
use cleave_actors::{ActorError, Cluster, CpuRankFactory, Fault, RankStatus, StreamEvent};
use common::*;
use futures::future::join_all;

const MAX_TOKENS: usize = 20;

/// Two long prompts (prefill route) and a short one (local route) on cpu-tiny (1P1D).
fn mixed() -> Vec<Vec<u32>> {
    vec![prompt(300, 21), prompt(420, 22), prompt(12, 23)]
}

async fn wait_up(c: &Cluster, rank: usize) {
    for _ in 0..400 {
        if c.rank_status(rank) == Some(RankStatus::Up) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("rank {rank} did not come back: {:?}", c.rank_status(rank));
}

fn restarts(c: &Cluster, rank: usize) -> usize {
    c.stats().ranks.iter().find(|r| r.rank == rank).unwrap().restarts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_rank_killed_mid_transfer_loses_no_request_under_recompute() {
    let factory = CpuRankFactory::new();
    let hub = factory.hub();
    let c = Cluster::start_with(config("cpu-tiny.yaml", |_| {}), factory).unwrap();
    assert!(c.inject_fault(0, Fault::PanicOnKvSend));
    let ps = mixed();
    let streams = join_all(ps.iter().map(|p| c.submit(p.clone(), greedy(MAX_TOKENS)))).await;
    let got = join_all(streams.into_iter().map(|s| collect(s.unwrap()))).await;
    let want = reference(&ps, MAX_TOKENS);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.error, None, "prompt {i}");
        assert_eq!((&g.tokens, &g.text), (&w.tokens, &w.text), "prompt {i} differs after the recompute");
    }
    wait_up(&c, 0).await;
    assert_eq!(restarts(&c, 0), 1);
    assert_no_leaks(&c);
    assert_eq!(hub.pending(), 0, "no KV parcel is left behind");
    let m = c.metrics_text();
    assert!(metric(&m, "cleave_kv_transfer_failures_total{reason=\"rank_failed\"}") >= 1.0, "{m}");
    assert!(metric(&m, "cleave_recomputes_total") >= 1.0);
    assert_eq!(metric(&m, "cleave_rank_restarts_total{pool=\"prefill\"}"), 1.0);
    // The restarted prefill rank serves the prefill route again (a new prompt: one the decode
    // rank has cached would be prefilled there).
    let before = metric(&m, "cleave_kv_transfers_total");
    let fresh = prompt(300, 24);
    let again = collect(c.submit(fresh.clone(), greedy(MAX_TOKENS)).await.unwrap()).await;
    assert_eq!(again.tokens, reference(&[fresh], MAX_TOKENS)[0].tokens);
    assert_eq!(metric(&c.metrics_text(), "cleave_kv_transfers_total"), before + 1.0);
    assert_no_leaks(&c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_rank_killed_mid_transfer_ends_streams_with_an_error_under_fail() {
    let c = start(config("cpu-tiny.yaml", |cfg| cfg.kv_transfer.failure_policy = FailurePolicy::Fail));
    assert!(c.inject_fault(0, Fault::PanicOnKvSend));
    let ps = mixed();
    let want = reference(&ps, MAX_TOKENS);
    let streams = join_all(ps.iter().map(|p| c.submit(p.clone(), greedy(MAX_TOKENS)))).await;
    let got = join_all(streams.into_iter().map(|s| collect(s.unwrap()))).await;
    let mut errors = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        match &g.error {
            None => assert_eq!(g.tokens, w.tokens, "prompt {i}"),
            Some(ActorError::TransferFailed(_) | ActorError::RankFailed(_)) => {
                errors += 1;
                assert!(g.finish.is_none());
                assert_eq!(g.tokens[..], w.tokens[..g.tokens.len()], "prompt {i}: tokens before the error");
            }
            Some(e) => panic!("prompt {i}: unexpected error class {e:?}"),
        }
    }
    assert!(errors >= 1, "the transfer whose sender died must fail");
    assert!(got[2].error.is_none(), "the short prompt never touched the prefill rank");
    wait_up(&c, 0).await;
    assert_no_leaks(&c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_timed_out_transfers_are_recomputed() {
    let c = start(config("cpu-tiny.yaml", |cfg| cfg.kv_transfer.timeout_ms = 400));
    let p = prompt(300, 31);
    let want = reference(std::slice::from_ref(&p), MAX_TOKENS);
    // A transport error on the prefill rank.
    assert!(c.inject_fault(0, Fault::FailKvSend));
    let got = collect(c.submit(p.clone(), greedy(MAX_TOKENS)).await.unwrap()).await;
    assert_eq!((got.error, &got.tokens), (None, &want[0].tokens));
    assert_eq!(metric(&c.metrics_text(), "cleave_kv_transfer_failures_total{reason=\"error\"}"), 1.0);
    // The decode rank stalls past the transfer's timeout (a new prompt: the decode rank caches
    // the first one and would prefill it itself).
    let p = prompt(300, 32);
    let want = reference(std::slice::from_ref(&p), MAX_TOKENS);
    assert!(c.inject_fault(1, Fault::Hang(Duration::from_millis(1200))));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let got = collect(c.submit(p.clone(), greedy(MAX_TOKENS)).await.unwrap()).await;
    assert_eq!((got.error, &got.tokens), (None, &want[0].tokens));
    let m = c.metrics_text();
    assert_eq!(metric(&m, "cleave_kv_transfer_failures_total{reason=\"timeout\"}"), 1.0, "{m}");
    assert_eq!(
        metric(&m, "cleave_rank_restarts_total{pool=\"decode\"}"),
        0.0,
        "a stall shorter than the heartbeat timeout is not a death"
    );
    assert_no_leaks(&c);
}

/// Reads 3 tokens from each stream, then injects `fault` into `rank` and collects the rest.
async fn disturb_while_decoding(c: &Cluster, rank: usize, fault: Fault) -> Vec<Outcome> {
    let ps: Vec<Vec<u32>> = (0..4).map(|i| prompt(10 + 30 * i, 40 + i)).collect();
    let mut streams = Vec::new();
    for p in &ps {
        streams.push(c.submit(p.clone(), greedy(40)).await.unwrap());
    }
    let mut firsts = Vec::new();
    for s in &mut streams {
        let mut toks = Vec::new();
        for _ in 0..3 {
            match s.recv_async().await {
                Some(StreamEvent::Token(t)) => toks.push(t),
                other => panic!("{other:?}"),
            }
        }
        firsts.push(toks);
    }
    assert!(c.inject_fault(rank, fault));
    let rest = join_all(streams.into_iter().map(collect)).await;
    let want = reference(&ps, 40);
    firsts
        .into_iter()
        .zip(rest)
        .zip(want)
        .map(|((first, mut rest), want)| {
            let mut tokens: Vec<u32> = first.iter().map(|t| t.token).collect();
            tokens.append(&mut rest.tokens);
            let text = first.iter().map(|t| t.text.as_str()).collect::<String>() + &rest.text;
            assert_eq!(rest.error, None);
            assert_eq!((&tokens, &text), (&want.tokens, &want.text), "no token lost or repeated");
            Outcome { tokens, text, ..rest }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_rank_panic_while_decoding_is_recomputed_on_the_restarted_rank() {
    let c = start(config("cpu-colocated.yaml", |_| {}));
    disturb_while_decoding(&c, 0, Fault::Panic).await;
    wait_up(&c, 0).await;
    assert_eq!(restarts(&c, 0), 1);
    assert_no_leaks(&c);
}

/// cpu-groups.yaml: a TP2 prefill group (ranks 0, 1) and a DP2+EP decode group (ranks 2, 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rank_that_is_not_the_leader_takes_its_group_down_and_back_up() {
    let c = start(config("cpu-groups.yaml", |_| {}));
    // Rank 3 (the decode group's second rank, on a thread of its own) panics while decoding:
    // the group's step fails, the group restarts, and its streams are recomputed.
    disturb_while_decoding(&c, 2, Fault::PanicOnGroupRank(1)).await;
    wait_up(&c, 2).await;
    assert_eq!((restarts(&c, 2), restarts(&c, 0)), (1, 0), "only the decode group restarted");
    assert_no_leaks(&c);
    // Rank 1 of the prefill group fails in the next prefill: that prompt is recomputed on the
    // decode group, and the prefill group comes back and serves the prefill route again.
    let p = prompt(300, 70);
    let want = reference(std::slice::from_ref(&p), MAX_TOKENS);
    assert!(c.inject_fault(0, Fault::PanicOnGroupRank(1)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let got = collect(c.submit(p.clone(), greedy(MAX_TOKENS)).await.unwrap()).await;
    assert_eq!((got.error, &got.tokens), (None, &want[0].tokens));
    wait_up(&c, 0).await;
    assert_eq!(restarts(&c, 0), 1);
    let before = metric(&c.metrics_text(), "cleave_kv_transfers_total");
    let fresh = prompt(300, 71);
    let again = collect(c.submit(fresh.clone(), greedy(MAX_TOKENS)).await.unwrap()).await;
    assert_eq!(again.tokens, reference(&[fresh], MAX_TOKENS)[0].tokens);
    assert_eq!(metric(&c.metrics_text(), "cleave_kv_transfers_total"), before + 1.0);
    assert_no_leaks(&c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_decode_rank_is_replaced_after_a_missed_heartbeat() {
    let c = start(config("cpu-colocated.yaml", |cfg| cfg.supervisor.heartbeat_timeout_ms = 500));
    disturb_while_decoding(&c, 0, Fault::Hang(Duration::from_millis(1500))).await;
    wait_up(&c, 0).await;
    assert_eq!(restarts(&c, 0), 1);
    assert_no_leaks(&c);
    // Let the old incarnation wake up: it must exit without writing anything anywhere.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_no_leaks(&c);
    let again = collect(c.submit(prompt(10, 40), greedy(5)).await.unwrap()).await;
    assert_eq!(again.tokens.len(), 5);
}

/// A step never beats: one longer than the heartbeat timeout is not a death (a 4k prompt on the
/// 671B model takes seconds); only one longer than `max_step_ms` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_step_is_not_a_missed_heartbeat_but_an_endless_one_is_a_hang() {
    let c = start(config("cpu-colocated.yaml", |cfg| {
        cfg.supervisor.heartbeat_timeout_ms = 500;
        cfg.supervisor.max_step_ms = 3000;
    }));
    disturb_while_decoding(&c, 0, Fault::SlowStep(Duration::from_millis(1500))).await;
    assert_eq!(restarts(&c, 0), 0, "a 1.5 s step with a 0.5 s heartbeat timeout is not a death");
    disturb_while_decoding(&c, 0, Fault::SlowStep(Duration::from_millis(4500))).await;
    wait_up(&c, 0).await;
    assert_eq!(restarts(&c, 0), 1, "a step past max_step_ms is a hang");
    assert_no_leaks(&c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_does_not_load_is_a_start_error() {
    let e = Cluster::start(config("cpu-tiny.yaml", |cfg| cfg.kv_cache.num_blocks = Some(2))).err();
    assert!(matches!(&e, Some(ActorError::Load(m)) if m.contains("KV cache too small")), "{e:?}");
    let dir = std::env::temp_dir().join(format!("cleave-actors-noweights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(golden().join(f), dir.join(f)).unwrap();
    }
    let e = Cluster::start(config("cpu-2p2d.yaml", |cfg| cfg.model = dir.clone())).err();
    assert!(matches!(&e, Some(ActorError::Load(m)) if m.contains("rank")), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_keeps_killing_ranks_is_failed_not_retried_forever() {
    let c = start(config("cpu-colocated.yaml", |_| {}));
    let mut s = c.submit(prompt(20, 60), greedy(400)).await.unwrap();
    assert!(matches!(s.recv_async().await, Some(StreamEvent::Token(_))));
    // Kill the rank under the request again and again, as a poisonous request would.
    let mut last = None;
    for i in 0..4 {
        wait_up(&c, 0).await;
        assert!(c.inject_fault(0, Fault::Panic));
        // Wait until the restart happened before the next kill.
        for _ in 0..400 {
            if restarts(&c, 0) > i {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(restarts(&c, 0), i + 1);
    }
    while let Some(ev) = s.recv_async().await {
        last = Some(ev);
    }
    assert!(matches!(&last, Some(StreamEvent::Error(ActorError::RankFailed(m))) if m.contains("given up")), "{last:?}");
    wait_up(&c, 0).await;
    assert_no_leaks(&c);
}
