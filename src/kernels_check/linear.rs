//! Dense linears, CUDA against the CPU: bf16 (cuBLAS GEMMs and the few-row GEMV), the f32
//! router gate, and the fused bf16 copies ("shadows") that GEMM operands are read from.

use anyhow::Result;
use cleave_engine::backend::cpu::CpuWeight;
use cleave_engine::backend::cuda::{CudaTensor, CudaWeight, Variants, GEMV_MAX_ROWS};
use cleave_engine::backend::Backend;

use super::ops::{bf16_bytes, named, source, Ctx, RandomExperts};
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    /// Dense linears under the default kernels (the GEMV up to its row count) and again with
    /// cuBLAS at every size, then the shadows.
    pub fn linear(&mut self) -> Result<()> {
        let def = self.cu.variants();
        let mut alts = vec![(" cublas".to_string(), Variants { gemv_rows: 0, router_gemv_rows: 0, ..def })];
        if def.gemv_rows < GEMV_MAX_ROWS {
            alts.push((format!(" gemv{GEMV_MAX_ROWS}"), Variants { gemv_rows: GEMV_MAX_ROWS, ..def }));
        }
        self.each_variant("", &alts, Self::linear_shapes)?;
        self.shadows()
    }

    fn linear_shapes(&mut self) -> Result<()> {
        // Few-row shapes (the GEMV's): V2-Lite q, kv_a, o and lm_head, V3's fused q_a + kv_a.
        let shapes: &[(usize, usize, usize)] = if self.quick {
            &[(5, 48, 72), (1, 576, 2048), (2, 24, 64), (64, 3072, 2048)]
        } else {
            &[
                (1, 3072, 2048),
                (3, 576, 2048),
                (8, 2048, 2048),
                (1, 102400, 2048),
                (2, 2112, 7168),
                (64, 3072, 2048),
                (256, 21888, 2048),
                (4096, 3072, 2048),
                (4096, 2048, 10944),
                (8192, 8192, 8192),
            ]
        };
        // The router gate (by its checkpoint name) runs in f32: tolerance 1e-3. One and two rows
        // take several passes' loads at once (gemv.cu `U`): 2,056 channels end in a partial pass.
        let router: &[(usize, usize, usize)] = if self.quick {
            &[(1, 12, 2056), (2, 12, 2056), (7, 12, 72), (19, 12, 72)]
        } else {
            &[
                (1, 64, 2048),
                (1, 256, 7168),
                (2, 256, 7168),
                (4, 256, 7168),
                (64, 64, 2048),
                (256, 64, 2048),
                (256, 256, 7168),
                (4096, 256, 7168),
            ]
        };
        for (i, &(n, m, k)) in shapes.iter().chain(router).enumerate() {
            let gate = i >= shapes.len();
            let name = if gate { "model.layers.1.mlp.gate.weight" } else { "random" };
            let wv = self.rng.vec(m * k, (3.0 / k as f32).sqrt());
            let (wb, _) = bf16_bytes(&wv);
            let shape = [m, k];
            let wc = self.cpu.load_linear(&[named(name, &wb, &shape)])?;
            let wg = self.cu.load_linear(&[named(name, &wb, &shape)])?;
            let (err, us, check) = self.compare_linear(&wc, &wg, n, k, m)?;
            let wbytes = if gate { 4 } else { 2 };
            let bytes = (m * k * wbytes + n * k * 6 + n * m * 4) as f64;
            let flops = 2.0 * (n * m * k) as f64;
            let ceil = if n >= 1024 { Ceiling::Tc } else { Ceiling::Mem };
            let note = if check < n { format!(" ({check} rows checked)") } else { String::new() };
            let (op, tol) = if gate { ("linear f32 (router)", 1e-3) } else { ("linear bf16", 1e-2) };
            self.push(op, format!("{n} x {k} -> {m}{note}"), err, tol, us, bytes, flops, ceil);
        }
        // Two projections of one input (MLA's q and kv_a), one launch where the GEMV takes them.
        let pairs: &[(usize, [usize; 2], usize)] =
            if self.quick { &[(3, [40, 24], 72)] } else { &[(1, [3072, 576], 2048), (4, [1536, 576], 7168)] };
        for &(n, [ma, mb], k) in pairs {
            let (wa, _) = bf16_bytes(&self.rng.vec(ma * k, (3.0 / k as f32).sqrt()));
            let (wb, _) = bf16_bytes(&self.rng.vec(mb * k, (3.0 / k as f32).sqrt()));
            let (sa, sb) = ([ma, k], [mb, k]);
            let (ca, cb) = (self.cpu.load_linear(&[source(&wa, &sa)])?, self.cpu.load_linear(&[source(&wb, &sb)])?);
            let (ga, gb) = (self.cu.load_linear(&[source(&wa, &sa)])?, self.cu.load_linear(&[source(&wb, &sb)])?);
            let x = self.rng.vec(n * k, 1.0);
            let (xc, xg) = self.up(&x, n, k)?;
            let (ya, yb) = self.cu.linear_pair(&xg, &ga, &gb)?;
            let err = rel_err(&self.cu.download(&ya)?, &self.cpu.linear(&xc, &ca)?.data)
                .max(rel_err(&self.cu.download(&yb)?, &self.cpu.linear(&xc, &cb)?.data));
            let us = self.time(|| self.cu.linear_pair(&xg, &ga, &gb).map(drop))?;
            let bytes = ((ma + mb) * k * 2 + n * k * 6 + n * (ma + mb) * 4) as f64;
            let flops = 2.0 * (n * (ma + mb) * k) as f64;
            self.push(
                "linear_pair bf16",
                format!("{n} x {k} -> {ma} + {mb}"),
                err,
                1e-2,
                us,
                bytes,
                flops,
                Ceiling::Mem,
            );
        }
        Ok(())
    }

    /// `linear` on `rows` random rows of `k` inputs into `n` outputs, CUDA against the CPU: the
    /// relative error (over the first 64 rows at most, the rows checked), and the median time.
    pub(super) fn compare_linear(
        &mut self,
        wc: &CpuWeight,
        wg: &CudaWeight,
        rows: usize,
        k: usize,
        n: usize,
    ) -> Result<(f64, f64, usize)> {
        let x = self.rng.vec(rows * k, 1.0);
        let xg = self.cu.upload(&x, rows, k)?;
        let got = self.cu.download(&self.cu.linear(&xg, wg)?)?;
        let check = rows.min(64);
        let xc = self.cpu.upload(&x[..check * k], check, k)?;
        let want = self.cpu.linear(&xc, wc)?;
        let err = rel_err(&got[..check * n], &want.data);
        let us = self.time(|| self.cu.linear(&xg, wg).map(drop))?;
        Ok((err, us, check))
    }

    /// 0 when `t`'s bf16 shadow holds exactly its f32 values rounded to bf16 (at f32 precision:
    /// when it has none); else the fraction of values that differ, infinite when it is missing.
    pub(super) fn shadow_err(&self, t: &CudaTensor) -> Result<f64> {
        let sh = self.cu.download_bf16_shadow(t)?;
        if self.precise {
            return Ok(if sh.is_none() { 0.0 } else { f64::INFINITY });
        }
        let Some(sh) = sh else {
            return Ok(f64::INFINITY);
        };
        let (want, _) = bf16_bytes(&self.cu.download(t)?);
        let bad = sh.iter().zip(want.chunks(2)).filter(|(s, w)| s.to_le_bytes() != [w[0], w[1]]).count();
        Ok(bad as f64 / sh.len().max(1) as f64)
    }

    /// A copy of `t`'s values without a shadow.
    fn plain(&self, t: &CudaTensor) -> Result<CudaTensor> {
        let (r, c) = self.cu.dims(t);
        Ok(self.cu.upload(&self.cu.download(t)?, r, c)?)
    }

    /// Relative difference of `linear` over `t` (through its shadow, if any) and over its plain copy.
    fn linear_same(&self, t: &CudaTensor, w: &CudaWeight) -> Result<f64> {
        let a = self.cu.download(&self.cu.linear(t, w)?)?;
        let b = self.cu.download(&self.cu.linear(&self.plain(t)?, w)?)?;
        Ok(rel_err(&a, &b))
    }

    fn push_check(&mut self, op: &str, shape: String, err: f64) {
        self.push(op, shape, err, 1e-6, f64::NAN, 0.0, 0.0, Ceiling::None);
    }

    /// The fused bf16 copies of RMSNorm / add-RMSNorm / SiLU-mul outputs ("shadows", bf16
    /// precision only): bit-equal to casting the f32 output (pass-through tail included), GEMMs
    /// over them equal to GEMMs over the same values without one, and dropped by every in-place
    /// change (rope, add_assign, add_rms_norm's residual).
    fn shadows(&mut self) -> Result<()> {
        let n = if self.quick { 5 } else { 64 };
        let gone = |has: bool| if has { f64::INFINITY } else { 0.0 };
        let (cols, wc, m) = (576, 512, 320);
        let x = self.rng.vec(n * cols, 2.0);
        let w: Vec<f32> = (0..cols).map(|_| 0.5 + self.rng.unit()).collect();
        let xg = self.cu.upload(&x, n, cols)?;
        let (wg, wfull) = (self.cu.upload(&w[..wc], 1, wc)?, self.cu.upload(&w, 1, cols)?);
        let (lb, _) = bf16_bytes(&self.rng.vec(m * cols, (3.0 / cols as f32).sqrt()));
        let lshape = [m, cols];
        let lw = self.cu.load_linear(&[source(&lb, &lshape)])?;
        let y = self.cu.rms_norm(&xg, &wg, 1e-6)?;
        let err = self.shadow_err(&y)?.max(self.linear_same(&y, &lw)?);
        self.push_check("bf16 shadow: rms_norm -> linear", format!("{n} x {cols} (norm {wc}) -> {m}"), err);
        // in-place changes drop the shadow (a stale one would make the linears differ)
        let mut t = self.cu.rms_norm(&xg, &wg, 1e-6)?;
        let cs = self.cu.upload(&self.rng.vec(16 * 64, 1.0), 16, 64)?;
        let pos: Vec<u32> = (0..n).map(|i| (i % 16) as u32).collect();
        self.cu.rope(&mut t, &cs, &pos, 1, wc, 0, 64, true)?;
        let err = gone(t.has_bf16()).max(self.linear_same(&t, &lw)?);
        self.push_check("bf16 shadow: dropped by rope", format!("{n} x {cols}"), err);
        let mut t = self.cu.rms_norm(&xg, &wg, 1e-6)?;
        let b = self.cu.upload(&self.rng.vec(n * cols, 1.0), n, cols)?;
        self.cu.add_assign(&mut t, &b)?;
        let err = gone(t.has_bf16()).max(self.linear_same(&t, &lw)?);
        self.push_check("bf16 shadow: dropped by add_assign", format!("{n} x {cols}"), err);
        // add_rms_norm: the output has one, the residual (changed in place) loses its own
        let mut res = self.cu.rms_norm(&xg, &wg, 1e-6)?;
        let y = self.cu.add_rms_norm(&mut res, &b, &wfull, 1e-6)?;
        let err = self
            .shadow_err(&y)?
            .max(gone(res.has_bf16()))
            .max(self.linear_same(&y, &lw)?)
            .max(self.linear_same(&res, &lw)?);
        self.push_check("bf16 shadow: add_rms_norm -> linear", format!("{n} x {cols} -> {m}"), err);
        // silu_mul -> linear (the dense MLP's down projection)
        let i = if self.quick { 40 } else { 1408 };
        let xs = self.cu.upload(&self.rng.vec(n * 2 * i, 3.0), n, 2 * i)?;
        let (db, _) = bf16_bytes(&self.rng.vec(m * i, (3.0 / i as f32).sqrt()));
        let dshape = [m, i];
        let dw = self.cu.load_linear(&[source(&db, &dshape)])?;
        let y = self.cu.silu_mul(&xs)?;
        let err = self.shadow_err(&y)?.max(self.linear_same(&y, &dw)?);
        self.push_check("bf16 shadow: silu_mul -> linear", format!("{n} x 2*{i} -> {m}"), err);
        // the routed experts read the shadow of their (normed) input too
        let (e, h, i, k) = (8, 64, 40, 3);
        let eg = self.cu.load_experts(&RandomExperts::new(&mut self.rng, e, h, i).sources(), 0, 0)?;
        let ids: Vec<u32> = (0..n * k).map(|j| ((j * 5 + j / k) % e) as u32).collect();
        let wts: Vec<f32> = (0..n * k).map(|_| 0.1 + self.rng.unit()).collect();
        let rg = self.cu.routing_from_host(&ids, &wts, k)?;
        let xh = self.cu.upload(&self.rng.vec(n * h, 2.0), n, h)?;
        let wh = self.cu.upload(&w[..h], 1, h)?;
        let y = self.cu.rms_norm(&xh, &wh, 1e-6)?;
        let a = self.cu.download(&self.cu.moe_experts(&y, &rg, &eg)?)?;
        let b = self.cu.download(&self.cu.moe_experts(&self.plain(&y)?, &rg, &eg)?)?;
        let err = self.shadow_err(&y)?.max(rel_err(&a, &b));
        self.push_check("bf16 shadow: rms_norm -> moe_experts", format!("{n} x {h}, {e} experts, top {k}"), err);
        Ok(())
    }
}
