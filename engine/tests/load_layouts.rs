//! The load-time layouts a backend may choose, against the CPU reference's plain one, on every
//! golden checkpoint (bf16, f32 with two shared experts and no q LoRA, FP8 blocks, AWQ):
//! - shared experts folded into the routed experts (the shared MLP cut into experts of
//!   `moe_intermediate_size` at the end of the stack, routed to every token at weight 1; AWQ with
//!   the cut on its groups);
//! - MLA's two input projections (q or q_a, and kv_a) stacked into one weight and cut after the
//!   product (the CUDA backend's layout for compressed weights).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::{AttnBatch, Backend, ExpertSource, GraphLimits, KvLayout, MlaDims, RouterParams};
use cleave_engine::backend::{SampleRow, StepIndices};
use cleave_engine::weights::LinearSource;
use cleave_engine::{Engine, EngineConfig, ParallelConfig, Result};

/// The CPU backend, folding shared experts and stacking projections as told; counts the shared
/// experts it was given per layer and the stacked products it computed.
struct Layout {
    cpu: CpuBackend,
    fold: bool,
    stack: bool,
    folded: Arc<AtomicUsize>,
    split: Arc<AtomicUsize>,
}

impl Layout {
    fn new(fold: bool, stack: bool) -> Self {
        Layout { cpu: CpuBackend, fold, stack, folded: Arc::default(), split: Arc::default() }
    }
}

macro_rules! fwd {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $name(&self, $($a: $t),*) -> $r { self.cpu.$name($($a),*) })*
    };
}

impl Backend for Layout {
    type Tensor = <CpuBackend as Backend>::Tensor;
    type Weight = <CpuBackend as Backend>::Weight;
    type Experts = <CpuBackend as Backend>::Experts;
    type Routing = <CpuBackend as Backend>::Routing;
    type KvCache = <CpuBackend as Backend>::KvCache;
    type Graph = <CpuBackend as Backend>::Graph;
    fwd! {
        name() -> String;
        upload(data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
        download(t: &Self::Tensor) -> Result<Vec<f32>>;
        dims(t: &Self::Tensor) -> (usize, usize);
        load_linear(parts: &[LinearSource<'_>]) -> Result<Self::Weight>;
        alloc_kv_cache(layout: KvLayout) -> Result<Self::KvCache>;
        embedding(table: &Self::Tensor, ids: &[u32]) -> Result<Self::Tensor>;
        rms_norm(x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
        add_rms_norm(residual: &mut Self::Tensor, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
        linear(x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
        linear_pair(x: &Self::Tensor, a: &Self::Weight, b: &Self::Weight) -> Result<(Self::Tensor, Self::Tensor)>;
        silu_mul(x: &Self::Tensor) -> Result<Self::Tensor>;
        add_assign(a: &mut Self::Tensor, b: &Self::Tensor) -> Result<()>;
        gather_rows(x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;
        rope(x: &mut Self::Tensor, cos_sin: &Self::Tensor, positions: &[u32], heads: usize, offset: usize, stride: usize, rope: usize, interleaved: bool) -> Result<()>;
        write_kv(cache: &mut Self::KvCache, layer: usize, latent: &Self::Tensor, slots: &[u32]) -> Result<()>;
        mla_attention(q: &Self::Tensor, cache: &Self::KvCache, layer: usize, kv_b: &Self::Weight, batch: &AttnBatch, dims: MlaDims) -> Result<Self::Tensor>;
        moe_route(logits: &Self::Tensor, bias: &Self::Tensor, params: RouterParams) -> Result<Self::Routing>;
        moe_experts(x: &Self::Tensor, routing: &Self::Routing, experts: &Self::Experts) -> Result<Self::Tensor>;
        sample(logits: &Self::Tensor, rows: &[SampleRow], masks: &[u32]) -> Result<Vec<(u32, f32)>>;
        export_blocks(cache: &Self::KvCache, blocks: &[u32]) -> Result<Vec<f32>>;
        import_blocks(cache: &mut Self::KvCache, blocks: &[u32], data: &[f32]) -> Result<()>;
        stage_step(s: &StepIndices<'_>) -> Result<()>;
        replay(g: &Self::Graph) -> Result<()>;
    }

    fn load_experts(&self, experts: &[ExpertSource<'_>], first: usize, shared: usize) -> Result<Self::Experts> {
        self.folded.store(shared, Ordering::Relaxed);
        self.cpu.load_experts(experts, first, shared)
    }

    fn folds_shared_experts(&self) -> bool {
        self.fold
    }

    fn stacks_projections(&self, _: &LinearSource<'_>, _: &LinearSource<'_>) -> bool {
        self.stack
    }

    fn linear_split(&self, x: &Self::Tensor, w: &Self::Weight, first: usize) -> Result<(Self::Tensor, Self::Tensor)> {
        self.split.fetch_add(1, Ordering::Relaxed);
        self.cpu.linear_split(x, w, first)
    }

    fn capture_step<T>(&self, limits: GraphLimits, f: &mut dyn FnMut() -> Result<T>) -> Result<(Self::Graph, T)> {
        self.cpu.capture_step(limits, f)
    }
}

fn case_dir(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/golden").join(case)
}

fn generate<B: Backend>(be: B, case: &str) -> Vec<Vec<(u32, f32)>> {
    let cfg = EngineConfig { max_num_seqs: 4, ..EngineConfig::default() };
    let mut engine = Engine::load(be, &case_dir(case), cfg).expect("load");
    let prompts: Vec<Vec<u32>> = vec![(1..40).collect(), vec![5, 9, 2, 7], (3..20).rev().collect()];
    let out = engine.generate_greedy(&prompts, &[6, 6, 6]).expect("generate");
    assert_eq!(engine.stats().used_blocks, 0, "blocks leaked");
    out.into_iter().map(|seq| seq.into_iter().map(|t| (t.token, t.logprob)).collect()).collect()
}

const CASES: [&str; 5] = ["bf16-qlora", "f32-noqlora", "fp8-blocks", "awq-g128", "awq-g64-attn16"];

fn max_logprob_diff(case: &str, want: &[Vec<(u32, f32)>], got: &[Vec<(u32, f32)>]) -> f32 {
    let ids = |s: &[(u32, f32)]| s.iter().map(|t| t.0).collect::<Vec<_>>();
    let mut d = 0f32;
    for (w, g) in want.iter().zip(got) {
        assert_eq!(ids(w), ids(g), "{case}: greedy tokens");
        d = w.iter().zip(g).map(|(a, b)| (a.1 - b.1).abs()).fold(d, f32::max);
    }
    d
}

#[test]
fn folded_shared_experts_generate_what_the_dense_shared_mlp_does() {
    for (case, shared) in CASES.into_iter().zip([1, 2, 1, 1, 2]) {
        let want = generate(CpuBackend, case);
        let folding = Layout::new(true, false);
        let folded = folding.folded.clone();
        let got = generate(folding, case);
        assert_eq!(folded.load(Ordering::Relaxed), shared, "{case}: shared experts folded per layer");
        let d = max_logprob_diff(case, &want, &got);
        assert!(d < 1e-4, "{case}: logprobs differ by {d}");
    }
}

#[test]
fn stacked_input_projections_generate_exactly_what_apart_ones_do() {
    for case in CASES {
        let want = generate(CpuBackend, case);
        let stacking = Layout::new(false, true);
        let split = stacking.split.clone();
        let got = generate(stacking, case);
        assert!(split.load(Ordering::Relaxed) > 0, "{case}: no stacked product was computed");
        assert_eq!(max_logprob_diff(case, &want, &got), 0.0, "{case}: each output column is the same product");
    }
}

#[test]
fn stacked_input_projections_hold_each_tensor_parallel_ranks_heads() {
    // Without q LoRA (f32-noqlora) each rank's q_proj rows (its heads) are stacked on the whole kv_a;
    // the golden AWQ checkpoints split over no two ranks (their groups).
    let tp2 = ParallelConfig { tensor_parallel_size: 2, data_parallel_size: 1, enable_expert_parallel: false };
    for case in ["f32-noqlora", "bf16-qlora"] {
        let run = |stack: bool| {
            let cfg = EngineConfig { max_num_seqs: 4, ..EngineConfig::default() };
            let split = Arc::new(AtomicUsize::new(0));
            let s = split.clone();
            let open = move |_| Ok(Layout { split: s.clone(), ..Layout::new(false, stack) });
            let mut engine = Engine::load_parallel(tp2, &case_dir(case), cfg, open).expect("load");
            let prompts: Vec<Vec<u32>> = vec![(1..30).collect(), vec![5, 9, 2, 7]];
            let out = engine.generate_greedy(&prompts, &[5, 5]).expect("generate");
            let out: Vec<Vec<(u32, f32)>> =
                out.into_iter().map(|seq| seq.into_iter().map(|t| (t.token, t.logprob)).collect()).collect();
            (out, split.load(Ordering::Relaxed))
        };
        let ((want, apart), (got, stacked)) = (run(false), run(true));
        assert_eq!(apart, 0, "{case}: apart");
        assert!(stacked > 0, "{case}: no stacked product was computed");
        assert_eq!(max_logprob_diff(case, &want, &got), 0.0, "{case}: tp 2, stacked against apart");
    }
}
