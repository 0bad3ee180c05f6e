//! The expanded prefill attention (latent gather, `kv_b` expansion, `mla_prefill_flash`) through
//! the CUDA backend's `mla_attention`, against the CPU backend: one chunk per case, alone or after
//! a cached prefix, V2-Lite (16) and V3 (128) heads, and small head dims (tiny-r1's) for the
//! kernel's padded paths. Sampled query rows are recomputed on the CPU as single-query sequences
//! over their visible prefix. Two timings: the whole op (FLOPs of the expansion GEMM plus the
//! causal attention) and the flash kernel alone (attention FLOPs, from the per-launch profile),
//! both over the 790 TFLOP/s tensor-core ceiling.

use anyhow::{anyhow, Result};
use cleave_engine::backend::cuda::Variants;
use cleave_engine::backend::{AttnBatch, AttnSeq, Backend, KvLayout, MlaDims};
use cleave_kernels::ops::PREFILL_FLASH;

use super::ops::{bf16_bytes, source, Ctx};
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    /// Prefill attention cases under the expanded (flash) path, whatever the environment picks.
    pub fn prefill(&mut self) -> Result<()> {
        let lite = MlaDims { heads: 16, nope: 128, rope: 64, v: 128, kv_lora: 512, scale: 0.1 };
        let v3 = MlaDims { heads: 128, ..lite };
        let small = MlaDims { heads: 4, nope: 32, rope: 16, v: 32, kv_lora: 64, scale: 0.25 };
        let cases: &[(MlaDims, usize, usize)] = if self.quick {
            &[(lite, 64, 64), (lite, 100, 300), (small, 130, 200)]
        } else {
            &[
                (lite, 64, 64),
                (lite, 256, 1000),
                (lite, 1000, 1000),
                (lite, 4096, 4096),
                (v3, 64, 64),
                (v3, 256, 1000),
                (v3, 4096, 4096),
                (small, 130, 200),
            ]
        };
        let def = self.cu.variants();
        self.cu.set_variants(Variants { expanded_prefill: true, ..def });
        let r = cases.iter().try_for_each(|&(d, q_len, ctx)| self.prefill_case(d, q_len, ctx));
        self.cu.set_variants(def);
        r
    }

    /// One chunk of `q_len` rows at the end of a `ctx`-token sequence.
    fn prefill_case(&mut self, d: MlaDims, q_len: usize, ctx: usize) -> Result<()> {
        let (bs, width, qk, heads) = (64, d.kv_lora + d.rope, d.nope + d.rope, d.heads);
        let layout = KvLayout { layers: 2, num_blocks: ctx.div_ceil(bs) + 3, block_size: bs, width };
        let mut table: Vec<u32> = (0..layout.num_blocks as u32).collect();
        self.rng.shuffle(&mut table);
        table.truncate(ctx.div_ceil(bs));
        let slots: Vec<u32> = (0..ctx).map(|t| table[t / bs] * bs as u32 + (t % bs) as u32).collect();
        let (_, lat) = bf16_bytes(&self.rng.vec(ctx * width, 1.0));
        let mut cc = self.cpu.alloc_kv_cache(layout)?;
        let mut cg = self.cu.alloc_kv_cache(layout)?;
        self.cpu.write_kv(&mut cc, 1, &self.cpu.upload(&lat, ctx, width)?, &slots)?;
        self.cu.write_kv(&mut cg, 1, &self.cu.upload(&lat, ctx, width)?, &slots)?;
        let kvb = self.rng.vec(heads * (d.nope + d.v) * d.kv_lora, (3.0 / d.kv_lora as f32).sqrt());
        let (kb, _) = bf16_bytes(&kvb);
        let kshape = [heads * (d.nope + d.v), d.kv_lora];
        let kc = self.cpu.load_linear(&[source(&kb, &kshape)])?;
        let kg = self.cu.load_linear(&[source(&kb, &kshape)])?;
        let q = self.rng.vec(q_len * heads * qk, 1.0);
        let qg = self.cu.upload(&q, q_len, heads * qk)?;
        let batch = AttnBatch { seqs: vec![AttnSeq { q_start: 0, q_len, ctx_len: ctx, block_table: table.clone() }] };
        let got = self.cu.download(&self.cu.mla_attention(&qg, &cg, 1, &kg, &batch, d)?)?;

        // Reference: evenly spaced rows plus the first and last two of the chunk (tile edges).
        let want_rows = if self.quick { 64 } else { 32 };
        let mut rows: Vec<usize> = (0..q_len).step_by(q_len.div_ceil(want_rows).max(1)).collect();
        rows.extend([1, q_len - 2, q_len - 1].into_iter().filter(|&r| r < q_len));
        rows.sort_unstable();
        rows.dedup();
        let off = ctx - q_len;
        let qrows: Vec<f32> =
            rows.iter().flat_map(|&r| q[r * heads * qk..(r + 1) * heads * qk].iter().copied()).collect();
        let one = AttnBatch {
            seqs: rows
                .iter()
                .enumerate()
                .map(|(j, &r)| AttnSeq { q_start: j, q_len: 1, ctx_len: off + r + 1, block_table: table.clone() })
                .collect(),
        };
        let want = self.cpu.mla_attention(&self.cpu.upload(&qrows, rows.len(), heads * qk)?, &cc, 1, &kc, &one, d)?;
        let ow = heads * d.v;
        let got_rows: Vec<f32> = rows.iter().flat_map(|&r| got[r * ow..(r + 1) * ow].iter().copied()).collect();
        let err = rel_err(&got_rows, &want.data);

        let us = self.time(|| self.cu.mla_attention(&qg, &cg, 1, &kg, &batch, d).map(drop))?;
        // The flash kernel alone, from the per-launch event profile (mean of a few calls).
        let gpu = self.cu.gpu();
        self.cu.set_poison(false);
        gpu.profile_start();
        for _ in 0..self.iters.clamp(1, 5) {
            self.cu.mla_attention(&qg, &cg, 1, &kg, &batch, d)?;
        }
        let prof = gpu.profile_stop()?;
        self.cu.set_poison(true);
        let (ms, n) = prof
            .iter()
            .find(|(name, _, _)| PREFILL_FLASH.contains(&&name[..]))
            .map(|&(_, ms, n)| (ms, n))
            .ok_or_else(|| anyhow!("prefill {q_len}x{ctx}: mla_prefill_flash did not run"))?;
        let kernel_us = ms * 1e3 / n as f64;

        let visible = (q_len * off + q_len * (q_len + 1) / 2) as f64;
        let attn_flops = 2.0 * visible * heads as f64 * (qk + d.v) as f64;
        let expand_flops = 2.0 * (ctx * d.kv_lora * heads * (d.nope + d.v)) as f64;
        let kv_bytes = ctx * heads * (d.nope + d.v) * 2;
        let op_bytes = ctx * width * 4 + kvb.len() * 2 + 2 * kv_bytes + q_len * heads * (qk * 6 + d.v * 4);
        let kernel_bytes = kv_bytes + ctx * d.rope * 2 + q_len * heads * (qk * 2 + d.v * 4);
        let shape = format!(
            "{q_len} rows after {off} cached, {heads}h nope {} rope {} v {}, {} rows checked",
            d.nope,
            d.rope,
            d.v,
            rows.len()
        );
        self.push(
            "prefill attention",
            shape.clone(),
            err,
            1e-2,
            us,
            op_bytes as f64,
            attn_flops + expand_flops,
            Ceiling::Tc,
        );
        self.push(" mla_prefill_flash", shape, err, 1e-2, kernel_us, kernel_bytes as f64, attn_flops, Ceiling::Tc);
        Ok(())
    }
}
