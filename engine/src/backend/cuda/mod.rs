//! The CUDA backend: bf16 weights, f32 activations, f32 accumulation. GEMMs go through cuBLAS;
//! norms, RoPE, MLA attention over the paged latent cache, MoE routing and the grouped expert
//! GEMM are cleave's own kernels (crate `cleave-kernels`). Nothing here synchronizes with the
//! host inside a forward step except `download`.
//!
//! A `CudaBackend` owns its device context and stream; create it on the thread that runs the
//! rank and keep it there. Every activation and scratch buffer comes from the backend's
//! workspace (`pool`): after one step of a batch shape, further steps of that shape make no
//! device allocation ([`CudaBackend::device_allocs`]).
//!
//! bf16 shadows: at `Precision::Bf16`, the kernels that produce GEMM operands (RMSNorm, SiLU-mul)
//! also write a bf16 copy of their output in the same pass, held by the output tensor; `linear`
//! and the experts use it instead of a separate cast. Every in-place mutation goes through
//! [`CudaTensor::ptr_mut`], which drops the copy, so a stale one is never read.

mod attention;
mod buffers;
pub mod collectives;
mod graph;
mod kv;
mod linear;
mod load;
mod moe;
mod peer;
mod pool;
mod quant;
mod repack;
mod sample;
mod tensor;
pub mod transfer;
mod variants;
mod weights;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

pub use cleave_kernels::Gpu;
use cleave_kernels::{ptr, KernelError};

use super::{
    mla_prologue_ops, AddNorm, AttnBatch, Backend, ExpertSource, GraphLimits, KvLayout, MlaDims, Rotary, Router,
    RouterParams, SampleRow, StepIndices, NO_SLOT,
};
use crate::error::{EngineError, Result};
use crate::weights::LinearSource;
pub use graph::CudaGraph;
pub use kv::CudaKvCache;
use pool::{Buf, Workspace};
pub use pool::{PoolStats, DEFAULT_IDLE_CAP};
pub use quant::Fp8Out;
pub(crate) use tensor::Bf16In;
pub use tensor::{CudaRouting, CudaTensor};
pub use variants::{
    Fusion, MlaDecode, PersistentGemm, QRows, QuantGemm, Variants, WgmmaGemm, AWQ_EXPAND_MIN_AVG,
    DEFAULT_FP8_WGMMA_STAGES, DEFAULT_GEMV_ROWS, DEFAULT_PDL, DEFAULT_PERSISTENT, DEFAULT_ROUTER_GEMV_ROWS,
    DEFAULT_ROWS32, DEFAULT_WGMMA, EXPAND_MIN_ROWS, GEMV_MAX_ROWS, HALVES_MIN_BYTES, ROUTER_GEMV_MAX_READS,
    ROWS32_MIN_AVG, ROWS8_MAX_AVG,
};
pub use weights::{CudaExperts, CudaWeight};
use weights::{ExpertData, WeightData};

/// Rows up to which a linear over a compressed weight runs the compressed GEMM; above, the weight
/// is expanded to bf16 for that call and multiplied by cuBLAS (prefill is compute bound).
pub const QGEMM_MAX_ROWS: usize = 128;

pub(crate) fn kerr(e: KernelError) -> EngineError {
    match e {
        KernelError::Timeout(m) => EngineError::Timeout(format!("cuda: NCCL: {m}")),
        e => EngineError::Backend(format!("cuda: {e}")),
    }
}

/// Numerics of a CUDA backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights and KV cache, bf16 tensor-core GEMMs with f32 accumulation: the fast path.
    Bf16,
    /// f32 weights, activations and KV cache, f32 GEMMs and the reference kernels: matches the
    /// CPU backend to rounding, for small models and for checking the fast path end to end.
    F32,
}

/// An uploaded index array: the values last sent and the device buffer holding them.
type Upload = (Vec<u32>, Buf<u32>);

pub struct CudaBackend {
    /// Idle activation and scratch buffers (declared first: dropped while `gpu` still lives).
    ws: Rc<Workspace>,
    /// Graph mode, the fixed inputs and the workspace of captured steps (graph.rs).
    graphs: graph::GraphState,
    gpu: Gpu,
    precision: Precision,
    variants: Cell<Variants>,
    /// Pinned staging for large downloads (logits): pageable copies run at a few GB/s.
    pinned: RefCell<Option<cleave_kernels::cudarc::driver::PinnedHostSlice<f32>>>,
    /// Small per-step index arrays (token ids, positions, slots, attention metadata), re-uploaded
    /// only when their content changes (into the same buffer while it fits): the 2 x layers
    /// attention calls of a step share one upload.
    uploads: RefCell<HashMap<&'static str, Upload>>,
    /// Fill every output with NaN before a kernel writes it (kernels-check).
    poison: Cell<bool>,
    /// When set, `moe_experts` records how many experts received tokens (synchronizes).
    expert_stats: RefCell<Option<Vec<usize>>>,
    /// Where the workspace last had to allocate (the first 32 since the last take).
    misses: RefCell<Vec<String>>,
    /// What the block-scaled FP8 GEMM of this GPU's cuBLASLt can write (found at first use).
    fp8_out: Cell<quant::Fp8Out>,
}

impl CudaBackend {
    /// Opens GPU `ordinal` and loads (or compiles) the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_precision(ordinal, Precision::Bf16)
    }

    pub fn with_precision(ordinal: usize, precision: Precision) -> Result<Self> {
        let variants = Variants::from_env()?;
        let gpu = Gpu::new(ordinal).map_err(kerr)?;
        for m in &gpu.modules {
            if let Some((dir, files)) = &m.replaced {
                tracing::warn!(module = m.name, ?files, dir = %dir.display(), "kernel sources replaced (CLEAVE_KERNEL_SOURCES)");
            }
        }
        gpu.set_pdl(variants.pdl);
        Ok(CudaBackend {
            ws: Workspace::new(),
            graphs: graph::GraphState::new(),
            gpu,
            precision,
            variants: Cell::new(variants),
            pinned: RefCell::new(None),
            uploads: RefCell::new(HashMap::new()),
            poison: Cell::new(false),
            expert_stats: RefCell::new(None),
            misses: RefCell::new(Vec::new()),
            fp8_out: Cell::new(quant::Fp8Out::Untried),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    pub fn variants(&self) -> Variants {
        self.variants.get()
    }

    pub fn set_variants(&self, v: Variants) {
        self.gpu.set_pdl(v.pdl);
        self.variants.set(v);
    }

    pub fn set_poison(&self, on: bool) {
        self.poison.set(on);
    }

    /// Starts (`true`) or stops counting experts with tokens per `moe_experts` call.
    pub fn record_expert_stats(&self, on: bool) {
        *self.expert_stats.borrow_mut() = if on { Some(Vec::new()) } else { None };
    }

    pub fn take_expert_stats(&self) -> Vec<usize> {
        self.expert_stats.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn sync(&self) -> Result<()> {
        self.gpu.sync().map_err(kerr)
    }

    /// Device allocations made so far (weights, caches and workspace misses). A decode step of a
    /// batch shape seen before adds none.
    pub fn device_allocs(&self) -> u64 {
        self.gpu.device_allocs()
    }

    /// Workspace counters: requests served from idle buffers, new buffers, evictions, idle bytes.
    pub fn workspace_stats(&self) -> PoolStats {
        self.ws.stats()
    }

    /// Bounds the bytes of idle workspace buffers ([`DEFAULT_IDLE_CAP`] by default); the least
    /// recently used go first.
    pub fn set_workspace_cap(&self, bytes: usize) {
        self.ws.set_cap(bytes)
    }

    /// Device bytes held for captured steps (their workspace and fixed inputs).
    pub fn graph_bytes(&self) -> usize {
        self.graphs.bytes()
    }

    /// Frees every idle workspace buffer; returns the bytes freed.
    pub fn trim_workspace(&self) -> usize {
        self.ws.clear()
    }

    /// KV blocks that fit in `fraction` of the device memory, counting what is already in use
    /// (weights) against it: `(fraction * total - used) / bytes per block`.
    pub fn kv_blocks_for_memory(&self, fraction: f64, layers: usize, block_size: usize, width: usize) -> Result<usize> {
        let (free, total) = self.gpu.mem_info().map_err(kerr)?;
        let used = total - free;
        let budget = (fraction * total as f64) as i64 - used as i64 - (1 << 30); // 1 GiB for activations
        let elem = if self.precision == Precision::F32 { 4 } else { 2 };
        let per_block = (layers * block_size * width * elem) as i64;
        Ok((budget.max(0) / per_block) as usize)
    }

    /// Fills the whole cache with uniform values in [-1, 1) (benchmarks).
    pub fn fill_kv_random(&self, cache: &mut CudaKvCache, seed: u64) -> Result<()> {
        if cache.f32.is_some() {
            return Err(EngineError::Backend("fill_kv_random: bf16 caches only".into()));
        }
        // SAFETY: the destination is a live buffer of this GPU of n bf16.
        unsafe { self.gpu.fill_uniform_bf16(ptr(&cache.buf), cache.buf.len(), seed, -1.0, 1.0) }.map_err(kerr)
    }

    /// A routing decided elsewhere (tests: the CPU router's choice).
    pub fn routing_from_host(&self, ids: &[u32], weights: &[f32], top_k: usize) -> Result<CudaRouting> {
        let rows = ids.len() / top_k.max(1);
        let id_buf = self.buf::<u32>(ids.len())?;
        let w_buf = self.buf::<f32>(weights.len())?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { self.gpu.htod(ids, ptr(&id_buf)) }.map_err(kerr)?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { self.gpu.htod(weights, ptr(&w_buf)) }.map_err(kerr)?;
        Ok(CudaRouting { ids: id_buf, weights: w_buf, rows, top_k })
    }

    pub fn routing_to_host(&self, r: &CudaRouting) -> Result<(Vec<u32>, Vec<f32>)> {
        let mut ids = vec![0u32; r.rows * r.top_k];
        let mut w = vec![0f32; r.rows * r.top_k];
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { self.gpu.dtoh(ptr(&r.ids), &mut ids) }.map_err(kerr)?;
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { self.gpu.dtoh(ptr(&r.weights), &mut w) }.map_err(kerr)?;
        Ok((ids, w))
    }

    /// The workspace's allocations since the last call (type, elements and call site; at most 32):
    /// what made a step that should reuse buffers allocate.
    pub fn take_workspace_misses(&self) -> Vec<String> {
        std::mem::take(&mut self.misses.borrow_mut())
    }

    /// The bf16 shadow of `t` as raw bits, if it has one (kernels-check).
    pub fn download_bf16_shadow(&self, t: &CudaTensor) -> Result<Option<Vec<u16>>> {
        let Some(p) = t.bf16_ptr() else {
            return Ok(None);
        };
        let mut v = vec![0u16; t.len()];
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { self.gpu.dtoh(p, &mut v) }.map_err(kerr)?;
        Ok(Some(v))
    }

    fn check_same(a: &CudaTensor, b: &CudaTensor, op: &str) -> Result<()> {
        if (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(EngineError::Backend(format!(
                "{op}: shapes {}x{} and {}x{} differ",
                a.rows, a.cols, b.rows, b.cols
            )));
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Experts = CudaExperts;
    type Routing = CudaRouting;
    type KvCache = CudaKvCache;
    type Graph = CudaGraph;

    fn name(&self) -> String {
        format!("cuda:{}", self.gpu.ctx.ordinal())
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        if data.len() != rows * cols {
            return Err(EngineError::Backend(format!("upload: {} values for shape {rows}x{cols}", data.len())));
        }
        // Exact size, outside the workspace: uploads are weights and tables that live long.
        let buf = Buf::unpooled(self.gpu.alloc::<f32>(rows * cols).map_err(kerr)?);
        let t = CudaTensor { buf, bf16: None, rows, cols };
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { self.gpu.htod(data, t.ptr()) }.map_err(kerr)?;
        Ok(t)
    }

    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let n = t.len();
        let mut v = vec![0f32; n];
        if n < (1 << 18) {
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { self.gpu.dtoh(t.ptr(), &mut v) }.map_err(kerr)?;
            return Ok(v);
        }
        let mut pinned = self.pinned.borrow_mut();
        if pinned.as_ref().is_none_or(|p| p.len() < n) {
            *pinned =
                Some(unsafe { self.gpu.ctx.alloc_pinned::<f32>(n.next_power_of_two()) }.map_err(|e| kerr(e.into()))?);
        }
        let host = pinned.as_mut().expect("allocated").as_mut_slice().map_err(|e| kerr(e.into()))?;
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { self.gpu.dtoh(t.ptr(), &mut host[..n]) }.map_err(kerr)?;
        use rayon::prelude::*;
        v.par_chunks_mut(1 << 16).zip(host[..n].par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
        Ok(v)
    }

    fn dims(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn load_linear(&self, parts: &[LinearSource<'_>]) -> Result<CudaWeight> {
        load::linear(self, parts)
    }

    fn load_experts(&self, experts: &[ExpertSource<'_>], first: usize, shared: usize) -> Result<CudaExperts> {
        load::experts(self, experts, first, shared)
    }

    fn folds_shared_experts(&self) -> bool {
        self.variants().fold_shared
    }

    fn stacks_projections(&self, a: &LinearSource<'_>, b: &LinearSource<'_>) -> bool {
        self.precision == Precision::Bf16 && repack::stack_together(a, b)
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<CudaKvCache> {
        let n = layout.num_blocks * layout.block_values();
        if self.precision == Precision::F32 {
            let f = self.gpu.alloc::<f32>(n).map_err(kerr)?;
            // SAFETY: the address and byte count lie within one live allocation of this GPU.
            unsafe { self.gpu.memset(ptr(&f), 0, n * 4) }.map_err(kerr)?;
            return Ok(CudaKvCache { buf: self.gpu.alloc::<u16>(1).map_err(kerr)?, f32: Some(f), layout });
        }
        let buf = self.gpu.alloc::<u16>(n).map_err(kerr)?;
        // SAFETY: the address and byte count lie within one live allocation of this GPU.
        unsafe { self.gpu.memset(ptr(&buf), 0, n * 2) }.map_err(kerr)?;
        Ok(CudaKvCache { buf, f32: None, layout })
    }

    fn embedding(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor> {
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= table.rows) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {id} is outside the vocabulary of {}",
                table.rows
            )));
        }
        let out = self.tensor(ids.len(), table.cols)?;
        let ip = self.upload_u32("ids", ids)?;
        // SAFETY: the table, the uploaded ids and `out` (made above for ids x cols) are live buffers of
        // this GPU of the sizes embedding reads and writes.
        unsafe { self.gpu.embedding(table.ptr(), ip, out.ptr(), ids.len(), table.cols) }.map_err(kerr)?;
        Ok(out)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        if w.len() > x.cols {
            return Err(EngineError::Backend(format!("rms_norm: weight of {} for rows of {}", w.len(), x.cols)));
        }
        let y = self.tensor_shadowed(x.rows, x.cols)?;
        let yb = y.bf16_ptr().unwrap_or(0);
        // SAFETY: input, residual, weight and outputs are live buffers of this GPU holding the rows x
        // cols (weight: normalized columns) that rms_norm reads and writes.
        unsafe { self.gpu.rms_norm(x.ptr(), 0, w.ptr(), y.ptr(), yb, x.rows, x.cols, w.len(), eps) }.map_err(kerr)?;
        Ok(y)
    }

    fn add_rms_norm(&self, residual: &mut CudaTensor, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        Self::check_same(residual, x, "add_rms_norm")?;
        if w.len() > x.cols {
            return Err(EngineError::Backend(format!("add_rms_norm: weight of {} for rows of {}", w.len(), x.cols)));
        }
        let y = self.tensor_shadowed(x.rows, x.cols)?;
        let yb = y.bf16_ptr().unwrap_or(0);
        let res = residual.ptr_mut();
        // SAFETY: input, residual, weight and outputs are live buffers of this GPU holding the rows x
        // cols (weight: normalized columns) that rms_norm reads and writes.
        unsafe { self.gpu.rms_norm(x.ptr(), res, w.ptr(), y.ptr(), yb, x.rows, x.cols, w.len(), eps) }.map_err(kerr)?;
        Ok(y)
    }

    fn linear(&self, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
        self.linear_any(x, w)
    }

    fn linear_pair(&self, x: &CudaTensor, a: &CudaWeight, b: &CudaWeight) -> Result<(CudaTensor, CudaTensor)> {
        self.linear_two(x, a, b)
    }

    fn linear_split(&self, x: &CudaTensor, w: &CudaWeight, first: usize) -> Result<(CudaTensor, CudaTensor)> {
        self.linear_cut(x, w, first)
    }

    fn silu_mul(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let h = x.cols / 2;
        let y = self.tensor_shadowed(x.rows, h)?;
        let yb = y.bf16_ptr().unwrap_or(0);
        // SAFETY: input (rows x 2 half) and outputs (rows x half) are live buffers of this GPU.
        unsafe { self.gpu.silu_mul(x.ptr(), y.ptr(), yb, x.rows, h, false) }.map_err(kerr)?;
        Ok(y)
    }

    fn add_assign(&self, a: &mut CudaTensor, b: &CudaTensor) -> Result<()> {
        Self::check_same(a, b, "add")?;
        let n = a.len();
        // SAFETY: both operands are live buffers of this GPU of n values.
        unsafe { self.gpu.add(a.ptr_mut(), b.ptr(), n) }.map_err(kerr)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor> {
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= x.rows) {
            return Err(EngineError::Backend(format!("gather_rows: row {r} of {}", x.rows)));
        }
        let y = self.tensor(rows.len(), x.cols)?;
        let rp = self.upload_u32("gather", rows)?;
        // SAFETY: the source, the uploaded row indices and the output (n x cols) are live buffers of
        // this GPU.
        unsafe { self.gpu.gather_rows(x.ptr(), rp, y.ptr(), rows.len(), x.cols) }.map_err(kerr)?;
        Ok(y)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        cos_sin: &CudaTensor,
        positions: &[u32],
        heads: usize,
        offset: usize,
        stride: usize,
        rope: usize,
        interleaved: bool,
    ) -> Result<()> {
        check_positions(x.rows, cos_sin, positions)?;
        if heads > 0 && offset + (heads - 1) * stride + rope > x.cols {
            return Err(EngineError::Backend("rope: rotated columns run past the row".into()));
        }
        let pp = self.upload_u32("positions", positions)?;
        let (rows, cols) = (x.rows, x.cols);
        // SAFETY: the rows, the cos/sin table (covering every position) and the uploaded positions are
        // live buffers of this GPU.
        unsafe { self.gpu.rope(x.ptr_mut(), cos_sin.ptr(), pp, rows, cols, heads, offset, stride, rope, interleaved) }
            .map_err(kerr)
    }

    fn write_kv(&self, cache: &mut CudaKvCache, layer: usize, latent: &CudaTensor, slots: &[u32]) -> Result<()> {
        let l = cache.layout;
        check_slots(cache, layer, latent, slots)?;
        let sp = self.upload_u32("slots", slots)?;
        // SAFETY: the latent rows, their uploaded slots (checked against the cache's size) and the
        // cache are live buffers of this GPU.
        unsafe {
            self.gpu.write_kv(
                cache.f32.is_some(),
                latent.ptr(),
                sp,
                cache.base(),
                latent.rows,
                l.width,
                l.layers,
                layer,
                l.block_size,
            )
        }
        .map_err(kerr)
    }

    fn mla_prologue(
        &self,
        q: &mut CudaTensor,
        kv: &CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        rot: Rotary<'_, CudaTensor>,
        cache: &mut CudaKvCache,
        layer: usize,
        slots: &[u32],
        dims: MlaDims,
    ) -> Result<()> {
        if !self.variants().fused_prologue {
            return mla_prologue_ops(self, q, kv, norm, eps, rot, cache, layer, slots, dims);
        }
        attention::prologue(self, q, kv, norm, eps, rot, cache, layer, slots, dims)
    }

    fn mla_attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        kv_b: &CudaWeight,
        batch: &AttnBatch,
        dims: MlaDims,
    ) -> Result<CudaTensor> {
        attention::mla_attention(self, q, cache, layer, kv_b, batch, dims)
    }

    fn moe_route(&self, logits: &CudaTensor, bias: &CudaTensor, params: RouterParams) -> Result<CudaRouting> {
        moe::route(self, logits, bias, params)
    }

    fn moe_experts(&self, x: &CudaTensor, routing: &CudaRouting, experts: &CudaExperts) -> Result<CudaTensor> {
        moe::experts(self, x, moe::Routing::Done(routing), experts, None)
    }

    fn moe(
        &self,
        x: &CudaTensor,
        router: Router<'_, CudaTensor>,
        experts: &CudaExperts,
        end: Option<AddNorm<'_, CudaTensor>>,
    ) -> Result<CudaTensor> {
        moe::experts(self, x, moe::Routing::Router(router), experts, end)
    }

    fn sample(&self, logits: &CudaTensor, rows: &[SampleRow], masks: &[u32]) -> Result<Vec<(u32, f32)>> {
        sample::sample(self, logits, rows, masks)
    }

    fn export_blocks(&self, cache: &CudaKvCache, blocks: &[u32]) -> Result<Vec<f32>> {
        kv::export(self, cache, blocks)
    }

    fn import_blocks(&self, cache: &mut CudaKvCache, blocks: &[u32], data: &[f32]) -> Result<()> {
        kv::import(self, cache, blocks, data)
    }

    fn can_capture(&self) -> bool {
        true
    }

    fn capture_step<T>(&self, limits: GraphLimits, f: &mut dyn FnMut() -> Result<T>) -> Result<(CudaGraph, T)> {
        graph::capture(self, limits, f)
    }

    fn stage_step(&self, s: &StepIndices<'_>) -> Result<()> {
        graph::stage(self, s)
    }

    fn release_graphs(&self) {
        self.graphs.ws.clear();
    }

    fn replay(&self, g: &CudaGraph) -> Result<()> {
        graph::replay(self, g)
    }
}

/// Rows' positions must index the rotary table.
fn check_positions(rows: usize, cos_sin: &CudaTensor, positions: &[u32]) -> Result<()> {
    if positions.len() != rows {
        return Err(EngineError::Backend(format!("rope: {} positions for {rows} rows", positions.len())));
    }
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= cos_sin.rows) {
        return Err(EngineError::InvalidRequest(format!(
            "position {p} is beyond the rotary table of {}",
            cos_sin.rows
        )));
    }
    Ok(())
}

/// `latent`'s rows must fit the cache's width, one slot each, inside the cache (or [`NO_SLOT`]).
fn check_slots(cache: &CudaKvCache, layer: usize, latent: &CudaTensor, slots: &[u32]) -> Result<()> {
    let l = cache.layout;
    if latent.cols != l.width || slots.len() != latent.rows || layer >= l.layers {
        return Err(EngineError::Backend("write_kv: latent shape, slots or layer disagree with the cache".into()));
    }
    if let Some(&s) = slots.iter().find(|&&s| s != NO_SLOT && s as usize >= l.num_blocks * l.block_size) {
        return Err(EngineError::Backend(format!("write_kv: slot {s} outside the cache")));
    }
    Ok(())
}
