//! The YAML deployment file (vLLM-style names).
//!
//! ```yaml
//! model: models/tiny-r1            # HF-layout directory
//! served_model_name: tiny-r1       # default: the model directory's name
//! device: cpu                      # cpu | cuda
//! max_model_len: 2048              # optional; default: the model's max_position_embeddings
//! enable_prefix_caching: true      # reuse the KV of cached prompt prefixes (vLLM's default)
//! enforce_eager: false             # true: capture no CUDA graphs (decode steps run eagerly)
//! load_format: auto                # auto | safetensors | dummy (random weights of config.json's shapes)
//! chat_template: examples/tool_chat_template_deepseekr1.jinja  # optional: replaces the model's (a file or the template)
//! server: {host: 127.0.0.1, port: 8000, max_concurrent_requests: 256}
//! prefill: {ranks: [0], tensor_parallel_size: 1, max_num_batched_tokens: 8192}
//! decode:  {ranks: [1], tensor_parallel_size: 1, max_num_seqs: 256, max_num_batched_tokens: 2048}
//! router:  {prefill_threshold: 512, max_prefill_queue: 64}
//! kv_cache: {block_size: 64, num_blocks: 1024}    # or gpu_memory_utilization: 0.90 (cuda)
//! kv_transfer: {timeout_ms: 30000, failure_policy: recompute}   # recompute | fail
//! supervisor: {heartbeat_timeout_ms: 30000, max_step_ms: 300000, log_stats_interval_ms: 10000}
//! ```
//! Only `model` is required; every other field has the default shown in its type's docs.
//! An empty `prefill.ranks` means colocated serving on the decode ranks. Unknown keys, wrong
//! types and invalid values are errors naming the field and, where known, its line.
//!
//! A relative `model` path is looked up relative to the current directory first, then relative
//! to the parent of the config file's directory (the repository root for `configs/*.yaml`).

mod flags;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

use cleave_engine::weights::LoadFormat;
use cleave_engine::ParallelConfig;
use serde::{Deserialize, Serialize};

pub use flags::ServeFlags;

/// A configuration error: the file, the field path (`decode.max_num_seqs`), its line (1-based)
/// when known, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub field: Option<String>,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            write!(f, ": ")?;
        } else if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// Compute device of every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Reference f32 backend; ranks are threads.
    #[default]
    Cpu,
    /// One GPU per rank; ranks are device ordinals.
    Cuda,
}

/// Numeric format of weights, activations and the KV cache (vLLM's `--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// bfloat16 on CUDA, float32 on the CPU.
    #[default]
    Auto,
    /// bf16 weights and KV cache, bf16 tensor-core GEMMs (CUDA only).
    Bfloat16,
    /// f32 throughout: matches the CPU reference to rounding (small models, checking).
    Float32,
}

/// What happens to a request whose KV transfer or rank fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// A healthy decode rank prefills the prompt (plus the tokens already sent) itself; the
    /// client's stream continues.
    #[default]
    Recompute,
    /// The stream ends with an error event.
    Fail,
}

/// The whole deployment.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeployConfig {
    /// Hugging Face checkpoint directory.
    pub model: PathBuf,
    /// Name clients use in `model`; default: the model directory's name.
    #[serde(default)]
    pub served_model_name: Option<String>,
    #[serde(default)]
    pub device: Device,
    #[serde(default)]
    pub dtype: Dtype,
    /// Longest prompt + output; default: the model's `max_position_embeddings`.
    #[serde(default)]
    pub max_model_len: Option<usize>,
    /// Automatic prefix caching on every rank, and cache-aware routing (default on).
    #[serde(default = "yes")]
    pub enable_prefix_caching: bool,
    /// vLLM's `--enforce-eager`: capture no CUDA graphs, run every step eagerly (default off:
    /// CUDA ranks of groups of one capture their decode steps at start-up).
    #[serde(default)]
    pub enforce_eager: bool,
    /// vLLM's `--load-format`: `auto` / `safetensors` reads the weight files, `dummy` makes
    /// random weights of the shapes and format `config.json` declares (no weight files needed;
    /// for benchmarks).
    #[serde(default)]
    pub load_format: LoadFormat,
    /// vLLM's `--chat-template`: a Jinja file, or the template itself, used instead of the
    /// checkpoint's (e.g. one that renders `tools` for DeepSeek-R1).
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub prefill: PrefillConfig,
    #[serde(default)]
    pub decode: DecodeConfig,
    #[serde(default)]
    pub router: RouterConfig,
    #[serde(default)]
    pub kv_cache: KvCacheConfig,
    #[serde(default)]
    pub kv_transfer: KvTransferConfig,
    #[serde(default)]
    pub supervisor: SupervisorConfig,
}

/// HTTP front end (read by the gateway). Defaults: 127.0.0.1:8000, 256 concurrent requests.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Requests in flight beyond this are refused with `ActorError::Overloaded`.
    pub max_concurrent_requests: usize,
    /// Origins browsers may call the API from (`*`: any); none by default (no CORS).
    pub allowed_origins: Vec<String>,
    /// Open connections at most (default 1024; keep it below the process's file limit).
    pub max_connections: usize,
    /// A connection idle or slow this long before a whole request head is closed (30000).
    pub header_timeout_ms: u64,
    /// A request body must arrive within this long (60000; 408 beyond).
    pub body_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            max_concurrent_requests: 256,
            allowed_origins: Vec::new(),
            max_connections: 1024,
            header_timeout_ms: 30_000,
            body_timeout_ms: 60_000,
        }
    }
}

/// The prefill pool. Defaults: no ranks (colocated), groups of one, 8192 tokens per step, 256
/// sequences. `ranks` form groups of `tensor_parallel_size x data_parallel_size` consecutive
/// entries; each group holds one copy of the model, several groups are replicas.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefillConfig {
    pub ranks: Vec<usize>,
    pub tensor_parallel_size: usize,
    pub data_parallel_size: usize,
    pub enable_expert_parallel: bool,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
}

impl Default for PrefillConfig {
    fn default() -> Self {
        PrefillConfig {
            ranks: Vec::new(),
            tensor_parallel_size: 1,
            data_parallel_size: 1,
            enable_expert_parallel: false,
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
        }
    }
}

/// The decode pool. Defaults: rank 0, a group of one, 256 sequences, 2048 tokens per step (both
/// per group).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeConfig {
    pub ranks: Vec<usize>,
    pub tensor_parallel_size: usize,
    pub data_parallel_size: usize,
    pub enable_expert_parallel: bool,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            ranks: vec![0],
            tensor_parallel_size: 1,
            data_parallel_size: 1,
            enable_expert_parallel: false,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
        }
    }
}

impl PrefillConfig {
    /// How each group spreads the model.
    pub fn parallel(&self) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: self.tensor_parallel_size,
            data_parallel_size: self.data_parallel_size,
            enable_expert_parallel: self.enable_expert_parallel,
        }
    }
}

impl DecodeConfig {
    /// How each group spreads the model.
    pub fn parallel(&self) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: self.tensor_parallel_size,
            data_parallel_size: self.data_parallel_size,
            enable_expert_parallel: self.enable_expert_parallel,
        }
    }
}

/// Conditional disaggregation. Defaults: 512 tokens, 64 queued prefills.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Prompts with at least this many uncached tokens go to the prefill pool.
    pub prefill_threshold: usize,
    /// Requests queued on the prefill pool (assigned, first token not yet sampled) beyond which
    /// long prompts are prefilled locally instead.
    pub max_prefill_queue: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig { prefill_threshold: 512, max_prefill_queue: 64 }
    }
}

/// Paged KV cache of each rank. Set one of `gpu_memory_utilization` (cuda) and `num_blocks`;
/// with neither, cpu uses 1024 blocks and cuda 0.90 of the GPU.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvCacheConfig {
    /// Tokens per block (default 64).
    pub block_size: usize,
    pub gpu_memory_utilization: Option<f64>,
    pub num_blocks: Option<usize>,
}

impl Default for KvCacheConfig {
    fn default() -> Self {
        KvCacheConfig { block_size: 64, gpu_memory_utilization: None, num_blocks: None }
    }
}

/// Blocks per CPU rank when `kv_cache.num_blocks` is not set.
pub const DEFAULT_CPU_BLOCKS: usize = 1024;

/// Prefill -> decode KV moves. Defaults: 30 s, recompute.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvTransferConfig {
    /// A transfer not finished this long after the first token was sampled has failed.
    pub timeout_ms: u64,
    pub failure_policy: FailurePolicy,
}

impl Default for KvTransferConfig {
    fn default() -> Self {
        KvTransferConfig { timeout_ms: 30_000, failure_policy: FailurePolicy::Recompute }
    }
}

/// Rank supervision. Defaults: a rank silent for 30 s is declared dead and restarted; each pool
/// logs a stats line every 10 s while it has work (0 turns the lines off).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// A rank whose loop is silent this long between steps is declared dead (the loop beats at
    /// least every 100 ms when idle).
    pub heartbeat_timeout_ms: u64,
    /// A single step running longer than this declares the rank hung (a step never beats: a 4k
    /// prompt on the 671B model takes seconds).
    pub max_step_ms: u64,
    pub log_stats_interval_ms: u64,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig { heartbeat_timeout_ms: 30_000, max_step_ms: 300_000, log_stats_interval_ms: 10_000 }
    }
}

impl DeployConfig {
    /// `model` with every other field at its default: colocated serving on rank 0.
    pub fn for_model(model: impl Into<PathBuf>) -> Self {
        DeployConfig {
            model: model.into(),
            served_model_name: None,
            device: Device::default(),
            dtype: Dtype::default(),
            max_model_len: None,
            enable_prefix_caching: true,
            enforce_eager: false,
            load_format: LoadFormat::default(),
            chat_template: None,
            server: ServerConfig::default(),
            prefill: PrefillConfig::default(),
            decode: DecodeConfig::default(),
            router: RouterConfig::default(),
            kv_cache: KvCacheConfig::default(),
            kv_transfer: KvTransferConfig::default(),
            supervisor: SupervisorConfig::default(),
        }
    }

    /// The deployment as YAML (what `cleave serve --print-config` shows).
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_else(|e| format!("# cannot print the deployment: {e}\n"))
    }

    /// Parses and validates a YAML document (syntax, types, values); does not touch the file
    /// system, so `model` is not checked (see [`DeployConfig::resolve_model`]).
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        let cfg: DeployConfig = serde_yaml_ng::from_str(text).map_err(syntax_error)?;
        cfg.validate().map_err(|(field, message)| ConfigError {
            file: None,
            line: validate::locate(text, &field),
            field: Some(field),
            message,
        })?;
        Ok(cfg)
    }

    /// Re-checks the values (for a config built or changed in code).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.validate().map_err(|(field, message)| ConfigError { file: None, field: Some(field), line: None, message })
    }

    /// Reads, parses and validates `path`, then resolves `model` (see the module docs) and
    /// checks that it holds a `config.json`.
    pub fn from_yaml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: Some(path.to_path_buf()),
            field: None,
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        let mut cfg = Self::from_yaml_str(&text).map_err(|e| ConfigError { file: Some(path.to_path_buf()), ..e })?;
        cfg.resolve_model(Some(path)).map_err(|e| ConfigError {
            file: Some(path.to_path_buf()),
            line: validate::locate(&text, "model"),
            ..e
        })?;
        Ok(cfg)
    }

    /// Turns a relative `model` into the directory that exists: relative to the current
    /// directory, else relative to the parent of `config_file`'s directory. Errors when neither
    /// holds a `config.json`.
    pub fn resolve_model(&mut self, config_file: Option<&Path>) -> Result<(), ConfigError> {
        let mut tried = vec![self.model.clone()];
        if self.model.is_relative() {
            if let Some(root) = config_file.and_then(|f| f.parent()).and_then(|d| d.parent()) {
                tried.push(root.join(&self.model));
            }
        }
        match tried.iter().find(|p| p.join("config.json").is_file()) {
            Some(found) => {
                self.model = found.clone();
                Ok(())
            }
            None => Err(ConfigError {
                file: None,
                field: Some("model".into()),
                line: None,
                message: format!(
                    "no model directory with a config.json at {}",
                    tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or ")
                ),
            }),
        }
    }

    /// The name clients use for this model.
    pub fn served_model_name(&self) -> String {
        self.served_model_name.clone().unwrap_or_else(|| {
            self.model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
        })
    }

    /// Whether prompts can be disaggregated (a non-empty prefill pool).
    pub fn is_disaggregated(&self) -> bool {
        !self.prefill.ranks.is_empty()
    }

    /// KV blocks per CPU rank.
    pub fn cpu_num_blocks(&self) -> usize {
        self.kv_cache.num_blocks.unwrap_or(DEFAULT_CPU_BLOCKS)
    }
}

fn yes() -> bool {
    true
}

fn syntax_error(e: serde_yaml_ng::Error) -> ConfigError {
    let mut text = e.to_string();
    if let Some(at) = text.rfind(" at line ") {
        text.truncate(at);
    }
    // serde_yaml_ng writes "<path>: <message> at line L column C"; keep the path as the field.
    let (field, message) = match text.split_once(": ") {
        Some((p, m)) if !p.contains(' ') => (Some(p.to_string()), m.to_string()),
        _ => (None, text.clone()),
    };
    ConfigError { file: None, field, line: e.location().map(|l| l.line()), message }
}
