//! `cleave serve`: start the cluster of a deployment config and the OpenAI-compatible gateway in
//! front of it.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cleave_actors::config::{DeployConfig, Device, Dtype, ServeFlags};
use cleave_actors::Cluster;
use cleave_engine::weights::LoadFormat;
use cleave_gateway::{GatewayConfig, Server};

#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint directory to serve (as `vllm serve MODEL`); with --config it
    /// replaces the file's `model`.
    #[arg(value_name = "MODEL")]
    model_pos: Option<PathBuf>,
    /// The same as MODEL (vLLM's older `--model`).
    #[arg(long, conflicts_with = "model_pos")]
    model: Option<PathBuf>,
    /// Deployment YAML; the flags below override it (default without MODEL:
    /// configs/cpu-tiny.yaml, the tiny-r1 model on the CPU).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A chat template (a Jinja file, or the template itself) instead of the model's, e.g.
    /// examples/tool_chat_template_deepseekr1.jinja for DeepSeek-R1 with tools.
    #[arg(long)]
    chat_template: Option<String>,
    /// Print the resolved deployment as YAML and exit without loading anything.
    #[arg(long)]
    print_config: bool,
    /// Address to listen on.
    #[arg(long)]
    host: Option<String>,
    /// Port (0 picks a free port).
    #[arg(long)]
    port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on /v1/* (default: $CLEAVE_API_KEY, else vLLM's
    /// $VLLM_API_KEY; none: open).
    #[arg(long)]
    api_key: Option<String>,
    /// Name clients use in `model` (default: the model directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Where the ranks run.
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// auto (bfloat16 on CUDA, float32 on the CPU), bfloat16, or float32 (`float` as in vLLM).
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Longest prompt + output (default: the model's).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Sequences a group runs at once (both pools).
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Tokens a group computes per step (both pools).
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// Fraction of each GPU for weights plus KV cache.
    #[arg(long)]
    gpu_memory_utilization: Option<f64>,
    /// KV cache blocks per rank, instead of sizing from GPU memory.
    #[arg(long)]
    num_gpu_blocks_override: Option<usize>,
    /// Tokens per KV cache block.
    #[arg(long)]
    block_size: Option<usize>,
    /// Ranks splitting attention heads and MLPs in each group.
    #[arg(long, visible_alias = "tp")]
    tensor_parallel_size: Option<usize>,
    /// Ranks each attending their own sequences in each group, exchanging tokens in MoE layers.
    #[arg(long, visible_alias = "dp")]
    data_parallel_size: Option<usize>,
    /// Whole routed experts per rank instead of a slice of every expert.
    #[arg(long)]
    enable_expert_parallel: bool,
    /// Reuse the KV of cached prompt prefixes (the default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    enable_prefix_caching: bool,
    /// Recompute every prompt in full; also turns off cache-aware routing.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    no_enable_prefix_caching: bool,
    /// Disaggregated serving: the prefill pool's ranks (GPU ordinals on CUDA), e.g. 0,1,2,3.
    #[arg(long, value_delimiter = ',')]
    prefill_ranks: Option<Vec<usize>>,
    /// The decode pool's ranks (default: one group right after the prefill ranks).
    #[arg(long, value_delimiter = ',')]
    decode_ranks: Option<Vec<usize>>,
    /// The prefill pool's group shape when it differs from --tensor-parallel-size.
    #[arg(long)]
    prefill_tensor_parallel_size: Option<usize>,
    /// The prefill pool's group shape when it differs from --data-parallel-size.
    #[arg(long)]
    prefill_data_parallel_size: Option<usize>,
    /// Prompts with at least this many tokens are prefilled on the prefill pool.
    #[arg(long)]
    prefill_threshold: Option<usize>,
    /// Origins browsers may call the API from: a JSON list as vLLM takes it ('["*"]') or
    /// comma-separated; none by default (no CORS headers).
    #[arg(long, value_parser = parse_origins)]
    allowed_origins: Option<Origins>,
    /// No periodic stats line per pool in the log.
    #[arg(long)]
    disable_log_stats: bool,
    /// How R1's reasoning is split from the answer (`reasoning_content` and `reasoning`).
    #[arg(long, value_enum)]
    reasoning_parser: Option<ReasoningParser>,
    /// cleave always lets the model choose to call tools (`tool_choice: auto`, the default with
    /// `tools`); accepted so vLLM command lines run unchanged.
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// How tool calls are read from the output: DeepSeek-V3/R1's tool-call tokens (V3.1's
    /// variant is read too), the only format cleave's models write.
    #[arg(long, value_enum)]
    tool_call_parser: Option<ToolCallParser>,
    /// Capture no CUDA graphs: every step runs eagerly (by default CUDA ranks capture their
    /// decode steps at start-up). Sets `enforce_eager` of the config.
    #[arg(long)]
    enforce_eager: bool,
    /// Where the weights come from: auto / safetensors (the model directory's files) or dummy
    /// (random weights of the shapes and format its config.json declares; for benchmarks).
    /// Sets `load_format` of the config.
    #[arg(long)]
    load_format: Option<LoadFormat>,
    /// cleave never runs code from a checkpoint; accepted so vLLM command lines run unchanged.
    #[arg(long)]
    trust_remote_code: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
}

/// `--allowed-origins`, parsed.
#[derive(Clone, Debug)]
struct Origins(Vec<String>);

fn parse_origins(s: &str) -> Result<Origins, String> {
    if s.trim_start().starts_with('[') {
        return serde_json::from_str(s).map(Origins).map_err(|e| format!("not a JSON list of strings: {e}"));
    }
    Ok(Origins(s.split(',').map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect()))
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DtypeArg {
    Auto,
    Bfloat16,
    #[value(alias = "float")]
    Float32,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ReasoningParser {
    /// `<think>...</think>` as DeepSeek-R1 writes it (cleave's default for models whose chat
    /// template opens a think block).
    #[value(name = "deepseek_r1")]
    DeepseekR1,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ToolCallParser {
    #[value(name = "deepseek_v3")]
    DeepseekV3,
    #[value(name = "deepseek_v31")]
    DeepseekV31,
}

impl Args {
    fn flags(&self) -> ServeFlags {
        ServeFlags {
            model: self.model_pos.clone().or_else(|| self.model.clone()),
            served_model_name: self.served_model_name.clone(),
            device: self.device.map(|d| match d {
                DeviceArg::Cpu => Device::Cpu,
                DeviceArg::Cuda => Device::Cuda,
            }),
            dtype: self.dtype.map(|d| match d {
                DtypeArg::Auto => Dtype::Auto,
                DtypeArg::Bfloat16 => Dtype::Bfloat16,
                DtypeArg::Float32 => Dtype::Float32,
            }),
            max_model_len: self.max_model_len,
            chat_template: self.chat_template.clone(),
            enable_prefix_caching: match (self.enable_prefix_caching, self.no_enable_prefix_caching) {
                (_, true) => Some(false),
                (true, _) => Some(true),
                _ => None,
            },
            enforce_eager: self.enforce_eager,
            load_format: self.load_format,
            host: self.host.clone(),
            port: self.port,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            gpu_memory_utilization: self.gpu_memory_utilization,
            num_gpu_blocks_override: self.num_gpu_blocks_override,
            block_size: self.block_size,
            tensor_parallel_size: self.tensor_parallel_size,
            data_parallel_size: self.data_parallel_size,
            enable_expert_parallel: self.enable_expert_parallel.then_some(true),
            prefill_ranks: self.prefill_ranks.clone(),
            decode_ranks: self.decode_ranks.clone(),
            prefill_tensor_parallel_size: self.prefill_tensor_parallel_size,
            prefill_data_parallel_size: self.prefill_data_parallel_size,
            prefill_threshold: self.prefill_threshold,
            disable_log_stats: self.disable_log_stats,
            allowed_origins: self.allowed_origins.clone().map(|o| o.0),
        }
    }

    /// The deployment these arguments describe.
    fn deployment(&self) -> anyhow::Result<DeployConfig> {
        let flags = self.flags();
        let file = match (&self.config, &flags.model) {
            (Some(p), _) => Some(p.clone()),
            (None, None) => Some(default_config()),
            (None, Some(_)) => None,
        };
        let base = match &file {
            Some(p) => Some(DeployConfig::from_yaml_file(p).with_context(|| format!("loading {}", p.display()))?),
            None => None,
        };
        Ok(flags.apply(base)?)
    }
}

/// The API key: the flag, else `CLEAVE_API_KEY`, else `VLLM_API_KEY`; empty means none.
fn api_key(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("CLEAVE_API_KEY").ok())
        .or_else(|| std::env::var("VLLM_API_KEY").ok())
        .filter(|k| !k.is_empty())
}

/// `configs/cpu-tiny.yaml`, looked up from the working directory, then beside the executable
/// (`target/release/cleave` -> `../../configs`), then in the source tree the binary was built from.
fn default_config() -> PathBuf {
    let rel = Path::new("configs").join("cpu-tiny.yaml");
    let mut candidates = vec![rel.clone()];
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        candidates.push(dir.join("../..").join(&rel));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel));
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or(rel)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = a.deployment()?;
    if a.print_config {
        print!("{}", cfg.to_yaml());
        return Ok(());
    }
    let host_port = format!("{}:{}", cfg.server.host, cfg.server.port);
    let addr: SocketAddr = host_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {host_port}"))?
        .next()
        .with_context(|| format!("{host_port} resolves to no address"))?;
    let api_key = api_key(a.api_key);
    if api_key.is_some() {
        tracing::info!("an API key is required on /v1/*");
    }
    // Fault drills on a running server: off unless the operator asks for them.
    let fault_injection = std::env::var("CLEAVE_FAULT_INJECTION").is_ok_and(|v| v == "1");
    if fault_injection {
        tracing::warn!("CLEAVE_FAULT_INJECTION=1: POST /admin/fault can make ranks panic, hang or fail transfers");
    }
    let gw = GatewayConfig {
        max_body_bytes: a.max_body_bytes,
        api_key,
        fault_injection,
        ..GatewayConfig::from_deploy(&cfg)?
    };
    let model = cfg.served_model_name();
    let cluster = Cluster::start(cfg).context("starting the cluster")?;

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("cleave-gateway").build()?;
    let result = rt.block_on(async {
        let server = Server::start(Arc::new(cluster.clone()), gw, addr).await?;
        let url = format!("http://{}", server.local_addr());
        // The one ready line: scripts and tests wait for it and read the port from it.
        println!("cleave serve: ready at {url} (model {model})");
        tracing::info!(%url, %model, "ready");
        shutdown_signal().await;
        eprintln!("cleave serve: shutting down");
        cluster.shutdown();
        if tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.is_err() {
            tracing::warn!("connections still open after 5 s; exiting");
        }
        anyhow::Ok(())
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use clap::Parser;
    use serde::Deserialize;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map(|c| c.serve)
    }

    #[test]
    fn a_vllm_serve_command_line_resolves_to_a_deployment() {
        let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-r1");
        let a = parse(&[
            model,
            "--tensor-parallel-size",
            "2",
            "--max-num-seqs",
            "128",
            "--max-model-len",
            "8000",
            "--served-model-name",
            "X",
            "--api-key",
            "K",
            "--port",
            "8000",
            "--dtype",
            "float",
            "--enforce-eager",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "deepseek_v3",
            "--chat-template",
            "configs/tool_chat_template_deepseekr1.jinja",
            "--reasoning-parser",
            "deepseek_r1",
            "--trust-remote-code",
        ])
        .unwrap();
        let c = a.deployment().unwrap();
        assert_eq!((c.decode.ranks.clone(), c.decode.tensor_parallel_size), (vec![0, 1], 2));
        assert_eq!((c.decode.max_num_seqs, c.max_model_len, c.dtype), (128, Some(8000), Dtype::Float32));
        assert_eq!(c.served_model_name(), "X");
        assert_eq!(c.chat_template.as_deref(), Some("configs/tool_chat_template_deepseekr1.jinja"));
        // --config still works, and flags override it.
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/cpu-2p2d.yaml");
        let c = parse(&["--config", file, "--max-num-batched-tokens", "333"]).unwrap().deployment().unwrap();
        assert_eq!((c.prefill.max_num_batched_tokens, c.decode.max_num_batched_tokens), (333, 333));
        assert!(c.is_disaggregated());
    }

    #[test]
    fn an_unknown_flag_names_the_closest_and_bad_values_name_the_flag() {
        let e = parse(&["m", "--max-num-seq", "5"]).err().unwrap().to_string();
        assert!(e.contains("--max-num-seqs"), "{e}");
        let e = parse(&["m", "--reasoning-parser", "qwen3"]).err().unwrap().to_string();
        assert!(e.contains("deepseek_r1"), "{e}");
        let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-r1");
        let e = parse(&[model, "--tensor-parallel-size", "0"]).unwrap().deployment().unwrap_err().to_string();
        assert!(e.contains("--tensor-parallel-size"), "{e}");
    }

    /// Every `cleave serve` command line in deploy/, with shell and compose variables at their
    /// defaults (a site's weights path, /models/..., stands for the repository's tiny-r1).
    fn deploy_command_lines() -> Vec<(String, Vec<String>)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |f: &str| std::fs::read_to_string(root.join("deploy").join(f)).unwrap();
        let mut out = Vec::new();
        // Dockerfile: ENTRYPOINT + CMD.
        let docker = read("Dockerfile");
        let json_args = |key: &str| -> Vec<String> {
            let line = docker.lines().find(|l| l.starts_with(key)).unwrap();
            serde_json::from_str(line[key.len()..].trim()).unwrap()
        };
        let mut args = json_args("ENTRYPOINT");
        args.extend(json_args("CMD"));
        out.push(("Dockerfile".into(), args));
        // docker-compose.yaml: the shell command, compose variables at their defaults.
        let compose: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read("docker-compose.yaml")).unwrap();
        let cmd = compose["services"]["cleave"]["command"][0].as_str().unwrap().to_string();
        out.push(("docker-compose.yaml".into(), words(&expand(&cmd, &HashMap::new()))));
        // Slurm: the srun line and its continuations, the script's variables at their defaults.
        for f in ["slurm/one-node-4p4d.sbatch", "slurm/two-nodes.sbatch"] {
            let text = read(f);
            let mut vars = HashMap::new();
            for l in text.lines() {
                if let Some((k, v)) = l.split_once('=').filter(|(k, _)| !k.contains(' ') && !k.starts_with('#')) {
                    let v = expand(v.trim_matches('"'), &vars);
                    vars.insert(k.trim_start_matches("export ").to_string(), v);
                }
            }
            let joined = text.replace("\\\n", " ");
            let line = joined.lines().find(|l| l.contains("cleave serve")).unwrap();
            out.push((f.into(), words(&expand(line, &vars))));
        }
        // Kubernetes: the container's command and args.
        let k8s = read("k8s/cleave.yaml");
        for doc in serde_yaml_ng::Deserializer::from_str(&k8s) {
            let v = serde_yaml_ng::Value::deserialize(doc).unwrap();
            if v["kind"] == "StatefulSet" {
                let c = &v["spec"]["template"]["spec"]["containers"][0];
                let s = |x: &serde_yaml_ng::Value| -> Vec<String> {
                    x.as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
                };
                out.push(("k8s/cleave.yaml".into(), [s(&c["command"]), s(&c["args"])].concat()));
            }
        }
        // Everything after `serve`, the weights path standing for tiny-r1.
        let tiny = root.join("models/tiny-r1").display().to_string();
        out.into_iter()
            .map(|(f, a)| {
                let at =
                    a.iter().position(|w| w == "serve").unwrap_or_else(|| panic!("{f}: no `cleave serve` in {a:?}"));
                let rest = a[at + 1..].iter().map(|w| if w.starts_with("/models/") { tiny.clone() } else { w.clone() });
                (f, rest.collect())
            })
            .collect()
    }

    /// `${X:-default}`, `${X-default}`, `${X}` and `$X` from `vars`, else their defaults (empty).
    fn expand(s: &str, vars: &HashMap<String, String>) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let tail = &rest[at + 1..];
            let (name, default, len) = if let Some(body) = tail.strip_prefix('{') {
                let end = body.find('}').unwrap();
                let inner = &body[..end];
                let (n, d) = match inner.find([':', '-']) {
                    Some(i) => {
                        let d = &inner[i..];
                        (&inner[..i], d.strip_prefix(":-").or_else(|| d.strip_prefix('-')).unwrap_or(d))
                    }
                    None => (inner, ""),
                };
                (n, d, end + 2)
            } else {
                let n = tail.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(tail.len());
                (&tail[..n], "", n)
            };
            out.push_str(vars.get(name).map_or(default, String::as_str));
            rest = &tail[len..];
        }
        out + rest
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(|w| w.trim_matches('"').to_string()).collect()
    }

    #[test]
    fn every_command_line_in_deploy_resolves_to_a_deployment() {
        let lines = deploy_command_lines();
        assert_eq!(lines.len(), 5, "{lines:?}");
        for (file, args) in lines {
            let words: Vec<&str> = args.iter().map(String::as_str).collect();
            let a = parse(&words).unwrap_or_else(|e| panic!("{file}: {args:?}: {e}"));
            let c = a.deployment().unwrap_or_else(|e| panic!("{file}: {args:?}: {e:#}"));
            assert_eq!((c.server.host.as_str(), c.server.port), ("0.0.0.0", 8000), "{file}");
            if file != "Dockerfile" {
                assert_eq!(c.device, Device::Cuda, "{file}");
                assert_eq!((c.prefill.ranks.len(), c.decode.ranks.len()), (4, 4), "{file}: 4 + 4 GPUs");
            }
        }
    }
}
