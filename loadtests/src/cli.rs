//! Command-line options, named as `vllm bench serve` names them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Map, Value};

mod subcommands;
pub use subcommands::{BatchArgs, ChartArgs, MixedArgs, MultiTurnArgs, SoakArgs, SweepArgs};

/// `cleave-bench`: with no subcommand, one benchmark run (like `vllm bench serve`).
#[derive(Debug, Parser)]
#[command(
    name = "cleave-bench",
    version,
    about = "Benchmark an OpenAI-compatible server the way `vllm bench serve` does"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A subcommand; none runs one benchmark.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of the plain benchmark.
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// The subcommands.
// One per process: boxing the larger argument sets would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one benchmark per max-concurrency or request-rate value; write JSON, CSV and charts.
    Sweep(SweepArgs),
    /// Draw the charts of one or more sweep directories on one figure.
    Chart(ChartArgs),
    /// Long reasoning streams in the background plus periodic long prompts.
    Mixed(MixedArgs),
    /// Send tagged prompts and write tagged responses (reasoning and content apart).
    Batch(BatchArgs),
    /// Sustained abuse: normal, disconnecting and malformed requests beyond the admitted
    /// concurrency; fails on any wrong answer, a leak, or growing memory.
    Soak(SoakArgs),
    /// Multi-turn chats sharing one long system prompt (prefix caching): TTFT of first and
    /// later turns, throughput and the cached prompt tokens the server reports.
    MultiTurn(MultiTurnArgs),
}

/// vLLM's `--backend` names: which API the requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The completions API (vLLM's default).
    Vllm,
    /// The completions API.
    Openai,
    /// The chat completions API.
    OpenaiChat,
}

/// Where to send requests.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Server base URL (scheme, host, port); default: http://HOST:PORT.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Server host when no --base-url is given.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server port when no --base-url is given.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The API: vllm or openai (/v1/completions), openai-chat (/v1/chat/completions).
    #[arg(long, value_enum, default_value = "vllm")]
    pub backend: Backend,
    /// API path (default: the backend's).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Model name to send (default: the first model of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// An HTTP header `KEY=VALUE` sent with every request (repeatable). Without an
    /// `Authorization` header, `$OPENAI_API_KEY` is sent as a bearer token when set, as vLLM does.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Sampling temperature (default: the server's).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// JSON object merged into every request body, e.g. '{"top_p": 0.95}'.
    #[arg(long)]
    pub extra_body: Option<String>,
}

impl ServerArgs {
    /// `--base-url`, else `http://HOST:PORT`.
    pub fn base_url(&self) -> String {
        self.base_url.clone().unwrap_or_else(|| format!("http://{}:{}", self.host, self.port))
    }

    /// The `--backend` as vLLM names it.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Vllm => "vllm",
            Backend::Openai => "openai",
            Backend::OpenaiChat => "openai-chat",
        }
    }

    /// `--endpoint`, else the backend's path.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone().unwrap_or_else(|| {
            match self.backend {
                Backend::Vllm | Backend::Openai => "/v1/completions",
                Backend::OpenaiChat => "/v1/chat/completions",
            }
            .into()
        })
    }

    /// The `--header` pairs, plus `Authorization: Bearer $OPENAI_API_KEY` unless one is given.
    pub fn headers(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for h in &self.headers {
            let (k, v) = h.split_once('=').with_context(|| format!("--header {h:?}: expected KEY=VALUE"))?;
            if k.trim().is_empty() {
                bail!("--header {h:?}: the name is empty");
            }
            out.push((k.trim().to_string(), v.to_string()));
        }
        if !out.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization")) {
            if let Some(key) = std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()) {
                out.push(("Authorization".into(), format!("Bearer {key}")));
            }
        }
        Ok(out)
    }
    /// `--temperature` and `--extra-body` as one object.
    pub fn extra_body(&self) -> Result<Option<Map<String, Value>>> {
        let mut body = match &self.extra_body {
            Some(s) => match serde_json::from_str(s).context("--extra-body is not JSON")? {
                Value::Object(m) => m,
                _ => bail!("--extra-body must be a JSON object"),
            },
            None => Map::new(),
        };
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), t.into());
        }
        Ok((!body.is_empty()).then_some(body))
    }
}

/// Dataset kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetKind {
    /// Random token ids, exact lengths, built with the server's tokenizer.
    Random,
    /// A JSONL file (--dataset-path): {"prompt": ...} or {"messages": ...}, optional "output_len".
    Jsonl,
    /// A ShareGPT JSON file (--dataset-path), sampled as vLLM samples it.
    Sharegpt,
    /// vLLM's prefix_repetition: --prefix-repetition-num-prefixes random prefixes, each shared
    /// by an equal share of the prompts, each prompt its own random suffix (prefix caching).
    #[value(name = "prefix_repetition", alias = "prefix-repetition")]
    PrefixRepetition,
}

/// What to send and how to measure it.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Dataset.
    #[arg(long, alias = "dataset-name", value_enum, default_value = "random")]
    pub dataset: DatasetKind,
    /// The file for --dataset jsonl or sharegpt.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// ShareGPT: ask for this many output tokens instead of each reply's length.
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Mean prompt length in tokens (random dataset).
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Mean output length in tokens (random dataset; default for JSONL rows without one).
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths are uniform in [len*(1-r), len*(1+r)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// A tokenizer (a `tokenizer.json`, or a directory holding one) to build prompts with here;
    /// default: the server's /tokenize and /detokenize.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Tokens of one random prefix shared by every prompt, before its own --random-input-len.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// prefix_repetition: tokens of each shared prefix.
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_prefix_len: usize,
    /// prefix_repetition: tokens of each prompt's own suffix.
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_suffix_len: usize,
    /// prefix_repetition: how many distinct prefixes.
    #[arg(long, default_value_t = 10)]
    pub prefix_repetition_num_prefixes: usize,
    /// prefix_repetition: output tokens per request.
    #[arg(long, default_value_t = 128)]
    pub prefix_repetition_output_len: usize,
    /// Draw random token ids from LO:HI (exclusive) instead of the ids of a built-in corpus.
    #[arg(long, value_parser = parse_range)]
    pub token_id_range: Option<(u32, u32)>,
    /// Send random prompts as token ids (completions only) instead of text.
    #[arg(long)]
    pub prompt_token_ids: bool,
    /// Number of prompts.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Send ignore_eos (always on for the random dataset, as in vLLM).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Seed of prompts and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Gamma shape of request gaps (1 = Poisson); only with a finite --request-rate.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Goodput SLOs in ms: ttft:MS tpot:MS e2el:MS.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Percentiles to report, comma-separated.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// Metrics to report percentiles of: ttft, tpot, itl, e2el.
    #[arg(long, default_value = "ttft,tpot,itl,e2el")]
    pub percentile_metrics: String,
    /// Warm-up requests (the first prompt) before the measured run.
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    /// Retry the initial test request for this many seconds (0: one try).
    #[arg(long, default_value_t = 0.0)]
    pub ready_check_timeout_sec: f64,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

impl WorkloadArgs {
    /// The `--metric-percentiles` list.
    pub fn percentiles(&self) -> Result<Vec<f64>> {
        self.metric_percentiles
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                let p: f64 = s.trim().parse().with_context(|| format!("--metric-percentiles: {s:?}"))?;
                if !(0.0..=100.0).contains(&p) {
                    bail!("--metric-percentiles: {p} is not in [0, 100]");
                }
                Ok(p)
            })
            .collect()
    }

    /// The `--percentile-metrics` list, checked.
    pub fn selected_metrics(&self) -> Result<Vec<String>> {
        let v: Vec<String> =
            self.percentile_metrics.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        for m in &v {
            if !["ttft", "tpot", "itl", "e2el"].contains(&m.as_str()) {
                bail!("--percentile-metrics: unknown metric {m:?} (ttft, tpot, itl, e2el)");
            }
        }
        Ok(v)
    }
}

fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s.split_once(':').ok_or("expected LO:HI")?;
    Ok((a.trim().parse().map_err(|e| format!("{e}"))?, b.trim().parse().map_err(|e| format!("{e}"))?))
}

/// One benchmark run.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Requests per second ("inf": all at once).
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Most requests in flight at once.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Save the result JSON: `--save-result` alone writes RESULT_DIR/RESULT_FILENAME (vLLM's
    /// flag), `--save-result PATH` writes PATH.
    #[arg(long, num_args = 0..=1, value_name = "PATH")]
    pub save_result: Option<Option<PathBuf>>,
    /// Directory of the saved result (default: the current one).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// File name of the saved result (default as vLLM's:
    /// BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Keep the per-request arrays (lengths, TTFTs, ITLs, texts, errors) in the saved result.
    #[arg(long)]
    pub save_detailed: bool,
    /// A label stored in the result.
    #[arg(long)]
    pub label: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_style_options_and_subcommands() {
        let cli = Cli::try_parse_from([
            "cleave-bench",
            "--base-url",
            "http://h:1",
            "--endpoint",
            "/v1/chat/completions",
            "--request-rate",
            "inf",
            "--max-concurrency",
            "4",
            "--goodput",
            "ttft:500",
            "tpot:50",
            "--random-range-ratio",
            "0.2",
            "--ignore-eos",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert!(cli.bench.request_rate.is_infinite());
        assert_eq!(cli.bench.max_concurrency, Some(4));
        assert_eq!(cli.bench.workload.goodput, vec!["ttft:500", "tpot:50"]);
        let cli = Cli::try_parse_from(["cleave-bench", "sweep", "--max-concurrency", "1,2,4,8", "--output-dir", "o"])
            .unwrap();
        let Some(Command::Sweep(s)) = cli.command else { panic!() };
        assert_eq!(s.max_concurrency, vec![1, 2, 4, 8]);
        let cli = Cli::try_parse_from(["cleave-bench", "sweep", "--request-rate", "1,2.5"]).unwrap();
        let Some(Command::Sweep(s)) = cli.command else { panic!() };
        assert_eq!(s.request_rate, vec![1.0, 2.5]);
        assert!(
            Cli::try_parse_from(["cleave-bench", "sweep", "--request-rate", "1", "--max-concurrency", "2"]).is_err()
        );
        let cli = Cli::try_parse_from([
            "cleave-bench",
            "chart",
            "--input",
            "a",
            "--input",
            "b",
            "--label",
            "x",
            "--label",
            "y",
        ])
        .unwrap();
        let Some(Command::Chart(c)) = cli.command else { panic!() };
        assert_eq!((c.input.len(), c.label.len()), (2, 2));
        let cli = Cli::try_parse_from(["cleave-bench", "--token-id-range", "3:100", "--metric-percentiles", "50,99.9"])
            .unwrap();
        assert_eq!(cli.bench.workload.token_id_range, Some((3, 100)));
        assert_eq!(cli.bench.workload.percentiles().unwrap(), vec![50.0, 99.9]);
        assert!(Cli::try_parse_from(["cleave-bench", "--percentile-metrics", "foo"])
            .unwrap()
            .bench
            .workload
            .selected_metrics()
            .is_err());
        let s = Cli::try_parse_from(["cleave-bench", "--temperature", "0", "--extra-body", "{\"top_p\":0.9}"])
            .unwrap()
            .bench
            .server;
        let b = s.extra_body().unwrap().unwrap();
        assert_eq!((b["temperature"].as_f64(), b["top_p"].as_f64()), (Some(0.0), Some(0.9)));
        assert_eq!((s.base_url(), s.endpoint()), ("http://127.0.0.1:8000".into(), "/v1/completions".into()));
    }

    #[test]
    fn vllm_bench_serve_flags_parse_with_their_meaning() {
        let cli = Cli::try_parse_from([
            "cleave-bench",
            "--backend",
            "openai-chat",
            "--host",
            "10.0.0.2",
            "--port",
            "9000",
            "--tokenizer",
            "models/tiny-r1",
            "--header",
            "Authorization=Bearer k",
            "--header",
            "x-trace=1",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            "out",
            "--result-filename",
            "r.json",
            "--random-prefix-len",
            "100",
        ])
        .unwrap();
        let b = &cli.bench;
        assert_eq!(b.server.base_url(), "http://10.0.0.2:9000");
        assert_eq!(b.server.endpoint(), "/v1/chat/completions");
        let h = b.server.headers().unwrap();
        assert_eq!(h, vec![("Authorization".into(), "Bearer k".into()), ("x-trace".into(), "1".into())]);
        assert_eq!(b.save_result, Some(None));
        assert!(b.save_detailed && b.workload.random_prefix_len == 100);
        let cli = Cli::try_parse_from(["cleave-bench", "--save-result", "x.json", "--num-prompts", "3"]).unwrap();
        assert_eq!(cli.bench.save_result, Some(Some(PathBuf::from("x.json"))));
        assert_eq!(cli.bench.workload.num_prompts, 3);
        let bad = Cli::try_parse_from(["cleave-bench", "--header", "nokey"]).unwrap();
        assert!(bad.bench.server.headers().is_err());
    }
}
