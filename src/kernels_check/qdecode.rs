//! The persistent decode GEMM over compressed weights (`qg_persistent`) against the CPU backend:
//! the permuted FP8 activation quantization bit for bit against its host reference, dense linears
//! at decode sizes (split over the input channels), and the routed experts. AWQ keeps exact bf16
//! activations, so it is checked against the CPU on the same inputs; FP8 runs on FP8 tensor cores
//! with DeepSeek's activation quantization, so its reference quantizes the activations the same way
//! (the intermediate activation too: SiLU output rounded to bf16, then quantized). Each case is also
//! timed on the tiled kernel it replaces (FP8: exact bf16 activations).

use anyhow::{ensure, Result};
use cleave_engine::backend::cpu::CpuWeight;
use cleave_engine::backend::cuda::{Fp8Out, QuantGemm, Variants, QGEMM_MAX_ROWS};
use cleave_engine::backend::Backend;
use cleave_kernels::fp8::{self, BLOCK};
use cleave_kernels::ops::Fp8Order;
use cleave_kernels::ptr;

use super::experts::ExpertShape;
use super::ops::{kerr, Ctx};
use super::quant::RandomQuant;
use super::{experts_touched, rel_err, Ceiling};

impl Ctx<'_> {
    pub fn qdecode(&mut self) -> Result<()> {
        if self.precise {
            return Ok(());
        }
        self.act_quant_mma_check()?;
        let def = self.cu.variants();
        let persistent = Variants { qgemm: QuantGemm::Persistent(None), fp8_tensor_cores: true, ..def };
        self.cu.set_variants(persistent);
        let r =
            self.qdecode_linears(def).and_then(|()| self.qdecode_stacked()).and_then(|()| self.qdecode_experts(def));
        self.cu.set_variants(def);
        r
    }

    /// `act_quant_fp8_mma` in both orders, from f32 and from bf16, equals `fp8::act_quant` byte for
    /// byte once its bytes are put back in channel order.
    fn act_quant_mma_check(&mut self) -> Result<()> {
        let (rows, k) = if self.quick { (5, 256) } else { (64, 7168) };
        // bf16 values, so that the f32 and the bf16 inputs are the same numbers.
        let x: Vec<f32> = self.act_quant_input(rows, k).iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
        let want = fp8::act_quant(&x, rows, k);
        let gpu = self.cu.gpu();
        let bf: Vec<u16> = x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let (xf, xb) = (gpu.alloc::<f32>(x.len())?, gpu.alloc::<u16>(x.len())?);
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { gpu.htod(&x, ptr(&xf)) }?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { gpu.htod(&bf, ptr(&xb)) }?;
        let (qd, sd) = (gpu.alloc::<u32>(rows * k / 4)?, gpu.alloc::<f32>(rows * k / BLOCK)?);
        let orders = [
            (Fp8Order::Mma, "", fp8::mma_position as fn(usize) -> usize),
            (Fp8Order::Wgmma, " wgmma", fp8::wgmma_position),
        ];
        for ((src, is_bf16, label), (order, tag, position)) in
            [(ptr(&xf), false, "f32"), (ptr(&xb), true, "bf16")].into_iter().flat_map(|s| orders.map(|o| (s, o)))
        {
            // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
            // for these rows and channels.
            unsafe { gpu.act_quant_fp8_mma(order, src, is_bf16, rows, k, ptr(&qd), ptr(&sd)) }?;
            let (mut q, mut s) = (vec![0u32; rows * k / 4], vec![0f32; rows * k / BLOCK]);
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { gpu.dtoh(ptr(&qd), &mut q) }?;
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { gpu.dtoh(ptr(&sd), &mut s) }?;
            let bytes: Vec<u8> = q.iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut bad = 0usize;
            for r in 0..rows {
                for c in 0..k {
                    bad += (bytes[r * k + position(c)] != want.q[r * k + c]) as usize;
                }
                for b in 0..k / BLOCK {
                    bad += (s[r * (k / BLOCK) + b].to_bits() != want.scales[b * want.rows_p + r].to_bits()) as usize;
                }
            }
            // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
            // for these rows and channels.
            let quant = || unsafe { gpu.act_quant_fp8_mma(order, src, is_bf16, rows, k, ptr(&qd), ptr(&sd)) };
            let us = self.time(|| quant().map_err(kerr))?;
            let moved = (rows * k * if is_bf16 { 3 } else { 5 }) as f64;
            let total = rows * k + rows * k / BLOCK;
            self.push_exact(&format!("act_quant_fp8_mma{tag} {label}"), format!("{rows} x {k}"), bad, total, us, moved);
        }
        Ok(())
    }

    /// Dense linears at decode sizes against the CPU on the persistent kernel, each also timed on
    /// the tiled kernel (`def`'s other settings).
    fn qdecode_linears(&mut self, def: Variants) -> Result<()> {
        // (rows, out, in): V3 q_a, V2-Lite q_proj, V3 kv_a, V2-Lite o_proj, V3 q_b.
        let shapes: &[(usize, usize, usize)] = if self.quick {
            &[(1, 256, 1024), (20, 136, 384)]
        } else {
            &[(1, 1536, 7168), (16, 3072, 2048), (64, 576, 7168), (128, 2048, 2048), (5, 24576, 1536)]
        };
        let persistent = self.cu.variants();
        for (fmt, make) in super::quant::FORMATS {
            for &(rows, n, k) in shapes {
                let w = make(&mut self.rng, n, k);
                let wc = self.cpu.load_linear(&[w.source()])?;
                let wg = self.cu.load_linear(&[w.source()])?;
                ensure!(wg.quant().is_some(), "linear {fmt} {n}x{k}: the loader expanded it to bf16");
                let fp8 = fmt.starts_with("fp8");
                let x = self.rng.vec(rows * k, 1.0);
                let xg = self.cu.upload(&x, rows, k)?;
                let got = self.cu.download(&self.cu.linear(&xg, &wg)?)?;
                let xr = if fp8 { fp8::act_quant(&x, rows, k).dequantized(rows, k) } else { x.clone() };
                let want = self.cpu.linear(&self.cpu.upload(&xr, rows, k)?, &wc)?;
                let err = rel_err(&got, &want.data);
                let us = self.time(|| self.cu.linear(&xg, &wg).map(drop))?;
                let bytes = (n * k) as f64 * w.bytes_per_value() + (rows * k * 2 + rows * n * 4) as f64;
                let shape = format!("{rows} x {k} -> {n}");
                self.push(&format!("linear {fmt} persistent"), shape.clone(), err, 1e-2, us, bytes, 0.0, Ceiling::Mem);
                self.cu.set_variants(Variants { qgemm: QuantGemm::Tiled, fp8_tensor_cores: false, ..def });
                let us = self.time(|| self.cu.linear(&xg, &wg).map(drop))?;
                self.push(&format!("linear {fmt} tiled"), shape, 0.0, 1.0, us, bytes, 0.0, Ceiling::Mem);
                self.cu.set_variants(persistent);
            }
        }
        Ok(())
    }

    /// MLA's two input projections stacked into one compressed weight and cut after the product
    /// (`linear_split`): in the split-K reduction at decode sizes (or a copy of one split), after
    /// the linear past [`QGEMM_MAX_ROWS`] rows; each part against the CPU's separate linear.
    fn qdecode_stacked(&mut self) -> Result<()> {
        // (rows, [q out, kv_a out], in): V3's q_a + kv_a, V2-Lite's q + kv_a.
        let shapes: &[(usize, [usize; 2], usize)] = if self.quick {
            &[(1, [256, 64], 1024), (3, [128, 72], 384), (QGEMM_MAX_ROWS + 2, [128, 72], 384)]
        } else {
            &[(1, [1536, 576], 7168), (4, [3072, 576], 2048), (64, [1536, 576], 7168), (200, [1536, 576], 7168)]
        };
        for (fmt, make) in super::quant::FORMATS {
            for &(rows, [na, nb], k) in shapes {
                let (wa, wb) = (make(&mut self.rng, na, k), make(&mut self.rng, nb, k));
                ensure!(self.cu.stacks_projections(&wa.source(), &wb.source()), "{fmt}: the backend keeps these apart");
                let stacked = self.cu.load_linear(&[wa.source(), wb.source()])?;
                let (ca, cb) = (self.cpu.load_linear(&[wa.source()])?, self.cpu.load_linear(&[wb.source()])?);
                let fp8 = fmt.starts_with("fp8");
                let x = self.rng.vec(rows * k, 1.0);
                let xg = self.cu.upload(&x, rows, k)?;
                let (ga, gb) = self.cu.linear_split(&xg, &stacked, na)?;
                // FP8 activations are quantized at decode sizes, and past them on FP8 tensor cores
                // (the block-scaled GEMM, where the stacked weight has block scales).
                let tc = stacked.fp8_block_scales().is_some()
                    && matches!(self.cu.fp8_prefill_output(), Fp8Out::F32 | Fp8Out::Bf16);
                let quantized = fp8 && (rows <= QGEMM_MAX_ROWS || tc);
                let xr = if quantized { fp8::act_quant(&x, rows, k).dequantized(rows, k) } else { x };
                let xc = self.cpu.upload(&xr, rows, k)?;
                let err = rel_err(&self.cu.download(&ga)?, &self.cpu.linear(&xc, &ca)?.data)
                    .max(rel_err(&self.cu.download(&gb)?, &self.cpu.linear(&xc, &cb)?.data));
                let us = self.time(|| self.cu.linear_split(&xg, &stacked, na).map(drop))?;
                let bytes =
                    ((na + nb) * k) as f64 * wa.bytes_per_value() + (rows * k * 2 + rows * (na + nb) * 4) as f64;
                let shape = format!("{rows} x {k} -> {na} + {nb}");
                self.push(&format!("linear_split {fmt}"), shape, err, 1e-2, us, bytes, 0.0, Ceiling::Mem);
            }
        }
        Ok(())
    }

    fn qdecode_experts(&mut self, def: Variants) -> Result<()> {
        let (e, h, i, top) = if self.quick { (8, 256, 128, 3) } else { (64, 2048, 1408, 6) };
        let sizes: &[usize] = if self.quick { &[1, 5] } else { &[1, 16, 64] };
        let persistent = self.cu.variants();
        for (fmt, make) in super::quant::FORMATS {
            let layers = RandomQuant::experts(&mut self.rng, make, e, h, i);
            let sources = RandomQuant::expert_sources(&layers);
            let eg = self.cu.load_experts(&sources, 0, 0)?;
            ensure!(eg.quant().is_some(), "moe_experts {fmt}: the loader expanded them to bf16");
            let shape = ExpertShape { e, h, i, top, shared: 0, bytes_per_param: layers[0][0].bytes_per_value() };
            if fmt.starts_with("fp8") {
                let per_expert = self.cpu_experts(&layers)?;
                // Decode sizes on the persistent kernel, then, where it runs (sm_90a), a prefill
                // batch on the FP8 wgmma grouped GEMM (W8A8 too; elsewhere prefill is W8A16).
                let v = self.cu.variants();
                let wgmma = self.cu.gpu().has_wgmma() && v.prefill_fp8.is_some() && v.fp8_tensor_cores;
                let prefill: &[usize] = match (wgmma, self.quick) {
                    (false, _) => &[],
                    (true, true) => &[100],
                    (true, false) => &[1024],
                };
                for &n in sizes.iter().chain(prefill) {
                    self.fp8_experts_check("b128", &per_expert, &eg, shape, n)?;
                }
                // Scale blocks of 32 rows: the wgmma kernel reading every column's scale.
                if let Some(&n) = prefill.first() {
                    let make: super::quant::Maker = |r, n, k| RandomQuant::fp8_blocks(r, n, k, 32);
                    let layers = RandomQuant::experts(&mut self.rng, make, e, h, i);
                    let eg = self.cu.load_experts(&RandomQuant::expert_sources(&layers), 0, 0)?;
                    ensure!(eg.quant().is_some(), "moe_experts fp8 b32x128: the loader expanded them to bf16");
                    let per_expert = self.cpu_experts(&layers)?;
                    self.fp8_experts_check("b32x128", &per_expert, &eg, shape, n)?;
                }
            } else {
                let ec = self.cpu.load_experts(&sources, 0, 0)?;
                for &n in sizes {
                    self.check_experts(&format!("moe_experts {fmt} persistent"), &ec, &eg, shape, n)?;
                }
            }
            self.cu.set_variants(Variants { qgemm: QuantGemm::Tiled, fp8_tensor_cores: false, ..def });
            let ec = self.cpu.load_experts(&sources, 0, 0)?;
            for &n in sizes {
                self.check_experts(&format!("moe_experts {fmt} tiled"), &ec, &eg, shape, n)?;
            }
            self.cu.set_variants(persistent);
        }
        Ok(())
    }

    /// Each expert's gate, up and down on the CPU backend.
    fn cpu_experts(&self, layers: &[[RandomQuant; 3]]) -> Result<Vec<[CpuWeight; 3]>> {
        let load = |q: &RandomQuant| self.cpu.load_linear(&[q.source()]);
        layers.iter().map(|l| Ok([load(&l[0])?, load(&l[1])?, load(&l[2])?])).collect()
    }

    /// FP8 experts (scale blocks `blocks`) on FP8 tensor cores against the CPU's exact linears fed
    /// DeepSeek's quantized activations: the input per token, and the SiLU output after its bf16
    /// rounding.
    fn fp8_experts_check(
        &mut self,
        blocks: &str,
        w: &[[CpuWeight; 3]],
        eg: &cleave_engine::backend::cuda::CudaExperts,
        s: ExpertShape,
        n: usize,
    ) -> Result<()> {
        let (e, h, i, k) = (s.e, s.h, s.i, s.top);
        let ids = self.rng.routes(n, e, k);
        let wts: Vec<f32> = (0..n * k).map(|_| 0.1 + self.rng.unit()).collect();
        let x = self.rng.vec(n * h, 1.0);
        let xg = self.cu.upload(&x, n, h)?;
        let rg = self.cu.routing_from_host(&ids, &wts, k)?;
        let got = self.cu.download(&self.cu.moe_experts(&xg, &rg, eg)?)?;
        let xq = fp8::act_quant(&x, n, h).dequantized(n, h);
        let mut want = vec![0f32; n * h];
        for (ex, [gate, up, down]) in w.iter().enumerate() {
            let rows: Vec<usize> = (0..n * k).filter(|&p| ids[p] as usize == ex).collect();
            if rows.is_empty() {
                continue;
            }
            let xe: Vec<f32> = rows.iter().flat_map(|&p| xq[p / k * h..(p / k + 1) * h].to_vec()).collect();
            let xe = self.cpu.upload(&xe, rows.len(), h)?;
            let (g, u) = (self.cpu.linear(&xe, gate)?, self.cpu.linear(&xe, up)?);
            let act: Vec<f32> = g
                .data
                .iter()
                .zip(&u.data)
                .map(|(&g, &u)| half::bf16::from_f32(g / (1.0 + (-g).exp()) * u).to_f32())
                .collect();
            let aq = fp8::act_quant(&act, rows.len(), i).dequantized(rows.len(), i);
            let y = self.cpu.linear(&self.cpu.upload(&aq, rows.len(), i)?, down)?;
            for (j, &p) in rows.iter().enumerate() {
                for c in 0..h {
                    want[p / k * h + c] += wts[p] * y.data[j * h + c];
                }
            }
        }
        let err = rel_err(&got, &want);
        let us = self.time(|| self.cu.moe_experts(&xg, &rg, eg).map(drop))?;
        let experts_used = experts_touched(&ids);
        let bytes = experts_used as f64 * (3 * h * i) as f64 * s.bytes_per_param;
        let (path, ceiling) = match n * k >= 32 * e {
            true => ("wgmma", Ceiling::Tc),
            false => ("persistent", Ceiling::Mem),
        };
        let op = format!("moe_experts fp8 {blocks} {path}");
        let flops = 2.0 * (n * k * 3 * h * i) as f64;
        self.push(
            &op,
            format!("{n} tokens, {e}x(3 x {h}x{i}), top {k}, {experts_used} experts used"),
            err,
            1e-2,
            us,
            bytes,
            flops,
            ceiling,
        );
        Ok(())
    }
}
