//! FP8 prefill on FP8 tensor cores (DeepSeek's scheme): the activation quantization kernel
//! against its host reference (bit for bit), and prefill-sized linears over FP8 block-scaled
//! weights against the CPU on the same quantized activations. Timed three ways at V2-Lite and
//! V3 shapes: the whole linear (unpack + quantize + GEMM), cuBLASLt's GEMM alone, and the bf16
//! expansion it replaces.

use anyhow::{ensure, Result};
use cleave_engine::backend::cuda::{Fp8Out, Variants};
use cleave_engine::backend::Backend;
use cleave_kernels::blaslt::{Fp8BlockGemm, LT_WORKSPACE_BYTES};
use cleave_kernels::fp8::{self, BLOCK};
use cleave_kernels::ptr;

use super::ops::{kerr, Ctx};
use super::quant::RandomQuant;
use super::rel_err;
use super::Ceiling;

impl Ctx<'_> {
    pub fn fp8_prefill(&mut self) -> Result<()> {
        if self.precise {
            return Ok(());
        }
        self.act_quant_check()?;
        // (rows, out, in): V2-Lite q_proj with padded rows; V3 q_a, q_b, kv_a, o_proj and the dense
        // MLP at a 4k prompt.
        let shapes: &[(usize, usize, usize)] = if self.quick {
            &[(301, 256, 256), (200, 384, 512)]
        } else {
            &[
                (1002, 3072, 2048),
                (4096, 1536, 7168),
                (4096, 24576, 1536),
                (4096, 576, 7168),
                (4096, 7168, 16384),
                (4096, 36864, 7168),
                (4096, 7168, 18432),
            ]
        };
        let def = self.cu.variants();
        for &(rows, n, k) in shapes {
            let r = self.fp8_linear(rows, n, k, def);
            self.cu.set_variants(def);
            r?;
        }
        Ok(())
    }

    /// The device's activation quantization equals `fp8::act_quant` byte for byte: rows of very
    /// different magnitudes, a zero row, and a row count that needs padding.
    fn act_quant_check(&mut self) -> Result<()> {
        let (rows, k) = if self.quick { (7, 256) } else { (301, 7168) };
        let x = self.act_quant_input(rows, k);
        let want = fp8::act_quant(&x, rows, k);
        let gpu = self.cu.gpu();
        let xd = gpu.alloc::<f32>(x.len())?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { gpu.htod(&x, ptr(&xd)) }?;
        let qd = gpu.alloc::<u32>(want.q.len() / 4)?;
        let sd = gpu.alloc::<f32>(want.scales.len())?;
        // SAFETY: the activations and the (padded) e4m3 and scale outputs are live buffers of this GPU
        // sized for these rows and channels.
        unsafe { gpu.act_quant_fp8(ptr(&xd), rows, k, ptr(&qd), ptr(&sd)) }?;
        let mut q = vec![0u32; want.q.len() / 4];
        let mut s = vec![0f32; want.scales.len()];
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { gpu.dtoh(ptr(&qd), &mut q) }?;
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { gpu.dtoh(ptr(&sd), &mut s) }?;
        let bytes: Vec<u8> = q.iter().flat_map(|w| w.to_le_bytes()).collect();
        let bad = bytes.iter().zip(&want.q).filter(|(a, b)| a != b).count()
            + s.iter().zip(&want.scales).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let total = want.q.len() + want.scales.len();
        // SAFETY: the activations and the (padded) e4m3 and scale outputs are live buffers of this GPU
        // sized for these rows and channels.
        let us = self.time(|| unsafe { gpu.act_quant_fp8(ptr(&xd), rows, k, ptr(&qd), ptr(&sd)) }.map_err(kerr))?;
        let moved = (rows * k * 4 + want.q.len() + want.scales.len() * 4) as f64;
        self.push_exact("act_quant_fp8", format!("{rows} x {k}"), bad, total, us, moved);
        Ok(())
    }

    fn fp8_linear(&mut self, rows: usize, n: usize, k: usize, def: Variants) -> Result<()> {
        let w = RandomQuant::fp8(&mut self.rng, n, k);
        let wc = self.cpu.load_linear(&[w.source()])?;
        let wg = self.cu.load_linear(&[w.source()])?;
        let Some(bs) = wg.fp8_block_scales() else {
            anyhow::bail!("FP8 {n}x{k}: no block scales kept for the tensor-core path");
        };
        let x = self.rng.vec(rows * k, 1.0);
        let xg = self.cu.upload(&x, rows, k)?;
        let check = rows.min(64);
        let flops = 2.0 * (rows * n * k) as f64;
        let shape = format!("{rows} x {k} -> {n}");

        self.cu.set_variants(Variants { fp8_tensor_cores: true, ..def });
        let got = self.cu.download(&self.cu.linear(&xg, &wg)?)?;
        let path = self.cu.fp8_prefill_output();
        ensure!(path != Fp8Out::Untried, "the FP8 prefill linear did not try the tensor-core path");
        // On FP8 tensor cores the GEMM multiplies the quantized activations; without them
        // (fallback), the exact ones.
        let on_tc = matches!(path, Fp8Out::F32 | Fp8Out::Bf16);
        let xr = if on_tc {
            fp8::act_quant(&x[..check * k], check, k).dequantized(check, k)
        } else {
            x[..check * k].to_vec()
        };
        let want = self.cpu.linear(&self.cpu.upload(&xr, check, k)?, &wc)?;
        let err = rel_err(&got[..check * n], &want.data);
        let us = self.time(|| self.cu.linear(&xg, &wg).map(drop))?;
        let label = match path {
            Fp8Out::F32 => "linear fp8 tensor cores",
            Fp8Out::Bf16 => "linear fp8 tensor cores (bf16 out)",
            _ => "linear fp8 (no FP8 GEMM here: bf16)",
        };
        self.push(label, format!("{shape} ({check} rows checked)"), err, 1e-2, us, 0.0, flops, Ceiling::Fp8Tc);

        if on_tc {
            // cuBLASLt's GEMM alone, on buffers prepared as the linear prepares them.
            let gpu = self.cu.gpu();
            let rows_p = fp8::padded_rows(rows);
            let w8 = gpu.alloc::<u32>(n * k / 4)?;
            // SAFETY: the FP8 weight and the output of all its bytes are live buffers of this GPU.
            unsafe { gpu.qbytes_fp8(&wg.quant().expect("compressed"), ptr(&w8)) }?;
            let mut unpacked = vec![0u32; n * k / 4];
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { gpu.dtoh(ptr(&w8), &mut unpacked) }?;
            let bad =
                unpacked.iter().flat_map(|w| w.to_le_bytes()).zip(w.weight_bytes()).filter(|(a, b)| a != *b).count();
            let q = wg.quant().expect("compressed");
            // SAFETY: the FP8 weight and the output of all its bytes are live buffers of this GPU.
            let us = self.time(|| unsafe { gpu.qbytes_fp8(&q, ptr(&w8)) }.map_err(kerr))?;
            let moved = 2.0 * (n * k) as f64;
            self.push_exact("qbytes_fp8", format!("{n} x {k}"), bad, n * k, us, moved);
            let x8 = gpu.alloc::<u32>(rows_p * k / 4)?;
            let xs = gpu.alloc::<f32>(k / BLOCK * rows_p)?;
            // SAFETY: the activations and the (padded) e4m3 and scale outputs are live buffers of this GPU
            // sized for these rows and channels.
            unsafe { gpu.act_quant_fp8(xg.ptr(), rows, k, ptr(&x8), ptr(&xs)) }?;
            let ws = gpu.alloc::<u8>(LT_WORKSPACE_BYTES)?;
            let y_bf16 = path == Fp8Out::Bf16;
            let y = gpu.alloc::<f32>(rows_p * n)?;
            let g = Fp8BlockGemm {
                w: ptr(&w8),
                w_scales: bs,
                x: ptr(&x8),
                x_scales: ptr(&xs),
                y: ptr(&y),
                y_bf16,
                n,
                k,
                rows_p,
                workspace: ptr(&ws),
                workspace_bytes: LT_WORKSPACE_BYTES,
            };
            // SAFETY: the FP8 operands, their block scales and the output are live buffers of this GPU of
            // the GEMM's sizes.
            let us = self.time(|| unsafe { gpu.gemm_fp8_block(&g) }.map_err(kerr))?;
            self.push("cublaslt fp8 block gemm", shape.clone(), 0.0, 1.0, us, 0.0, flops, Ceiling::Fp8Tc);
        }

        // What it replaces: the weight expanded to bf16, bf16 tensor cores (exact activations).
        self.cu.set_variants(Variants { fp8_tensor_cores: false, ..def });
        let got = self.cu.download(&self.cu.linear(&xg, &wg)?)?;
        let want = self.cpu.linear(&self.cpu.upload(&x[..check * k], check, k)?, &wc)?;
        let err = rel_err(&got[..check * n], &want.data);
        let us = self.time(|| self.cu.linear(&xg, &wg).map(drop))?;
        self.push("linear fp8 bf16-expand", shape, err, 1e-2, us, 0.0, flops, Ceiling::Tc);
        Ok(())
    }
}
