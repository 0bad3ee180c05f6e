//! The routed experts against the CPU backend: random bf16 weights, tokens routed at random, on
//! every grouped-GEMM variant; the compressed formats' experts use the same check (`quant`).

use anyhow::Result;
use cleave_engine::backend::cpu::{CpuExperts, CpuRouting};
use cleave_engine::backend::cuda::{CudaExperts, Fusion, Variants, WgmmaGemm, DEFAULT_PERSISTENT, DEFAULT_WGMMA};
use cleave_engine::backend::{AddNorm, Backend, Router, RouterParams};
use cleave_kernels::ops::ROUTE_ALIGN_MAX_TOKENS;

use super::ops::{Ctx, RandomExperts};
use super::{experts_touched, rel_err, Ceiling};

impl Ctx<'_> {
    /// The experts under the default grouped GEMM, v1, the persistent decode kernel (on, or off
    /// when it is the default), without its 32-row tiles and, at prefill sizes, the mma.sync
    /// kernel in place of wgmma (or wgmma when it is off); then wgmma against mma.sync on every
    /// row of a prefill batch.
    pub fn experts(&mut self) -> Result<()> {
        let def = self.cu.variants();
        let (tag, other) = match def.moe_persistent {
            Some(_) => (" no-ggp", None),
            None => (" ggp", Some(DEFAULT_PERSISTENT)),
        };
        let (wtag, wother) = match def.prefill_gemm {
            Some(_) => (" mma-prefill", None),
            None => (" wgmma", Some(DEFAULT_WGMMA)),
        };
        let alts = [
            (" v1".to_string(), Variants { gemm_v2: false, moe_persistent: None, prefill_gemm: None, ..def }),
            (tag.to_string(), Variants { moe_persistent: other, ..def }),
            (" no-r32".to_string(), Variants { moe_rows32: None, ..def }),
            (wtag.to_string(), Variants { prefill_gemm: wother, ..def }),
        ];
        self.each_variant(" v2", &alts, Self::experts_all)?;
        self.prefill_gemm_agrees()
    }

    /// The wgmma grouped GEMM (each compiled shape) against the mma.sync one on every row of a
    /// prefill batch: partial row tiles, a partial column block and a partial k-tile in the quick
    /// shape, V2-Lite's experts at 4096 tokens otherwise. Skipped where wgmma is not compiled in.
    fn prefill_gemm_agrees(&mut self) -> Result<()> {
        if self.precise || !self.cu.gpu().has_wgmma() {
            return Ok(());
        }
        let (e, h, i, k, n) = if self.quick { (8, 256, 200, 3, 300) } else { (64, 2048, 1408, 6, 4096) };
        let weights = RandomExperts::new(&mut self.rng, e, h, i);
        let eg = self.cu.load_experts(&weights.sources(), 0, 0)?;
        let def = self.cu.variants();
        let cases: Vec<_> = WgmmaGemm::compiled()
            .map(|cfg| (format!("moe_experts wgmma {cfg}"), Variants { prefill_gemm: Some(cfg), ..def }))
            .collect();
        let shape = ExpertShape { e, h, i, top: k, shared: 0, bytes_per_param: 2.0 };
        self.variants_agree(&eg, shape, n, ("mma.sync", Variants { prefill_gemm: None, ..def }), &cases)
    }

    /// `moe_experts` on `n` tokens routed at random under each of `cases` against `base` on every
    /// row (the CPU check compares a few rows only), timed.
    pub(super) fn variants_agree(
        &mut self,
        eg: &CudaExperts,
        s: ExpertShape,
        n: usize,
        base: (&str, Variants),
        cases: &[(String, Variants)],
    ) -> Result<()> {
        let (e, h, i, k) = (s.e, s.h, s.i, s.top);
        let ids = self.rng.routes(n, e, k);
        let w: Vec<f32> = (0..n * k).map(|_| 0.1 + self.rng.unit()).collect();
        let xg = self.cu.upload(&self.rng.vec(n * h, 1.0), n, h)?;
        let rg = self.cu.routing_from_host(&ids, &w, k)?;
        let def = self.cu.variants();
        let run = |v: Variants| -> Result<(Vec<f32>, f64)> {
            self.cu.set_variants(v);
            let y = self.cu.download(&self.cu.moe_experts(&xg, &rg, eg)?)?;
            let us = self.time(|| self.cu.moe_experts(&xg, &rg, eg).map(drop))?;
            Ok((y, us))
        };
        let r = run(base.1).and_then(|(want, _)| {
            cases
                .iter()
                .map(|(op, v)| run(*v).map(|(got, us)| (op, rel_err(&got, &want), us)))
                .collect::<Result<Vec<_>>>()
        });
        self.cu.set_variants(def);
        let flops = 2.0 * (n * k * 3 * h * i) as f64;
        for (op, err, us) in r? {
            let shape = format!("{n} tokens, {e}x(3 x {h}x{i}), top {k}, all rows against {}", base.0);
            self.push(op, shape, err, 1e-2, us, 0.0, flops, Ceiling::Tc);
        }
        Ok(())
    }

    fn experts_all(&mut self) -> Result<()> {
        let (e, h, i, k) = if self.quick { (8, 64, 40, 3) } else { (64, 2048, 1408, 6) };
        let weights = RandomExperts::new(&mut self.rng, e, h, i);
        let sources = weights.sources();
        let ec = self.cpu.load_experts(&sources, 0, 0)?;
        let eg = self.cu.load_experts(&sources, 0, 0)?;
        let sizes: &[usize] = if self.quick { &[1, 3, 5, 40] } else { &[1, 2, 4, 16, 64, 256, 512, 4096] };
        let shape = ExpertShape { e, h, i, top: k, shared: 0, bytes_per_param: 2.0 };
        for &n in sizes {
            self.check_experts("moe_experts", &ec, &eg, shape, n)?;
        }
        let layer_sizes: &[usize] = if self.quick { &[1, 5, 70] } else { &[1, 16, 64, 256] };
        for &n in layer_sizes {
            self.check_moe_layer(&ec, &eg, shape, n)?;
        }
        // The layer's end at V3's width, on small experts: 7,168 columns take the fused combine
        // and norm's widest blocks (1,024 threads), whose register budget a launch can exceed;
        // past 8,192 some of the norm's weights come from L2 rather than registers.
        for h in [7168, 12288] {
            let wide = ExpertShape { h, i: 16, ..shape };
            let wide_weights = RandomExperts::new(&mut self.rng, e, wide.h, wide.i);
            let ws = wide_weights.sources();
            let (wide_c, wide_g) = (self.cpu.load_experts(&ws, 0, 0)?, self.cu.load_experts(&ws, 0, 0)?);
            for n in [1, 3] {
                self.check_moe_layer(&wide_c, &wide_g, wide, n)?;
            }
        }
        // An expert-parallel rank's half: tokens routed to the other half are skipped on both.
        let half = &sources[e / 2..];
        let (ec, eg) = (self.cpu.load_experts(half, e / 2, 0)?, self.cu.load_experts(half, e / 2, 0)?);
        self.check_experts("moe_experts ep-half", &ec, &eg, shape, sizes[sizes.len() / 2])?;
        self.shared_experts("moe_experts shared", &sources, shape, &[1, 64, 256, 4096])
    }

    /// The last two experts as shared experts folded in: every token takes them at weight 1 (the
    /// CPU computes them as plain experts); prefill sizes run them as dense GEMMs over their slots.
    pub(super) fn shared_experts(
        &mut self,
        op: &str,
        sources: &[cleave_engine::backend::ExpertSource<'_>],
        shape: ExpertShape,
        full_sizes: &[usize],
    ) -> Result<()> {
        let shape = ExpertShape { shared: 2, ..shape };
        let ec = self.cpu.load_experts(sources, 0, 0)?;
        let eg = self.cu.load_experts(sources, 0, shape.shared)?;
        // Quick sizes: decode, and enough rows for the prefill path (32 per routed expert).
        let prefill = (32 * (shape.e - shape.shared)).div_ceil(shape.top) + 1;
        let sizes = if self.quick { vec![3, prefill] } else { full_sizes.to_vec() };
        for n in sizes {
            self.check_experts(op, &ec, &eg, shape, n)?;
            self.check_moe_layer(&ec, &eg, shape, n)?;
        }
        Ok(())
    }

    /// A MoE layer's end through `Backend::moe` on `n` tokens: routed from random logits (the
    /// shape's last `shared` experts folded in), combined, added to a random residual and
    /// RMS-normalized; CUDA with its fusions at their limits (route and sort in one kernel up to
    /// ROUTE_ALIGN_MAX_TOKENS tokens; combine and norm in one, dense shared experts summed into
    /// the residual before it)
    /// against the CPU's separate ops, the next input and the residual both compared.
    fn check_moe_layer(&mut self, ec: &CpuExperts, eg: &CudaExperts, s: ExpertShape, n: usize) -> Result<()> {
        let (h, routed) = (s.h, s.e - s.shared);
        let params = RouterParams {
            n_experts: routed,
            n_group: 1,
            topk_group: 1,
            top_k: s.top,
            norm_topk_prob: true,
            scaling: 1.5,
            shared: s.shared,
        };
        let (x, logits) = (self.rng.vec(n * h, 1.0), self.rng.vec(n * routed, 4.0));
        let (res, bias) = (self.rng.vec(n * h, 2.0), self.rng.vec(routed, 0.3));
        let w: Vec<f32> = (0..h).map(|_| 0.5 + self.rng.unit()).collect();
        let check = n.min(64);
        let cpu = &self.cpu;
        let (xc, lc, bc, wc) = (
            cpu.upload(&x[..check * h], check, h)?,
            cpu.upload(&logits[..check * routed], check, routed)?,
            cpu.upload(&bias, 1, routed)?,
            cpu.upload(&w, 1, h)?,
        );
        let mut rc = cpu.upload(&res[..check * h], check, h)?;
        let router = Router { logits: &lc, bias: &bc, params };
        let want = cpu.moe(&xc, router, ec, Some(AddNorm { residual: &mut rc, w: &wc, eps: 1e-6 }))?;
        let def = self.cu.variants();
        let limits = Fusion { route_align: ROUTE_ALIGN_MAX_TOKENS, ..Fusion::DEFAULT };
        self.cu.set_variants(Variants { fusion: limits, ..def });
        let r = self.moe_layer_cuda(eg, s, n, [&x, &logits, &res, &bias, &w], params);
        self.cu.set_variants(def);
        let (got, res_got, us) = r?;
        let err = rel_err(&got[..check * h], &want.data).max(rel_err(&res_got[..check * h], &rc.data));
        let path = if n <= ROUTE_ALIGN_MAX_TOKENS { "route+sort fused" } else { "route, sort" };
        let checked = if check < n { format!(", {check} rows checked") } else { String::new() };
        self.push(
            "moe layer (+ add, norm)",
            format!("{n} tokens, {}x(3 x {h}x{}), top {} + {} shared, {path}{checked}", s.e, s.i, s.top, s.shared),
            err,
            1e-2,
            us,
            0.0,
            0.0,
            Ceiling::Mem,
        );
        Ok(())
    }

    /// `Backend::moe` with its end on the GPU: the next input, the residual after, the time.
    fn moe_layer_cuda(
        &self,
        eg: &CudaExperts,
        s: ExpertShape,
        n: usize,
        [x, logits, res, bias, w]: [&[f32]; 5],
        params: RouterParams,
    ) -> Result<(Vec<f32>, Vec<f32>, f64)> {
        let (h, routed, cu) = (s.h, s.e - s.shared, &self.cu);
        let (xg, lg, bg, wg) =
            (cu.upload(x, n, h)?, cu.upload(logits, n, routed)?, cu.upload(bias, 1, routed)?, cu.upload(w, 1, h)?);
        let mut rg = cu.upload(res, n, h)?;
        let router = Router { logits: &lg, bias: &bg, params };
        let got = cu.download(&cu.moe(&xg, router, eg, Some(AddNorm { residual: &mut rg, w: &wg, eps: 1e-6 }))?)?;
        let res_got = cu.download(&rg)?;
        let us = self.time(|| {
            let router = Router { logits: &lg, bias: &bg, params };
            cu.moe(&xg, router, eg, Some(AddNorm { residual: &mut rg, w: &wg, eps: 1e-6 })).map(drop)
        })?;
        Ok((got, res_got, us))
    }

    /// `moe_experts` on `n` tokens routed at random, CUDA against the CPU, timed.
    pub(super) fn check_experts(
        &mut self,
        op: &str,
        ec: &CpuExperts,
        eg: &CudaExperts,
        s: ExpertShape,
        n: usize,
    ) -> Result<()> {
        let (e, h, i) = (s.e, s.h, s.i);
        let k = s.top + s.shared;
        let routed = self.rng.routes(n, e - s.shared, s.top);
        let ids: Vec<u32> =
            routed.chunks(s.top).flat_map(|t| t.iter().copied().chain((e - s.shared..e).map(|x| x as u32))).collect();
        let w: Vec<f32> = (0..n * k).map(|j| if j % k >= s.top { 1.0 } else { 0.1 + self.rng.unit() }).collect();
        let x = self.rng.vec(n * h, 1.0);
        let xg = self.cu.upload(&x, n, h)?;
        let rg = self.cu.routing_from_host(&ids, &w, k)?;
        let got = self.cu.download(&self.cu.moe_experts(&xg, &rg, eg)?)?;
        let check = n.min(64);
        let xc = self.cpu.upload(&x[..check * h], check, h)?;
        let rc = CpuRouting { top_k: k, ids: ids[..check * k].to_vec(), weights: w[..check * k].to_vec() };
        let want = self.cpu.moe_experts(&xc, &rc, ec)?;
        let err = rel_err(&got[..check * h], &want.data);
        let us = self.time(|| self.cu.moe_experts(&xg, &rg, eg).map(drop))?;
        let experts_used = experts_touched(&ids);
        let bytes =
            experts_used as f64 * (3 * h * i) as f64 * s.bytes_per_param + (n * k * (h * 4 + i * 2) + n * h * 8) as f64;
        let flops = 2.0 * (n * k * 3 * h * i) as f64;
        let ceil = if n * s.top >= 32 * (e - s.shared) { Ceiling::Tc } else { Ceiling::Mem };
        let checked = if check < n { format!(", {check} rows checked") } else { String::new() };
        let shared = if s.shared > 0 { format!(" + {} shared", s.shared) } else { String::new() };
        self.push(
            op,
            format!("{n} tokens, {e}x(3 x {h}x{i}), top {}{shared}, {experts_used} experts used{checked}", s.top),
            err,
            1e-2,
            us,
            bytes,
            flops,
            ceil,
        );
        Ok(())
    }
}

/// Routed experts of a check: count, hidden and intermediate sizes, experts per token, and the
/// bytes per parameter the GPU reads.
#[derive(Clone, Copy)]
pub struct ExpertShape {
    pub e: usize,
    pub h: usize,
    pub i: usize,
    pub top: usize,
    /// Of the `e` experts, the last this many are shared experts folded in.
    pub shared: usize,
    pub bytes_per_param: f64,
}
