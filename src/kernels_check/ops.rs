//! Every CUDA backend op against the CPU backend (the f32 reference) on fresh random inputs,
//! outputs poisoned with NaN before the GPU writes them, at small and real DeepSeek sizes; then
//! timed with CUDA events. Large cases compare a sample of rows (each row is independent).

use std::path::Path;

use anyhow::Result;
use cleave_engine::backend::cpu::{CpuBackend, CpuTensor};
use cleave_engine::backend::cuda::{CudaBackend, Fusion, MlaDecode, Variants};
use cleave_engine::backend::{AttnBatch, AttnSeq, Backend, ExpertSource, KvLayout, MlaDims};
use cleave_engine::weights::{LinearSource, RawTensor};
use rayon::prelude::*;
use safetensors::tensor::Dtype;

use super::{rel_err, Ceiling, Row, XRng};

pub struct Ctx<'a> {
    pub cu: &'a CudaBackend,
    pub cpu: CpuBackend,
    pub rng: XRng,
    pub quick: bool,
    pub rows: Vec<Row>,
    pub iters: usize,
    /// The backend runs at reference (f32) precision: tolerance 1e-3 everywhere.
    pub precise: bool,
    /// Check the default kernel variants only, not the alternatives (`--default-variants`).
    pub defaults_only: bool,
    /// Appended to op names (the kernel variant under test).
    pub tag: String,
}

/// bf16 bytes of `vals` (round to nearest even) and the values they hold.
pub fn bf16_bytes(vals: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = vec![0u8; vals.len() * 2];
    let mut held = vec![0f32; vals.len()];
    bytes.par_chunks_mut(2).zip(held.par_iter_mut()).zip(vals.par_iter()).for_each(|((b, h), &v)| {
        let x = half::bf16::from_f32(v);
        b.copy_from_slice(&x.to_bits().to_le_bytes());
        *h = x.to_f32();
    });
    (bytes, held)
}

/// Random bf16 expert weights (gate, up, down, scaled by fan-in) for `e` experts of hidden size `h`
/// and intermediate size `i`.
pub struct RandomExperts {
    e: usize,
    gate_up: [Vec<u8>; 2],
    down: Vec<u8>,
    shapes: [[usize; 2]; 2],
}

impl RandomExperts {
    pub fn new(rng: &mut XRng, e: usize, h: usize, i: usize) -> Self {
        let mut mk = |fan: usize| bf16_bytes(&rng.vec(e * i * h, (3.0 / fan as f32).sqrt())).0;
        let (gate, up, down) = (mk(h), mk(h), mk(i));
        RandomExperts { e, gate_up: [gate, up], down, shapes: [[i, h], [h, i]] }
    }

    pub fn sources(&self) -> Vec<ExpertSource<'_>> {
        let per = self.down.len() / self.e;
        (0..self.e)
            .map(|x| ExpertSource {
                gate: source(&self.gate_up[0][x * per..(x + 1) * per], &self.shapes[0]),
                up: source(&self.gate_up[1][x * per..(x + 1) * per], &self.shapes[0]),
                down: source(&self.down[x * per..(x + 1) * per], &self.shapes[1]),
            })
            .collect()
    }
}

pub fn source<'a>(bytes: &'a [u8], shape: &'a [usize]) -> LinearSource<'a> {
    named("random", bytes, shape)
}

pub fn named<'a>(name: &'a str, bytes: &'a [u8], shape: &'a [usize]) -> LinearSource<'a> {
    LinearSource::Dense {
        weight: RawTensor { name, path: Path::new("random"), dtype: Dtype::BF16, shape, bytes },
        scale_inv: None,
    }
}

/// A kernel launcher's error as the engine's, for [`Ctx::time`] closures around raw launches.
pub(super) fn kerr(e: cleave_kernels::KernelError) -> cleave_engine::EngineError {
    cleave_engine::EngineError::Backend(format!("cuda: {e}"))
}

impl Ctx<'_> {
    pub(super) fn time(&self, mut f: impl FnMut() -> cleave_engine::Result<()>) -> Result<f64> {
        self.cu.set_poison(false);
        for _ in 0..3 {
            f()?;
        }
        self.cu.sync()?;
        let gpu = self.cu.gpu();
        let mut ts = Vec::with_capacity(self.iters);
        for _ in 0..self.iters {
            let a = gpu.record()?;
            f()?;
            let b = gpu.record()?;
            b.synchronize()?;
            ts.push(a.elapsed_ms(&b)? as f64 * 1e3);
        }
        ts.sort_by(f64::total_cmp);
        self.cu.set_poison(true);
        Ok(ts[ts.len() / 2])
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn push(
        &mut self,
        op: &str,
        shape: String,
        err: f64,
        tol: f64,
        us: f64,
        bytes: f64,
        flops: f64,
        ceiling: Ceiling,
    ) {
        let (op, tol) =
            if self.precise { (format!("{op} [f32]"), tol.min(1e-3)) } else { (format!("{op}{}", self.tag), tol) };
        self.rows.push(Row { op, shape, err, tol, us, bytes, flops, ceiling });
    }

    /// A bit-exact check's row: the share of `total` values that differ (tolerance 0), timed as a
    /// memory-bound op moving `bytes`.
    pub(super) fn push_exact(&mut self, op: &str, shape: String, differing: usize, total: usize, us: f64, bytes: f64) {
        let share = differing as f64 / total as f64;
        self.push(&format!("{op} (differing)"), shape, share, 0.0, us, bytes, 0.0, Ceiling::Mem);
    }

    /// `rows x k` activations for the FP8 quantization checks: random rows scaled by 1, 1e3, 1e-4
    /// and 0 in turn, so that blocks of very different magnitudes and a zero row are covered.
    pub(super) fn act_quant_input(&mut self, rows: usize, k: usize) -> Vec<f32> {
        let mut x = self.rng.vec(rows * k, 1.0);
        for (r, row) in x.chunks_mut(k).enumerate() {
            let scale = [1.0, 1e3, 1e-4, 0.0][r % 4];
            row.iter_mut().for_each(|v| *v *= scale);
        }
        x
    }

    pub(super) fn up(
        &self,
        v: &[f32],
        r: usize,
        c: usize,
    ) -> Result<(CpuTensor, cleave_engine::backend::cuda::CudaTensor)> {
        Ok((self.cpu.upload(v, r, c)?, self.cu.upload(v, r, c)?))
    }

    pub fn elementwise(&mut self) -> Result<()> {
        let sizes: &[usize] = if self.quick { &[3, 64] } else { &[1, 64, 4096] };
        for &n in sizes {
            // embedding
            let (v, h) = (if self.quick { 1000 } else { 102400 }, 2048);
            let table = self.rng.vec(v * h, 1.0);
            let (tc, tg) = self.up(&table, v, h)?;
            let ids: Vec<u32> = (0..n).map(|_| self.rng.below(v) as u32).collect();
            let want = self.cpu.embedding(&tc, &ids)?;
            let got = self.cu.download(&self.cu.embedding(&tg, &ids)?)?;
            let us = self.time(|| self.cu.embedding(&tg, &ids).map(drop))?;
            self.push(
                "embedding",
                format!("{n} x {h} of {v}"),
                rel_err(&got, &want.data),
                1e-3,
                us,
                (n * h * 8) as f64,
                0.0,
                Ceiling::Mem,
            );
            // rms_norm, with a pass-through tail (the latent's rope part) and without; past
            // 8,192 columns some weights come from L2 rather than registers
            for (cols, wc) in [(2048, 2048), (7168, 7168), (576, 512), (12288, 12288)] {
                let x = self.rng.vec(n * cols, 2.0);
                let w: Vec<f32> = (0..wc).map(|_| 0.5 + self.rng.unit()).collect();
                let (xc, xg) = self.up(&x, n, cols)?;
                let (wcpu, wg) = self.up(&w, 1, wc)?;
                let want = self.cpu.rms_norm(&xc, &wcpu, 1e-6)?;
                let got = self.cu.download(&self.cu.rms_norm(&xg, &wg, 1e-6)?)?;
                let us = self.time(|| self.cu.rms_norm(&xg, &wg, 1e-6).map(drop))?;
                self.push(
                    "rms_norm",
                    format!("{n} x {cols} (norm {wc})"),
                    rel_err(&got, &want.data),
                    1e-3,
                    us,
                    (n * cols * 8) as f64,
                    0.0,
                    Ceiling::Mem,
                );
            }
            // add_rms_norm: the returned norm and the updated residual
            let cols = 2048;
            let (x, r0) = (self.rng.vec(n * cols, 1.0), self.rng.vec(n * cols, 1.0));
            let w: Vec<f32> = (0..cols).map(|_| 0.5 + self.rng.unit()).collect();
            let (xc, xg) = self.up(&x, n, cols)?;
            let (mut rc, mut rg) = self.up(&r0, n, cols)?;
            let (wcpu, wg) = self.up(&w, 1, cols)?;
            let want = self.cpu.add_rms_norm(&mut rc, &xc, &wcpu, 1e-6)?;
            let got = self.cu.download(&self.cu.add_rms_norm(&mut rg, &xg, &wg, 1e-6)?)?;
            let got_res = self.cu.download(&rg)?;
            let err = rel_err(&got, &want.data).max(rel_err(&got_res, &rc.data));
            let us = self.time(|| self.cu.add_rms_norm(&mut rg, &xg, &wg, 1e-6).map(drop))?;
            self.push(
                "add_rms_norm",
                format!("{n} x {cols}"),
                err,
                1e-3,
                us,
                (n * cols * 16) as f64,
                0.0,
                Ceiling::Mem,
            );
            // silu_mul
            let i = 1408;
            let x = self.rng.vec(n * 2 * i, 3.0);
            let (xc, xg) = self.up(&x, n, 2 * i)?;
            let want = self.cpu.silu_mul(&xc)?;
            let got = self.cu.download(&self.cu.silu_mul(&xg)?)?;
            let us = self.time(|| self.cu.silu_mul(&xg).map(drop))?;
            self.push(
                "silu_mul",
                format!("{n} x 2*{i}"),
                rel_err(&got, &want.data),
                1e-3,
                us,
                (n * i * 12) as f64,
                0.0,
                Ceiling::Mem,
            );
            // add_assign
            let (a, b) = (self.rng.vec(n * cols, 1.0), self.rng.vec(n * cols, 1.0));
            let (mut ac, mut ag) = self.up(&a, n, cols)?;
            let (bc, bg) = self.up(&b, n, cols)?;
            self.cpu.add_assign(&mut ac, &bc)?;
            self.cu.add_assign(&mut ag, &bg)?;
            let err = rel_err(&self.cu.download(&ag)?, &ac.data);
            let us = self.time(|| self.cu.add_assign(&mut ag, &bg))?;
            self.push("add_assign", format!("{n} x {cols}"), err, 1e-3, us, (n * cols * 12) as f64, 0.0, Ceiling::Mem);
            // gather_rows
            let pick: Vec<u32> = (0..n.div_ceil(2)).map(|_| self.rng.below(n) as u32).collect();
            let want = self.cpu.gather_rows(&xc, &pick)?;
            let got = self.cu.download(&self.cu.gather_rows(&xg, &pick)?)?;
            let us = self.time(|| self.cu.gather_rows(&xg, &pick).map(drop))?;
            self.push(
                "gather_rows",
                format!("{} of {n} x {}", pick.len(), 2 * i),
                rel_err(&got, &want.data),
                1e-3,
                us,
                (pick.len() * 2 * i * 8) as f64,
                0.0,
                Ceiling::Mem,
            );
            // rope: q heads (interleaved and half-split) and the latent's shared k_rope
            let max_pos = 8192;
            let cs = self.rng.vec(max_pos * 64, 1.0);
            let (csc, csg) = self.up(&cs, max_pos, 64)?;
            let pos: Vec<u32> = (0..n).map(|_| self.rng.below(max_pos) as u32).collect();
            for (cols, heads, offset, stride, inter) in
                [(16 * 192, 16, 128, 192, true), (16 * 192, 16, 128, 192, false), (576, 1, 512, 0, true)]
            {
                let x = self.rng.vec(n * cols, 1.0);
                let (mut xc, mut xg) = self.up(&x, n, cols)?;
                self.cpu.rope(&mut xc, &csc, &pos, heads, offset, stride, 64, inter)?;
                self.cu.rope(&mut xg, &csg, &pos, heads, offset, stride, 64, inter)?;
                let err = rel_err(&self.cu.download(&xg)?, &xc.data);
                let us = self.time(|| self.cu.rope(&mut xg, &csg, &pos, heads, offset, stride, 64, inter))?;
                let kind = if inter { "interleaved" } else { "half-split" };
                self.push(
                    "rope",
                    format!("{n} x {heads}h {kind}"),
                    err,
                    1e-3,
                    us,
                    (n * heads * 64 * 8) as f64,
                    0.0,
                    Ceiling::Mem,
                );
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_case(
        &mut self,
        label: &str,
        d: MlaDims,
        seqs: &[(usize, usize)],
        check_rows: usize,
        time_it: bool,
    ) -> Result<()> {
        let bs = 64;
        let width = d.kv_lora + d.rope;
        let blocks_needed: usize = seqs.iter().map(|&(_, c)| c.div_ceil(bs)).sum();
        let layout = KvLayout { layers: 2, num_blocks: blocks_needed + 3, block_size: bs, width };
        let mut pool: Vec<u32> = (0..layout.num_blocks as u32).collect();
        self.rng.shuffle(&mut pool);
        let mut batch = AttnBatch::default();
        let (mut slots, mut rows) = (Vec::new(), 0);
        for &(q_len, ctx) in seqs {
            let table: Vec<u32> = pool.drain(..ctx.div_ceil(bs)).collect();
            slots.extend((0..ctx).map(|t| table[t / bs] * bs as u32 + (t % bs) as u32));
            batch.seqs.push(AttnSeq { q_start: rows, q_len, ctx_len: ctx, block_table: table });
            rows += q_len;
        }
        let (_, lat) = bf16_bytes(&self.rng.vec(slots.len() * width, 1.0));
        let mut cc = self.cpu.alloc_kv_cache(layout)?;
        let mut cg = self.cu.alloc_kv_cache(layout)?;
        let (lc, lg) = self.up(&lat, slots.len(), width)?;
        self.cpu.write_kv(&mut cc, 1, &lc, &slots)?;
        self.cu.write_kv(&mut cg, 1, &lg, &slots)?;
        let kvb = self.rng.vec(d.heads * (d.nope + d.v) * d.kv_lora, (3.0 / d.kv_lora as f32).sqrt());
        let (kb, _) = bf16_bytes(&kvb);
        let kshape = [d.heads * (d.nope + d.v), d.kv_lora];
        let kc = self.cpu.load_linear(&[source(&kb, &kshape)])?;
        let kg = self.cu.load_linear(&[source(&kb, &kshape)])?;
        let qk = d.nope + d.rope;
        let q = self.rng.vec(rows * d.heads * qk, 1.0);
        let qg = self.cu.upload(&q, rows, d.heads * qk)?;
        let got = self.cu.download(&self.cu.mla_attention(&qg, &cg, 1, &kg, &batch, d)?)?;
        // Reference: each sampled row as its own single-query sequence over its visible prefix.
        let mut all: Vec<(usize, &AttnSeq, usize)> = Vec::new();
        for s in &batch.seqs {
            all.extend((0..s.q_len).map(|i| (s.q_start + i, s, s.ctx_len - s.q_len + i + 1)));
        }
        let step = all.len().div_ceil(check_rows.max(1)).max(1);
        let picked: Vec<(usize, &AttnSeq, usize)> = all.iter().copied().step_by(step).collect();
        let qrows: Vec<f32> =
            picked.iter().flat_map(|&(r, _, _)| q[r * d.heads * qk..(r + 1) * d.heads * qk].iter().copied()).collect();
        let qc = self.cpu.upload(&qrows, picked.len(), d.heads * qk)?;
        let one = AttnBatch {
            seqs: picked
                .iter()
                .enumerate()
                .map(|(j, &(_, s, vis))| AttnSeq {
                    q_start: j,
                    q_len: 1,
                    ctx_len: vis,
                    block_table: s.block_table.clone(),
                })
                .collect(),
        };
        let want = self.cpu.mla_attention(&qc, &cc, 1, &kc, &one, d)?;
        let ow = d.heads * d.v;
        let got_rows: Vec<f32> =
            picked.iter().flat_map(|&(r, _, _)| got[r * ow..(r + 1) * ow].iter().copied()).collect();
        let err = rel_err(&got_rows, &want.data);
        let keys: usize = seqs.iter().map(|&(_, c)| c).sum();
        let visible: f64 = all.iter().map(|&(_, _, v)| v as f64).sum();
        let note = if picked.len() < all.len() { format!(", {} rows checked", picked.len()) } else { String::new() };
        let shape = format!("{label}: {} seqs, {rows} rows, {keys} keys, {}h{note}", seqs.len(), d.heads);
        let us = if time_it {
            self.time(|| self.cu.mla_attention(&qg, &cg, 1, &kg, &batch, d).map(drop))?
        } else {
            f64::NAN
        };
        let bytes = (keys * width * 2 + rows * d.heads * (qk + d.v) * 4 + kvb.len() * 2) as f64;
        let flops = visible * d.heads as f64 * (width + d.kv_lora) as f64 * 2.0 + rows as f64 * 2.0 * kvb.len() as f64;
        let ceil = if rows > 4 * seqs.len() { Ceiling::Tc } else { Ceiling::Mem };
        self.push("mla_attention", shape, err, 1e-2, us, bytes, flops, ceil);
        // The cache itself: write_kv + export on both sides, then an import round trip.
        let blocks: Vec<u32> = batch.seqs.iter().flat_map(|s| s.block_table.iter().copied()).take(64).collect();
        let ec = self.cpu.export_blocks(&cc, &blocks)?;
        let eg = self.cu.export_blocks(&cg, &blocks)?;
        let mut fresh = self.cu.alloc_kv_cache(layout)?;
        self.cu.import_blocks(&mut fresh, &blocks, &ec)?;
        let back = self.cu.export_blocks(&fresh, &blocks)?;
        let err = rel_err(&eg, &ec).max(rel_err(&back, &ec));
        self.push(
            "write_kv+export/import",
            format!("{} blocks x {} values", blocks.len(), layout.block_values()),
            err,
            1e-3,
            f64::NAN,
            0.0,
            0.0,
            Ceiling::None,
        );
        Ok(())
    }

    /// Attention under the default kernels and again under the others: v3 with each head
    /// grouping, v4 (on sm_90a), the split combine the other way (in the decode kernel or a
    /// launch of its own), v2, and the first versions (absorbed decode v1, absorbed prefill).
    pub fn attention(&mut self) -> Result<()> {
        let def = self.cu.variants();
        let mut alts: Vec<(String, Variants)> = Vec::new();
        for heads in MlaDecode::V3_HEADS {
            let m = MlaDecode::V3(Some(heads));
            alts.push((format!(" {m}"), Variants { mla: m, ..def }));
        }
        if self.cu.gpu().has_wgmma() {
            alts.push((" v4".into(), Variants { mla: MlaDecode::V4, ..def }));
        }
        let separate = Fusion { mla_join: !def.fusion.mla_join, ..def.fusion };
        let combine = if separate.mla_join { "fused" } else { "separate" };
        alts.push((format!(" {}, combine {combine}", def.mla), Variants { fusion: separate, ..def }));
        alts.push((" v2".into(), Variants { mla: MlaDecode::V2, ..def }));
        alts.push((" v1".into(), Variants { mla: MlaDecode::V1, expanded_prefill: false, ..def }));
        self.each_variant(&format!(" {}", def.mla), &alts, Self::attention_all)?;
        self.mla_prologue()
    }

    /// Runs `check` under the default kernels (rows tagged `default_tag`), then, unless checking
    /// the f32 reference precision, again under each alternative, tagging each row with its name.
    pub(super) fn each_variant(
        &mut self,
        default_tag: &str,
        alts: &[(String, Variants)],
        check: fn(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let def = self.cu.variants();
        self.tag = default_tag.to_string();
        let mut r = check(self);
        if !self.precise && !self.defaults_only {
            for (tag, v) in alts {
                if r.is_err() {
                    break;
                }
                self.cu.set_variants(*v);
                self.tag.clone_from(tag);
                r = check(self);
            }
            self.cu.set_variants(def);
        }
        self.tag.clear();
        r
    }

    fn attention_all(&mut self) -> Result<()> {
        let lite = MlaDims { heads: 16, nope: 128, rope: 64, v: 128, kv_lora: 512, scale: 0.1 };
        let odd = MlaDims { heads: 3, nope: 16, rope: 8, v: 16, kv_lora: 40, scale: 0.25 };
        self.attention_case("odd dims", odd, &[(1, 1), (1, 70), (11, 11), (5, 140)], 64, false)?;
        self.attention_case(
            "decode+chunks",
            lite,
            &[(1, 1), (1, 17), (1, 64), (1, 65), (1, 300), (37, 100), (1, 2000), (64, 64)],
            256,
            true,
        )?;
        // 300 rows of 16 heads fill a wave without splitting: v3 writes the output itself.
        self.attention_case("decode, one split", lite, &[(1, 100); 300], 32, false)?;
        let v3 = MlaDims { heads: 128, ..lite };
        self.attention_case("V3 heads", v3, &[(1, 1), (1, 65), (5, 300), (1, 2000), (1, 33)], 64, false)?;
        // Few rows (batch 1 to 8 decode steps).
        self.attention_case("few rows", lite, &[(1, 1), (1, 70), (1, 2000)], 8, false)?;
        self.attention_case("few rows V3 heads", v3, &[(1, 33), (2, 300), (1, 4000)], 8, false)?;
        // Batch-1 decode at 128 heads: v3 with 16 heads a block, the absorbed projections' kernels.
        self.attention_case("one row V3 heads", v3, &[(1, 2000)], 8, false)?;
        if self.quick {
            return Ok(());
        }
        let tp4 = MlaDims { heads: 32, ..lite };
        for (label, d, b, ctx) in [
            ("decode", lite, 1, 1024),
            ("decode", lite, 64, 1024),
            ("decode", lite, 256, 1024),
            ("decode", lite, 64, 4096),
            ("decode V3 heads", v3, 1, 4096),
            ("decode V3 heads", v3, 64, 1024),
            ("decode V3 heads", v3, 64, 2048),
            ("decode V3 heads", v3, 256, 1024),
            ("decode V3 heads", v3, 256, 2048),
            // One rank of a TP4 group: 32 of the 128 heads, every sequence's whole cache.
            ("decode TP4 rank", tp4, 64, 2048),
            ("decode TP4 rank", tp4, 256, 2048),
            ("decode TP4 rank", tp4, 64, 8192),
        ] {
            let seqs: Vec<(usize, usize)> = (0..b).map(|_| (1, ctx)).collect();
            self.attention_case(label, d, &seqs, 16, true)?;
        }
        self.attention_case("prefill", lite, &[(4096, 4096)], 24, true)?;
        Ok(())
    }
}
