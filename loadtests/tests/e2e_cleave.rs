//! End-to-end against the real `cleave serve` (the workspace's `cleave` binary) on the CPU:
//! a 20-prompt benchmark, a 3-point sweep with its charts, a batch run and a small mixed run,
//! all through one server started with `--port 0`.
//!
//! The server runs configs/cpu-tiny.yaml (the CPU default) when models/tiny-r1 holds a
//! checkpoint that starts, else the same config pointed at the golden bf16 checkpoint. The
//! binary is target/<profile>/cleave; when absent it is built with `cargo build --bin cleave`.
//! CLEAVE_BENCH_E2E_MODEL=golden skips tiny-r1 and uses the golden checkpoint.
//! When it cannot be built or has no `serve`, the test is skipped with a message, unless
//! CLEAVE_BENCH_REQUIRE_SERVE=1 (then it fails).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{read_json, temp_dir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The profile directory this test binary was built into (debug, release, ...).
fn profile_dir() -> PathBuf {
    // target/<profile>/deps/e2e_cleave-HASH
    let exe = std::env::current_exe().expect("test exe");
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_else(|| root().join("target/debug"))
}

fn skip(why: &str) {
    if std::env::var("CLEAVE_BENCH_REQUIRE_SERVE").is_ok_and(|v| v == "1") {
        panic!("cleave serve is required (CLEAVE_BENCH_REQUIRE_SERVE=1): {why}");
    }
    eprintln!("SKIPPED e2e against cleave serve: {why}");
}

fn cleave_binary() -> Result<PathBuf, String> {
    let bin = profile_dir().join(format!("cleave{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        eprintln!("{} is absent: running cargo build --bin cleave", bin.display());
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--bin", "cleave"]).current_dir(root());
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() || !bin.is_file() {
            return Err(format!("cargo build --bin cleave failed ({status})"));
        }
    }
    let help =
        Command::new(&bin).args(["serve", "--help"]).output().map_err(|e| format!("running {}: {e}", bin.display()))?;
    if !help.status.success() {
        return Err(format!("{} has no `serve` subcommand (rebuild it: cargo build --bin cleave)", bin.display()));
    }
    Ok(bin)
}

/// A running `cleave serve`, killed on drop.
struct Serve {
    child: Child,
    url: String,
    model: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_serve(bin: &Path, config: &Path) -> Result<Serve, String> {
    start_with(bin, &["--config", config.to_str().unwrap()])
}

/// `cleave serve ARGS --port 0`.
fn start_with(bin: &Path, args: &[&str]) -> Result<Serve, String> {
    let mut child = Command::new(bin)
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning cleave serve: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("ready at ").nth(1) {
                let url = rest.split_whitespace().next().unwrap_or("").to_string();
                let model =
                    rest.split("(model ").nth(1).map(|m| m.trim_end_matches(')').to_string()).unwrap_or_default();
                let _ = tx.send((url, model));
            }
        }
    });
    let stderr = child.stderr.take().unwrap();
    let (etx, erx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tail = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            tail.push(line);
        }
        let _ = etx.send(tail.join("\n"));
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok((url, model)) => Ok(Serve { child, url, model }),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            let err = erx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
            Err(format!("cleave serve {} did not get ready: {err}", args.join(" ")))
        }
    }
}

/// The CPU default when tiny-r1 has weights and starts, else the golden bf16 checkpoint.
fn start_any(bin: &Path, dir: &Path) -> Result<Serve, String> {
    let default = root().join("configs/cpu-tiny.yaml");
    let yaml = std::fs::read_to_string(&default).map_err(|e| format!("reading {}: {e}", default.display()))?;
    let mut why = String::new();
    let force_golden = std::env::var("CLEAVE_BENCH_E2E_MODEL").is_ok_and(|v| v == "golden");
    if !force_golden && root().join("models/tiny-r1/model.safetensors").is_file() {
        match start_serve(bin, &default) {
            Ok(s) => return Ok(s),
            Err(e) => why = format!("{e}; "),
        }
    }
    let golden = root().join("models/golden/bf16-qlora");
    let cfg: String = yaml
        .lines()
        .map(|l| {
            if l.starts_with("model:") {
                format!("model: {}", golden.display())
            } else if l.starts_with("served_model_name:") {
                "served_model_name: golden".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = dir.join("golden.yaml");
    std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
    start_serve(bin, &path).map_err(|e| format!("{why}{e}"))
}

fn bench(args: &[&str]) -> String {
    bench_env(args, &[])
}

fn bench_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cleave-bench"));
    cmd.args(args).env_remove("OPENAI_API_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running cleave-bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "cleave-bench {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout.to_string()
}

#[test]
fn benchmark_sweep_batch_and_mixed_against_cleave_serve() {
    let bin = match cleave_binary() {
        Ok(b) => b,
        Err(why) => return skip(&why),
    };
    let dir = temp_dir("cleave-serve");
    let serve = match start_any(&bin, &dir) {
        Ok(s) => s,
        Err(why) => return skip(&why),
    };
    eprintln!("cleave serve at {} with model {}", serve.url, serve.model);
    let url = serve.url.as_str();

    // 1. The 20-prompt benchmark: exact random input lengths as the server counts them.
    let result = dir.join("bench.json");
    let stdout = bench(&[
        "--base-url",
        url,
        "--num-prompts",
        "20",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--max-concurrency",
        "4",
        "--seed",
        "1",
        "--disable-tqdm",
        "--save-result",
        result.to_str().unwrap(),
        "--save-detailed",
    ]);
    println!("{stdout}");
    assert!(stdout.contains("============ Serving Benchmark Result ============"));
    let j = read_json(&result);
    assert_eq!((j["completed"].as_u64(), j["failed"].as_u64()), (Some(20), Some(0)), "errors: {}", j["errors"]);
    assert_eq!(j["model_id"], serve.model.as_str());
    assert!(j["input_lens"].as_array().unwrap().iter().all(|x| x == 32), "input lens {}", j["input_lens"]);
    assert!(
        j["output_lens"].as_array().unwrap().iter().all(|x| x == 8),
        "ignore_eos gives full outputs: {}",
        j["output_lens"]
    );
    assert_eq!(j["total_input_tokens"], 640);
    assert!(j["mean_ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(j["mean_e2el_ms"].as_f64().unwrap() >= j["mean_ttft_ms"].as_f64().unwrap());

    // 2. A 3-point sweep with its charts.
    let sweep = dir.join("sweep");
    bench(&[
        "sweep",
        "--base-url",
        url,
        "--max-concurrency",
        "1,2,4",
        "--num-prompts",
        "6",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--disable-tqdm",
        "--label",
        "cleave",
        "--output-dir",
        sweep.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(sweep.join("sweep.csv")).unwrap().lines().count(), 4);
    for c in [1, 2, 4] {
        assert_eq!(read_json(&sweep.join(format!("cleave-concurrency{c}.json")))["completed"], 6);
    }
    assert!(std::fs::metadata(sweep.join("sweep.png")).unwrap().len() > 20_000);
    assert!(std::fs::metadata(sweep.join("sweep.svg")).unwrap().len() > 10_000);

    // 3. A batch run: tagged chat prompts, reasoning and content apart, input order.
    let prompts = dir.join("prompts.json");
    std::fs::write(
        &prompts,
        r#"[{"tag": "a", "prompt": "What is 12 + 30?"}, {"tag": "b", "prompt": "Count to three.", "system": "Be brief."}, {"tag": "c", "prompt": "Hello"}]"#,
    )
    .unwrap();
    let responses = dir.join("responses.json");
    bench(&[
        "batch",
        "--base-url",
        url,
        "--input",
        prompts.to_str().unwrap(),
        "--output",
        responses.to_str().unwrap(),
        "--max-concurrency",
        "2",
        "--max-tokens",
        "12",
        "--disable-tqdm",
    ]);
    let r = read_json(&responses);
    let r = r.as_array().unwrap();
    assert_eq!(r.iter().map(|x| x["tag"].as_str().unwrap()).collect::<Vec<_>>(), ["a", "b", "c"]);
    for x in r {
        assert!(x["error"].is_null(), "{x}");
        assert!(x["reasoning"].is_string() || x["content"].is_string(), "{x}");
        assert!(["stop", "length"].contains(&x["finish_reason"].as_str().unwrap()), "{x}");
        assert!(x["usage"]["completion_tokens"].as_u64().unwrap() <= 12);
    }

    // 4. A small mixed run: long prompts (over the prefill threshold) among background streams.
    let mixed = dir.join("mixed.json");
    bench(&[
        "mixed",
        "--base-url",
        url,
        "--background-concurrency",
        "2",
        "--background-input-len",
        "16",
        "--background-output-len",
        "48",
        "--long-input-len",
        "300",
        "--long-output-len",
        "4",
        "--long-interval",
        "0.5",
        "--num-long",
        "2",
        "--warmup",
        "0.3",
        "--disable-tqdm",
        "--save-result",
        mixed.to_str().unwrap(),
    ]);
    let m = read_json(&mixed);
    assert_eq!(m["long"]["completed"], 2, "{}", m["long"]["errors"]);
    assert_eq!(m["long"]["input_lens"], serde_json::json!([300, 300]));
    assert!(m["background"]["completed"].as_u64().unwrap() >= 2);
    assert_eq!(m["background"]["failed"], 0);
}

/// `vllm serve`'s and `vllm bench serve`'s command lines: a MODEL and flags with an API key on
/// the server; the key from OPENAI_API_KEY, --backend, --host/--port, a local --tokenizer, a
/// shared --random-prefix-len and --save-result into --result-dir on the client.
#[test]
fn vllm_command_lines_with_an_api_key() {
    let bin = match cleave_binary() {
        Ok(b) => b,
        Err(why) => return skip(&why),
    };
    let model = root().join("models/tiny-r1");
    let serve = match start_with(
        &bin,
        &[model.to_str().unwrap(), "--served-model-name", "r1", "--max-num-seqs", "8", "--api-key", "sk-e2e"],
    ) {
        Ok(s) => s,
        Err(why) => return skip(&why),
    };
    let port = serve.url.rsplit(':').next().unwrap().to_string();
    let dir = temp_dir("vllm-flags");
    let common = [
        "--backend",
        "openai-chat",
        "--host",
        "127.0.0.1",
        "--port",
        port.as_str(),
        "--tokenizer",
        model.to_str().unwrap(),
        "--num-prompts",
        "6",
        "--random-input-len",
        "24",
        "--random-prefix-len",
        "16",
        "--random-output-len",
        "4",
        "--max-concurrency",
        "3",
        "--disable-tqdm",
    ];
    let mut args = common.to_vec();
    args.extend(["--save-result", "--result-dir", dir.to_str().unwrap()]);
    let stdout = bench_env(&args, &[("OPENAI_API_KEY", "sk-e2e")]);
    assert!(stdout.contains("Successful requests:                     6"), "{stdout}");
    let saved: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let name = saved[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("openai-chat-infqps-concurrency3-r1-") && name.ends_with(".json"), "{name}");
    let j = read_json(&saved[0]);
    assert_eq!((j["completed"].as_u64(), j["total_output_tokens"].as_u64()), (Some(6), Some(24)));
    assert!(j.get("ttfts").is_none(), "per-request arrays only with --save-detailed");
    // Without the key the server refuses every request.
    let out = Command::new(env!("CARGO_BIN_EXE_cleave-bench"))
        .args(common)
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("running cleave-bench");
    assert!(!out.status.success(), "requests without the key must fail");
}

/// The soak (issue 17): a minute each on the CPU default (1P1D) and on 2p2d, at twice the
/// admitted concurrency, with disconnects and bad input mixed in. `cleave-bench soak` fails on
/// any wrong answer, a request or KV block left behind, or resident memory growing.
#[test]
fn soak_a_minute_on_the_cpu_default_and_on_2p2d() {
    let bin = match cleave_binary() {
        Ok(b) => b,
        Err(why) => return skip(&why),
    };
    let dir = temp_dir("soak");
    for cfg in ["cpu-tiny.yaml", "cpu-2p2d.yaml"] {
        let yaml = std::fs::read_to_string(root().join("configs").join(cfg)).unwrap();
        let yaml: String = yaml
            .lines()
            .map(|l| {
                if l.starts_with("server:") {
                    "server: {host: 127.0.0.1, port: 0, max_concurrent_requests: 8}"
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let path = root().join("configs").join(format!("_soak-{}-{cfg}", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        let serve = start_serve(&bin, &path);
        let _ = std::fs::remove_file(&path);
        let serve = match serve {
            Ok(s) => s,
            Err(why) => return skip(&why),
        };
        let out = dir.join(format!("{cfg}.json"));
        let pid = serve.child.id().to_string();
        let secs = std::env::var("CLEAVE_SOAK_SECONDS").unwrap_or_else(|_| "60".into());
        bench(&[
            "soak",
            "--base-url",
            &serve.url,
            "--duration-s",
            &secs,
            "--concurrency",
            "16",
            "--pid",
            &pid,
            "--save-result",
            out.to_str().unwrap(),
        ]);
        let j = read_json(&out);
        println!("{cfg}: {j}");
        assert_eq!(j["unexpected"], 0, "{cfg}");
        assert!(j["completed"].as_u64().unwrap() > 0 && j["refused_429"].as_u64().unwrap() > 0, "{cfg}: {j}");
        assert!(j["disconnected"].as_u64().unwrap() > 0 && j["bad_input_rejected"].as_u64().unwrap() > 0, "{cfg}");
    }
}
