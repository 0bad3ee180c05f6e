//! MLA attention on the GPU. Decode rows and short chunks use the absorbed form: `q_lat = q_nope
//! W_UK` (batched GEMM over heads), the paged split-context kernel with online softmax over
//! `[c | k_rope]`, the split merge, and `out = o_lat W_UV^T`. Prefill chunks of at least
//! [`EXPAND_MIN_ROWS`] rows use the expanded form: the sequence's latents are gathered, expanded
//! to per-head keys and values once (`kv_b`, cuBLAS), and a flash-attention kernel computes the
//! causal attention of all heads (online softmax, no score matrix in memory); head dims it does
//! not take (see `Gpu::mla_prefill_supported`) stay on the absorbed form. All compute the CPU
//! backend's function; f32 precision runs the reference kernel.

use cleave_kernels::blas::Gemm;
use cleave_kernels::ops::{MlaLaunch, MlaOut, MlaPrologue};
use cleave_kernels::{ptr, Gpu};

use super::{
    check_positions, check_slots, kerr, CudaBackend, CudaKvCache, CudaTensor, CudaWeight, Precision, EXPAND_MIN_ROWS,
};
use crate::backend::{AttnBatch, AttnSeq, MlaDims, Rotary};
use crate::error::{EngineError, Result};

/// [`crate::backend::Backend::mla_prologue`] as one kernel (`mla_prologue_*`).
#[allow(clippy::too_many_arguments)]
pub(super) fn prologue(
    be: &CudaBackend,
    q: &mut CudaTensor,
    kv: &CudaTensor,
    norm: &CudaTensor,
    eps: f32,
    rot: Rotary<'_, CudaTensor>,
    cache: &mut CudaKvCache,
    layer: usize,
    slots: &[u32],
    d: MlaDims,
) -> Result<()> {
    check_positions(q.rows, rot.cos_sin, rot.positions)?;
    check_slots(cache, layer, kv, slots)?;
    if q.rows != kv.rows
        || q.cols != d.heads * (d.nope + d.rope)
        || norm.len() != d.kv_lora
        || rot.cos_sin.cols != d.rope
        || cache.layout.width != d.kv_lora + d.rope
    {
        return Err(EngineError::Backend(format!(
            "mla_prologue: q {}x{}, kv {}x{}, norm {} disagree with {d:?} or the rotary table",
            q.rows,
            q.cols,
            kv.rows,
            kv.cols,
            norm.len()
        )));
    }
    if q.rows == 0 {
        return Ok(());
    }
    let l = cache.layout;
    let q_bf16 = if be.precision == Precision::Bf16 { Some(be.alloc_u16(q.len())?) } else { None };
    let m = MlaPrologue {
        rows: q.rows,
        q: q.ptr_mut(),
        q_bf16: q_bf16.as_ref().map_or(0, |b| ptr(b)),
        heads: d.heads,
        nope: d.nope,
        rope: d.rope,
        kv: kv.ptr(),
        lora: d.kv_lora,
        norm: norm.ptr(),
        eps,
        cos_sin: rot.cos_sin.ptr(),
        positions: be.upload_u32("positions", rot.positions)?,
        interleaved: rot.interleaved,
        slots: be.upload_u32("slots", slots)?,
        cache: cache.base(),
        f32_cache: cache.f32.is_some(),
        layers: l.layers,
        layer,
        block_size: l.block_size,
    };
    // SAFETY: q, kv, norm and the table are this backend's tensors of the shapes checked above,
    // positions index the table, slots lie in the cache (or are NO_SLOT), layer < layers.
    unsafe { be.gpu.mla_prologue(&m) }.map_err(kerr)?;
    // Set after the in-place change (ptr_mut dropped the old one): the rotated values.
    q.bf16 = q_bf16;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: u64,
    lda: usize,
    sa: usize,
    ta: bool,
    b: u64,
    ldb: usize,
    sb: usize,
    tb: bool,
    c: u64,
    ldc: usize,
    sc: usize,
    batch: usize,
) -> Gemm {
    Gemm {
        trans_a: ta,
        trans_b: tb,
        m,
        n,
        k,
        a,
        lda,
        stride_a: sa,
        b,
        ldb,
        stride_b: sb,
        c,
        ldc,
        stride_c: sc,
        batch,
        beta: 0.0,
        c_bf16: false,
    }
}

pub(super) fn mla_attention(
    be: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    layer: usize,
    kv_b: &CudaWeight,
    batch: &AttnBatch,
    d: MlaDims,
) -> Result<CudaTensor> {
    let qk = d.nope + d.rope;
    let (rows, heads, l) = (q.rows, d.heads, d.kv_lora);
    let lay = cache.layout;
    if q.cols != heads * qk
        || kv_b.out != heads * (d.nope + d.v)
        || kv_b.inp != l
        || lay.width != l + d.rope
        || layer >= lay.layers
    {
        return Err(EngineError::Backend("mla_attention: shapes disagree with the MLA dimensions".into()));
    }
    if rows == 0 {
        return be.tensor(rows, heads * d.v);
    }
    let var = be.variants();
    let precise = cache.f32.is_some() || kv_b.f32_ptr().is_some();
    let flash = Gpu::mla_prefill_supported(d.nope, d.rope, d.v, l).is_ok();
    let expand = |s: &AttnSeq| !precise && flash && var.expanded_prefill && s.q_len >= EXPAND_MIN_ROWS;
    for s in &batch.seqs {
        if s.q_start + s.q_len > rows || s.ctx_len < s.q_len || s.block_table.len() * lay.block_size < s.ctx_len {
            return Err(EngineError::Backend(
                "mla_attention: a sequence's rows or blocks do not cover its context".into(),
            ));
        }
        if let Some(&b) = s.block_table.iter().find(|&&b| b as usize >= lay.num_blocks) {
            return Err(EngineError::Backend(format!("mla_attention: block {b} outside the cache")));
        }
    }
    let (meta, step_ctx, absorbed_rows) = absorbed_meta(batch, rows, expand);
    // One absorbed row (batch-1 decode) on the per-head GEMV kernels, as the dense GEMVs go;
    // W_UV's then writes the output projection's bf16 operand too.
    let few = !precise && absorbed_rows == 1 && rows == 1 && var.gemv_rows > 0;
    let few = few && Gpu::mla_absorb_takes(heads, d.nope, d.v, l);
    let out = if few { be.tensor_shadowed(rows, heads * d.v)? } else { be.tensor(rows, heads * d.v)? };
    // A captured step serves any context up to its bound.
    let max_ctx = be.graphs.max_ctx().unwrap_or(step_ctx);
    let mp = be.upload_u32("attn", &meta)?;
    let (row_len, row_tab, tables) = (mp, mp + 4 * rows as u64, mp + 8 * rows as u64);
    let gpu = be.gpu();
    let p = MlaLaunch {
        rows,
        heads,
        kv_lora: l,
        rope: d.rope,
        nope: d.nope,
        layers: lay.layers,
        layer,
        block_size: lay.block_size,
        scale: d.scale,
        max_ctx,
    };
    if let (Some(c32), Some(w32)) = (&cache.f32, kv_b.f32_ptr()) {
        // SAFETY: the queries, the f32 cache, the uploaded lengths and tables, kv_b and the output are
        // live buffers of this GPU of the sizes this launch reads and writes.
        unsafe { gpu.mla_ref_f32(&p, d.v, q.ptr(), ptr(c32), row_len, row_tab, tables, w32, out.ptr()) }
            .map_err(kerr)?;
        return Ok(out);
    }
    if precise {
        return Err(EngineError::Backend("mla_attention: an f32 cache needs f32 weights and vice versa".into()));
    }
    // The loader expands a compressed kv_b_proj (load.rs): the absorbed and expanded forms read bf16.
    let kv_b = kv_b
        .bf16_ptr()
        .ok_or_else(|| EngineError::Backend("mla_attention: kv_b_proj must be loaded as bf16 or f32".into()))?;
    Gpu::mla_supported(l, d.rope).map_err(kerr)?;
    // The prologue's bf16 copy of the rotated q when it wrote one.
    let q_bf = be.bf16_in(q)?;
    if absorbed_rows > 0 {
        let a = (d.nope + d.v) * l;
        let q_lat = be.alloc_f32(rows * heads * l)?;
        let (q_in, lq) = (q_bf.ptr(), heads * qk);
        let dims = [heads, d.nope, d.v, l];
        if few {
            // SAFETY: q_in holds one row of heads x qk bf16 (the prologue's copy), kv_b the whole
            // projection (its shape checked above), q_lat was allocated for heads x l f32.
            unsafe { gpu.mla_absorb_q(q_in, qk, kv_b, dims, ptr(&q_lat)) }.map_err(kerr)?;
        } else {
            let (o, lo) = (ptr(&q_lat), heads * l);
            // SAFETY: the operands and the output are live buffers of this GPU holding the matrices the
            // GEMM's sizes and leading dimensions describe.
            unsafe { gpu.gemm(&gemm(l, rows, d.nope, kv_b, l, a, false, q_in, lq, qk, false, o, lo, l, heads)) }
                .map_err(kerr)?;
        }
        let k = p.kernel(var.mla, gpu.has_wgmma());
        let splits = p.splits(&k, gpu.sm_count, gpu.mla_decode_blocks_per_sm(&k).map_err(kerr)?);
        let o_lat = be.alloc_u16(rows * heads * l)?;
        let decode = |out| {
            // SAFETY: the queries, the cache, the uploaded lengths and block tables (each block in the
            // cache) and the outputs sized for this launch are live buffers of this GPU.
            unsafe {
                gpu.mla_decode(&k, &p, splits, ptr(&q_lat), q.ptr(), ptr(&cache.buf), row_len, row_tab, tables, out)
            }
            .map_err(kerr)
        };
        if k.writes_output(splits) {
            decode(MlaOut::Output(ptr(&o_lat)))?;
        } else {
            let part_o = be.alloc_f32(rows * splits * heads * l)?;
            let part_ml = be.alloc_f32(rows * splits * heads * 2)?;
            let (po, pml, o) = (ptr(&part_o), ptr(&part_ml), ptr(&o_lat));
            if var.fusion.mla_join && k.merges_splits(splits) {
                decode(MlaOut::Joined { part_o: po, part_ml: pml, out: o })?;
            } else {
                decode(MlaOut::Partials { part_o: po, part_ml: pml })?;
                // SAFETY: the partials were written by the decode launch of these rows, heads and splits, and
                // the output and row lengths are live buffers of this GPU of those sizes.
                unsafe { gpu.mla_combine(po, pml, o, row_len, rows, heads, l, splits, k.tile) }.map_err(kerr)?;
            }
        }
        let kv_v = kv_b + (d.nope * l * 2) as u64;
        let o = ptr(&o_lat);
        if few {
            // SAFETY: o_lat holds heads x l bf16, out heads x v f32 and its shadow, when it has
            // one, heads x v bf16 (all made here), kv_b the whole projection.
            let out_bf16 = out.bf16.as_ref().map_or(0, |b| ptr(b));
            unsafe { gpu.mla_absorb_out(o, kv_b, dims, out.ptr(), out_bf16) }.map_err(kerr)?;
        } else {
            let (y, ly) = (out.ptr(), heads * d.v);
            // SAFETY: the operands and the output are live buffers of this GPU holding the matrices the
            // GEMM's sizes and leading dimensions describe.
            unsafe { gpu.gemm(&gemm(d.v, rows, l, kv_v, l, a, true, o, heads * l, l, false, y, ly, d.v, heads)) }
                .map_err(kerr)?;
        }
    }
    for s in batch.seqs.iter().filter(|s| expand(s)) {
        let tab = tables + 4 * meta[rows + s.q_start] as u64;
        expanded(be, q_bf.ptr(), cache, layer, kv_b, s, d, tab, &out)?;
    }
    Ok(out)
}

/// Per-row metadata of the absorbed kernel, packed: [visible keys per row | block-table offset
/// per row | block tables], with the longest absorbed context and the absorbed rows. Rows of the
/// sequences `expand` picks get 0 visible keys (the absorbed kernel skips them).
pub(super) fn absorbed_meta(
    batch: &AttnBatch,
    rows: usize,
    expand: impl Fn(&AttnSeq) -> bool,
) -> (Vec<u32>, usize, usize) {
    let mut meta = vec![0u32; 2 * rows];
    let (mut max_ctx, mut absorbed_rows) = (0, 0);
    for s in &batch.seqs {
        let off = meta.len() - 2 * rows;
        meta.extend_from_slice(&s.block_table);
        let expanded = expand(s);
        for i in 0..s.q_len {
            meta[s.q_start + i] = if expanded { 0 } else { (s.ctx_len - s.q_len + i + 1) as u32 };
            meta[rows + s.q_start + i] = off as u32;
        }
        if !expanded {
            max_ctx = max_ctx.max(s.ctx_len);
            absorbed_rows += s.q_len;
        }
    }
    (meta, max_ctx, absorbed_rows)
}

/// One prefill chunk in the expanded form, writing its rows of `out`.
#[allow(clippy::too_many_arguments)]
fn expanded(
    be: &CudaBackend,
    q_bf: u64,
    cache: &CudaKvCache,
    layer: usize,
    kv_b: u64,
    s: &AttnSeq,
    d: MlaDims,
    tab: u64,
    out: &CudaTensor,
) -> Result<()> {
    let gpu = be.gpu();
    let lay = cache.layout;
    let (ctx, ql, heads, l, w) = (s.ctx_len, s.q_len, d.heads, d.kv_lora, lay.width);
    let (qk, kvw) = (d.nope + d.rope, d.nope + d.v);
    let lat = be.alloc_u16(ctx * w)?;
    // SAFETY: the block table lists the sequence's blocks of this cache, and the output holds the
    // sequence's latent rows: live buffers of this GPU.
    unsafe { gpu.gather_latent(ptr(&cache.buf), tab, ptr(&lat), ctx, lay.layers, layer, lay.block_size, w) }
        .map_err(kerr)?;
    // kv[t, h*(nope+v) + j] = latent[t, :L] . kv_b[h*(nope+v) + j, :]   (bf16 out)
    let kv = be.alloc_u16(ctx * heads * kvw)?;
    let mut g = gemm(heads * kvw, ctx, l, kv_b, l, 0, true, ptr(&lat), w, 0, false, ptr(&kv), heads * kvw, 0, 1);
    g.c_bf16 = true;
    // SAFETY: the operands and the output are live buffers of this GPU holding the matrices the
    // GEMM's sizes and leading dimensions describe.
    unsafe { gpu.gemm(&g) }.map_err(kerr)?;
    let (q0, o0) = (s.q_start * heads * qk * 2, s.q_start * heads * d.v * 4);
    // SAFETY: the query, key/value and output rows of this chunk are live buffers of this GPU with
    // the leading dimensions passed.
    unsafe {
        gpu.mla_prefill_flash(
            q_bf + q0 as u64,
            heads * qk,
            ptr(&kv),
            heads * kvw,
            ptr(&lat) + (l * 2) as u64,
            w,
            out.ptr() + o0 as u64,
            heads * d.v,
            ql,
            ctx,
            heads,
            d.nope,
            d.rope,
            d.v,
            d.scale,
        )
    }
    .map_err(kerr)
}
