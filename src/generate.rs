//! `cleave generate`: one prompt through one model copy (one rank, or a parallel group: CPU ranks
//! are threads, CUDA ranks GPUs 0..n-1), printed as text or JSON.

use std::path::PathBuf;

use anyhow::{bail, Context};
use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::backend::Backend;
use cleave_engine::tokenizer::{ChatMessage, ChatOptions};
use cleave_engine::weights::LoadFormat;
use cleave_engine::{Engine, EngineConfig, Request, SamplingParams};

#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint directory (default: the embedded models/tiny-r1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Render the prompt as a user message through the chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    min_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// In [-2, 2]: subtracted from the logits of tokens the output already holds.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    presence_penalty: f32,
    /// In [-2, 2]: subtracted once per time the output holds a token.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// A stop string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    #[arg(long)]
    ignore_eos: bool,
    /// Limit on prompt + output tokens (default: the model's).
    #[arg(long)]
    max_model_len: Option<usize>,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
    /// Where to run the model.
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// GPU ordinal for `--device cuda`.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Numeric format on `--device cuda`: bfloat16 (fast) or float32 (matches the CPU reference).
    #[arg(long, value_enum, default_value = "auto")]
    dtype: Dtype,
    #[command(flatten)]
    parallel: crate::parallel_args::ParallelArgs,
    /// Run every step eagerly: capture no CUDA graphs (vLLM's flag).
    #[arg(long)]
    enforce_eager: bool,
    /// auto / safetensors: the model directory's weight files; dummy: random weights of the
    /// shapes and format its config.json declares (vLLM's flag).
    #[arg(long, default_value = "auto")]
    load_format: LoadFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Dtype {
    Auto,
    Bfloat16,
    Float32,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let dir = a.model.clone().unwrap_or_else(crate::model_dir::default_model);
    let model_cfg = cleave_engine::model::ModelConfig::from_dir(&dir)?;
    let max_len = a.max_model_len.unwrap_or(model_cfg.max_position_embeddings);
    let cfg = EngineConfig {
        max_num_seqs: 1,
        block_size: 64,
        num_blocks: max_len.div_ceil(64),
        max_model_len: Some(max_len),
        enforce_eager: a.enforce_eager,
        load_format: a.load_format,
        ..EngineConfig::default()
    };
    let par = a.parallel.config();
    par.validate(&model_cfg).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let loading = || format!("loading {}", dir.display());
    match a.device {
        Device::Cpu if a.dtype == Dtype::Bfloat16 => {
            bail!("--dtype bfloat16 needs --device cuda (the CPU backend computes in float32)")
        }
        Device::Cpu if par.world() == 1 => drive(Engine::load(CpuBackend, &dir, cfg).with_context(loading)?, a),
        Device::Cpu => drive(Engine::load_parallel(par, &dir, cfg, |_| Ok(CpuBackend)).with_context(loading)?, a),
        Device::Cuda => {
            let precision = if a.dtype == Dtype::Float32 { Precision::F32 } else { Precision::Bf16 };
            let engine = if par.world() == 1 {
                let be = CudaBackend::with_precision(a.gpu, precision).context("opening the GPU")?;
                Engine::load(be, &dir, cfg).with_context(loading)?
            } else {
                if a.gpu != 0 {
                    bail!("--gpu picks the GPU of one rank; a parallel group runs on GPUs 0..{}", par.world() - 1);
                }
                let gpus = cleave_kernels::probe().map_err(|e| anyhow::anyhow!("no usable GPU: {e}"))?;
                if gpus < par.world() {
                    bail!("a group of {} ranks needs {} GPUs; {gpus} visible", par.world(), par.world());
                }
                cleave_engine::backend::cuda::collectives::load_nccl_group(par, &dir, cfg, precision)
                    .with_context(loading)?
            };
            drive(engine, a)
        }
    }
}

fn drive<B: Backend>(mut engine: Engine<B>, a: Args) -> anyhow::Result<()> {
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (_, Some(_)) if a.chat => bail!("--chat renders text: give --prompt, not --prompt-ids"),
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = engine.tokenizer().context("this model directory has no tokenizer.json: use --prompt-ids")?;
            if a.chat {
                let msg = ChatMessage::new("user", text.clone());
                tok.encode_chat(&[msg], ChatOptions::generation())?
            } else {
                tok.encode(text, true)?
            }
        }
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let params = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        seed: a.seed,
        max_tokens: a.max_tokens.min(engine.max_model_len().saturating_sub(prompt.len())).max(1),
        min_tokens: a.min_tokens,
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        ..SamplingParams::default()
    };
    let mut out = engine.generate(vec![Request { id: 0, prompt, params, prefill_only: false }])?;
    let tokens = out.remove(&0).unwrap_or_default();
    let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
    match a.output {
        Output::Text => println!("{text}"),
        Output::Json => {
            let ids: Vec<u32> = tokens.iter().map(|t| t.token).collect();
            let logprobs: Vec<f32> = tokens.iter().map(|t| t.logprob).collect();
            println!("{}", serde_json::json!({ "token_ids": ids, "logprobs": logprobs, "text": text }));
        }
    }
    Ok(())
}
