//! MLA attention over the paged latent cache. Single-token queries use the absorbed form
//! (scores against the latent directly); chunks expand the latents to per-head keys and values
//! once and attend causally. Both compute the same function; a test holds them together.

use rayon::prelude::*;

use super::{dot, matmul_t, CpuKvCache, CpuTensor, CpuWeight};
use crate::backend::{AttnBatch, AttnSeq, MlaDims};
use crate::error::{EngineError, Result};

pub(super) fn mla_attention(
    q: &CpuTensor,
    cache: &CpuKvCache,
    layer: usize,
    kv_b: &CpuWeight,
    batch: &AttnBatch,
    d: MlaDims,
) -> Result<CpuTensor> {
    let qk = d.nope + d.rope;
    if q.cols != d.heads * qk || kv_b.out != d.heads * (d.nope + d.v) || kv_b.inp != d.kv_lora {
        return Err(EngineError::Backend("mla_attention: shapes disagree with the MLA dimensions".into()));
    }
    let mut out = vec![0f32; q.rows * d.heads * d.v];
    let ow = d.heads * d.v;
    let parts: Vec<(usize, Vec<f32>)> = batch
        .seqs
        .par_iter()
        .map(|s| {
            let ctx = gather_context(cache, layer, s);
            let o = if s.q_len == 1 { absorbed(q, &ctx, kv_b, s, d) } else { expanded(q, &ctx, kv_b, s, d) };
            (s.q_start, o)
        })
        .collect();
    for (start, o) in parts {
        out[start * ow..start * ow + o.len()].copy_from_slice(&o);
    }
    Ok(CpuTensor::new(out, q.rows, ow))
}

/// The sequence's cached rows `[ctx_len, width]`, in position order.
fn gather_context(cache: &CpuKvCache, layer: usize, s: &AttnSeq) -> Vec<f32> {
    let (bs, w) = (cache.layout.block_size, cache.layout.width);
    let buf = &cache.layers[layer];
    let mut ctx = Vec::with_capacity(s.ctx_len * w);
    for t in 0..s.ctx_len {
        let slot = s.block_table[t / bs] as usize * bs + t % bs;
        ctx.extend_from_slice(&buf[slot * w..(slot + 1) * w]);
    }
    ctx
}

fn softmax_in_place(v: &mut [f32]) {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
    }
}

/// Decode form: `score_t = (q_nope W_UK) . c_t + q_rope . k_rope_t`, `out = W_UV (P . c)`.
fn absorbed(q: &CpuTensor, ctx: &[f32], kv_b: &CpuWeight, s: &AttnSeq, d: MlaDims) -> Vec<f32> {
    let (qk, w, l) = (d.nope + d.rope, d.kv_lora + d.rope, d.kv_lora);
    let qrow = q.row(s.q_start);
    let mut out = vec![0f32; d.heads * d.v];
    for h in 0..d.heads {
        let qh = &qrow[h * qk..(h + 1) * qk];
        let wk = &kv_b.data[h * (d.nope + d.v) * l..];
        let mut q_lat = vec![0f32; l];
        for (i, &qi) in qh[..d.nope].iter().enumerate() {
            for (a, b) in q_lat.iter_mut().zip(&wk[i * l..(i + 1) * l]) {
                *a += qi * b;
            }
        }
        let mut scores: Vec<f32> =
            ctx.chunks_exact(w).map(|c| (dot(&q_lat, &c[..l]) + dot(&qh[d.nope..], &c[l..])) * d.scale).collect();
        softmax_in_place(&mut scores);
        let mut o_lat = vec![0f32; l];
        for (p, c) in scores.iter().zip(ctx.chunks_exact(w)) {
            for (a, b) in o_lat.iter_mut().zip(&c[..l]) {
                *a += p * b;
            }
        }
        let wv = &kv_b.data[(h * (d.nope + d.v) + d.nope) * l..];
        for j in 0..d.v {
            out[h * d.v + j] = dot(&wv[j * l..(j + 1) * l], &o_lat);
        }
    }
    out
}

/// Prefill form: expand every context latent to keys/values, then causal attention per head.
fn expanded(q: &CpuTensor, ctx: &[f32], kv_b: &CpuWeight, s: &AttnSeq, d: MlaDims) -> Vec<f32> {
    let (qk, w, l) = (d.nope + d.rope, d.kv_lora + d.rope, d.kv_lora);
    let n = s.ctx_len;
    let lat: Vec<f32> = ctx.chunks_exact(w).flat_map(|c| c[..l].iter().copied()).collect();
    let kv = matmul_t(&lat, n, l, &kv_b.data, kv_b.out); // [n, heads * (nope + v)]
    let kvw = d.nope + d.v;
    let mut out = vec![0f32; s.q_len * d.heads * d.v];
    let first_pos = s.ctx_len - s.q_len;
    for i in 0..s.q_len {
        let qrow = q.row(s.q_start + i);
        let visible = first_pos + i + 1;
        for h in 0..d.heads {
            let qh = &qrow[h * qk..(h + 1) * qk];
            let mut scores: Vec<f32> = (0..visible)
                .map(|t| {
                    let k = &kv[t * d.heads * kvw + h * kvw..][..d.nope];
                    (dot(&qh[..d.nope], k) + dot(&qh[d.nope..], &ctx[t * w + l..(t + 1) * w])) * d.scale
                })
                .collect();
            softmax_in_place(&mut scores);
            let o = &mut out[(i * d.heads + h) * d.v..][..d.v];
            for (t, p) in scores.iter().enumerate() {
                let v = &kv[t * d.heads * kvw + h * kvw + d.nope..][..d.v];
                for (a, b) in o.iter_mut().zip(v) {
                    *a += p * b;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, KvLayout};

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn absorbed_and_expanded_forms_agree() {
        let d = MlaDims { heads: 3, nope: 8, rope: 4, v: 6, kv_lora: 10, scale: 0.3 };
        let layout = KvLayout { layers: 1, num_blocks: 6, block_size: 4, width: d.kv_lora + d.rope };
        let be = CpuBackend;
        let mut cache = be.alloc_kv_cache(layout).unwrap();
        let ctx_len = 11;
        let table = vec![5, 2, 0];
        let slots: Vec<u32> = (0..ctx_len).map(|t| table[t / 4] * 4 + (t % 4) as u32).collect();
        let lat = CpuTensor::new(pseudo(ctx_len * layout.width, 7), ctx_len, layout.width);
        be.write_kv(&mut cache, 0, &lat, &slots).unwrap();
        let kv_b = CpuWeight {
            out: d.heads * (d.nope + d.v),
            inp: d.kv_lora,
            data: pseudo(d.heads * (d.nope + d.v) * d.kv_lora, 3),
        };
        let q = CpuTensor::new(pseudo(3 * d.heads * (d.nope + d.rope), 5), 3, d.heads * (d.nope + d.rope));
        // The last three positions as one chunk ...
        let chunk = AttnBatch { seqs: vec![AttnSeq { q_start: 0, q_len: 3, ctx_len, block_table: table.clone() }] };
        let full = be.mla_attention(&q, &cache, 0, &kv_b, &chunk, d).unwrap();
        // ... and each as a single decode query over its own prefix.
        for i in 0..3 {
            let qi = be.gather_rows(&q, &[i as u32]).unwrap();
            let one = AttnBatch {
                seqs: vec![AttnSeq { q_start: 0, q_len: 1, ctx_len: ctx_len - 2 + i, block_table: table.clone() }],
            };
            let o = be.mla_attention(&qi, &cache, 0, &kv_b, &one, d).unwrap();
            for (a, b) in o.data.iter().zip(full.row(i)) {
                assert!((a - b).abs() < 1e-4, "row {i}: {a} vs {b}");
            }
        }
    }
}
