//! MLA attention on the GPU in the absorbed form, for decode rows and prefill chunks alike:
//! `q_lat = q_nope W_UK` (batched GEMM over heads), the paged split-context kernel with online
//! softmax over `[c | k_rope]`, the split merge, and `out = o_lat W_UV^T` (batched GEMM). It
//! computes the same function as the CPU backend's absorbed and expanded forms.

use cleave_kernels::blas::Gemm;
use cleave_kernels::ops::MlaLaunch;
use cleave_kernels::{ptr, Gpu};

use super::{kerr, CudaBackend, CudaKvCache, CudaTensor, CudaWeight};
use crate::backend::{AttnBatch, MlaDims};
use crate::error::{EngineError, Result};

pub(super) fn mla_attention(be: &CudaBackend, q: &CudaTensor, cache: &CudaKvCache, layer: usize, kv_b: &CudaWeight, batch: &AttnBatch, d: MlaDims) -> Result<CudaTensor> {
    let qk = d.nope + d.rope;
    let (rows, heads, l) = (q.rows, d.heads, d.kv_lora);
    let lay = cache.layout;
    if q.cols != heads * qk || kv_b.out != heads * (d.nope + d.v) || kv_b.inp != l || lay.width != l + d.rope || layer >= lay.layers {
        return Err(EngineError::Backend("mla_attention: shapes disagree with the MLA dimensions".into()));
    }
    let out = be.tensor(rows, heads * d.v)?;
    if rows == 0 {
        return Ok(out);
    }
    // Per-row metadata, packed: [visible keys per row | block-table offset per row | tables].
    let mut meta = vec![0u32; 2 * rows];
    let mut max_ctx = 0;
    for s in &batch.seqs {
        if s.q_start + s.q_len > rows || s.ctx_len < s.q_len || s.block_table.len() * lay.block_size < s.ctx_len {
            return Err(EngineError::Backend("mla_attention: a sequence's rows or blocks do not cover its context".into()));
        }
        if let Some(&b) = s.block_table.iter().find(|&&b| b as usize >= lay.num_blocks) {
            return Err(EngineError::Backend(format!("mla_attention: block {b} outside the cache")));
        }
        let off = meta.len() - 2 * rows;
        meta.extend_from_slice(&s.block_table);
        for i in 0..s.q_len {
            let visible = s.ctx_len - s.q_len + i + 1;
            meta[s.q_start + i] = visible as u32;
            meta[rows + s.q_start + i] = off as u32;
        }
        max_ctx = max_ctx.max(s.ctx_len);
    }
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
    if let (Some(c32), Some(w32)) = (&cache.f32, &kv_b.f32) {
        gpu.mla_ref_f32(&p, d.v, q.ptr(), ptr(c32), row_len, row_tab, tables, ptr(w32), out.ptr()).map_err(kerr)?;
        return Ok(out);
    }
    if cache.f32.is_some() || kv_b.f32.is_some() {
        return Err(EngineError::Backend("mla_attention: an f32 cache needs f32 weights and vice versa".into()));
    }

    Gpu::mla_supported(l, d.rope).map_err(kerr)?;
    let q_bf = be.to_bf16(q)?;
    let q_lat = be.alloc_f32(rows * heads * l)?;
    gpu.gemm(&Gemm {
        trans_a: false,
        trans_b: false,
        m: l,
        n: rows,
        k: d.nope,
        a: kv_b.ptr(),
        lda: l,
        stride_a: (d.nope + d.v) * l,
        b: ptr(&q_bf),
        ldb: heads * qk,
        stride_b: qk,
        c: ptr(&q_lat),
        ldc: heads * l,
        stride_c: l,
        batch: heads,
    })
    .map_err(kerr)?;

    let (splits, chunk) = p.splits(gpu.sm_count);
    let part_o = be.alloc_f32(rows * splits * heads * l)?;
    let part_ml = be.alloc_f32(rows * splits * heads * 2)?;
    gpu.mla_decode(&p, splits, chunk, ptr(&q_lat), q.ptr(), ptr(&cache.buf), row_len, row_tab, tables, ptr(&part_o), ptr(&part_ml))
        .map_err(kerr)?;
    let o_lat = be.alloc_u16(rows * heads * l)?;
    gpu.mla_combine(ptr(&part_o), ptr(&part_ml), ptr(&o_lat), rows, heads, l, splits).map_err(kerr)?;

    gpu.gemm(&Gemm {
        trans_a: true,
        trans_b: false,
        m: d.v,
        n: rows,
        k: l,
        a: kv_b.ptr() + (d.nope * l * 2) as u64,
        lda: l,
        stride_a: (d.nope + d.v) * l,
        b: ptr(&o_lat),
        ldb: heads * l,
        stride_b: l,
        c: out.ptr(),
        ldc: heads * d.v,
        stride_c: d.v,
        batch: heads,
    })
    .map_err(kerr)?;
    Ok(out)
}
