//! The compressed-weight kernels (AWQ int4, FP8 e4m3 with 128x128 block scales) against the CPU
//! backend, which dequantizes the same checkpoint tensors exactly: dense linears at decode sizes
//! (the compressed GEMM, split over input channels), prefill sizes (expansion + cuBLAS) and the
//! grouped expert GEMMs. Weights are random with realistic AWQ scale and zero-point ranges. A
//! weight the loader expands to bf16 instead of keeping compressed fails the stage.

use std::path::Path;

use anyhow::{ensure, Result};
use cleave_engine::backend::cuda::{QuantGemm, Variants};
use cleave_engine::backend::{Backend, ExpertSource};
use cleave_engine::weights::{pack_int4, AwqSource, LinearSource, RawTensor};
use cleave_kernels::ops::Expansion;
use cleave_kernels::ptr;
use safetensors::tensor::Dtype;

use super::experts::ExpertShape;
use super::ops::{kerr, Ctx};
use super::{Ceiling, XRng};

/// One random quantized linear layer's checkpoint tensors.
pub struct RandomQuant {
    awq: bool,
    /// FP8: output rows per scale block (128 in DeepSeek's checkpoints).
    block_rows: usize,
    shapes: [[usize; 2]; 3],
    bytes: [Vec<u8>; 3],
}

impl RandomQuant {
    /// AWQ int4 `[n, k]` with groups of `group`: 4-bit values and zero points spread over their
    /// range, f16 scales around sqrt(3 / k) / 7.5 (AutoAWQ on unit-variance weights).
    pub fn awq(rng: &mut XRng, n: usize, k: usize, group: usize) -> Self {
        let q: Vec<u8> = (0..k * n).map(|_| rng.below(16) as u8).collect();
        let z: Vec<u8> = (0..(k / group) * n).map(|_| (5 + rng.below(6)) as u8).collect();
        let base = (3.0 / k as f32).sqrt() / 7.5;
        let s: Vec<u8> = (0..(k / group) * n)
            .flat_map(|_| half::f16::from_f32(base * (0.5 + rng.unit())).to_bits().to_le_bytes())
            .collect();
        let words = |v: &[u8]| pack_int4(v).iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        RandomQuant {
            awq: true,
            block_rows: 0,
            shapes: [[k, n / 8], [k / group, n / 8], [k / group, n]],
            bytes: [words(&q), words(&z), s],
        }
    }

    /// FP8 e4m3 `[n, k]` (any byte but NaN) with f32 scales per 128 x 128 block.
    pub fn fp8(rng: &mut XRng, n: usize, k: usize) -> Self {
        Self::fp8_blocks(rng, n, k, 128)
    }

    /// As [`RandomQuant::fp8`] with scale blocks of `rows` x 128 (`weight_block_size [rows, 128]`).
    pub fn fp8_blocks(rng: &mut XRng, n: usize, k: usize, rows: usize) -> Self {
        let w: Vec<u8> = (0..n * k)
            .map(|_| {
                let b = rng.below(256) as u8;
                if b & 0x7f == 0x7f {
                    b & 0xfe
                } else {
                    b
                }
            })
            .collect();
        let sc = (3.0 / k as f32).sqrt() / 240.0;
        let s: Vec<u8> =
            (0..n.div_ceil(rows) * k.div_ceil(128)).flat_map(|_| (sc * (0.5 + rng.unit())).to_le_bytes()).collect();
        RandomQuant {
            awq: false,
            block_rows: rows,
            shapes: [[n, k], [n.div_ceil(rows), k.div_ceil(128)], [0, 0]],
            bytes: [w, s, Vec::new()],
        }
    }

    /// The checkpoint's weight bytes (e4m3 `[n, k]` for FP8).
    pub fn weight_bytes(&self) -> &[u8] {
        &self.bytes[0]
    }

    pub fn source(&self) -> LinearSource<'_> {
        let t = |i: usize, dtype: Dtype| RawTensor {
            name: "random",
            path: Path::new("random"),
            dtype,
            shape: &self.shapes[i],
            bytes: &self.bytes[i],
        };
        if self.awq {
            LinearSource::Awq(AwqSource {
                qweight: t(0, Dtype::I32),
                qzeros: t(1, Dtype::I32),
                scales: t(2, Dtype::F16),
            })
        } else {
            LinearSource::Dense {
                weight: t(0, Dtype::F8_E4M3),
                scale_inv: Some((t(1, Dtype::F32), [self.block_rows, 128])),
            }
        }
    }

    /// `e` experts of hidden size `h` and intermediate size `i`: gate, up (`[i, h]`) and down
    /// (`[h, i]`), made by `make`.
    pub(super) fn experts(rng: &mut XRng, make: Maker, e: usize, h: usize, i: usize) -> Vec<[RandomQuant; 3]> {
        (0..e).map(|_| [make(rng, i, h), make(rng, i, h), make(rng, h, i)]).collect()
    }

    pub(super) fn expert_sources(layers: &[[RandomQuant; 3]]) -> Vec<ExpertSource<'_>> {
        layers.iter().map(|[g, u, d]| ExpertSource { gate: g.source(), up: u.source(), down: d.source() }).collect()
    }

    /// Checkpoint bytes per weight value (what the GPU reads, scales included, within 1%).
    pub(super) fn bytes_per_value(&self) -> f64 {
        let values =
            if self.awq { self.shapes[0][0] * self.shapes[0][1] * 8 } else { self.shapes[0][0] * self.shapes[0][1] };
        self.bytes.iter().map(Vec::len).sum::<usize>() as f64 / values as f64
    }
}

/// The formats checked: name and a maker of `[n, k]` layers.
pub(super) type Maker = fn(&mut XRng, usize, usize) -> RandomQuant;
pub(super) const FORMATS: [(&str, Maker); 3] = [
    ("awq g128", |r, n, k| RandomQuant::awq(r, n, k, 128)),
    ("awq g64", |r, n, k| RandomQuant::awq(r, n, k, 64)),
    ("fp8 b128", RandomQuant::fp8),
];

impl Ctx<'_> {
    /// The exact paths (FP8 on FP8 tensor cores quantizes the activations: the `fp8_prefill` and
    /// `qdecode` stages check it), with decode GEMMs on the persistent kernel (AWQ) and then, tagged
    /// ` tiled`, on the tiled one.
    pub fn quant(&mut self) -> Result<()> {
        let def = self.cu.variants();
        let exact = Variants { fp8_tensor_cores: false, qgemm: QuantGemm::Persistent(None), ..def };
        self.cu.set_variants(exact);
        let r = self.each_variant("", &[(" tiled".to_string(), Variants { qgemm: QuantGemm::Tiled, ..exact })], |c| {
            c.quant_linear().and_then(|()| c.quant_experts())
        });
        self.cu.set_variants(def);
        r
    }

    /// The AWQ expansion of prefill (`qdequant_awq_rows`) equals the per-value reference bit for
    /// bit; both timed (bytes: the packed weights read, bf16 written).
    pub fn quant_expand(&mut self) -> Result<()> {
        // (out, in): V2-Lite q_proj, V3 q_b_proj and the V3 dense MLP's gate/up.
        let shapes: &[(usize, usize)] =
            if self.quick { &[(136, 384), (256, 640)] } else { &[(3072, 2048), (24576, 1536), (36864, 7168)] };
        for (fmt, make) in FORMATS.iter().filter(|(fmt, _)| fmt.starts_with("awq")) {
            for &(n, k) in shapes {
                let w = make(&mut self.rng, n, k);
                let wg = self.cu.load_linear(&[w.source()])?;
                let q = wg.quant().ok_or_else(|| anyhow::anyhow!("linear {fmt} {n}x{k}: the loader expanded it"))?;
                let gpu = self.cu.gpu();
                let (a, b) = (gpu.alloc::<u16>(n * k)?, gpu.alloc::<u16>(n * k)?);
                // SAFETY: the address and byte count lie within one live allocation of this GPU.
                unsafe { gpu.memset(ptr(&b), 0xff, n * k * 2) }?;
                // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
                // GPU.
                unsafe { gpu.qdequant_with(&q, ptr(&a), Expansion::PerValue) }?;
                let bytes = (n * k) as f64 * (w.bytes_per_value() + 2.0);
                for (how, label) in [(Expansion::PerValue, "reference"), (Expansion::Rows, "rows")] {
                    // SAFETY: the address and byte count lie within one live allocation of this GPU.
                    unsafe { gpu.memset(ptr(&b), 0xff, n * k * 2) }?;
                    // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
                    // GPU.
                    unsafe { gpu.qdequant_with(&q, ptr(&b), how) }?;
                    let (mut va, mut vb) = (vec![0u16; n * k], vec![0u16; n * k]);
                    // SAFETY: the source is a live allocation of this GPU holding as many values of the
                    // destination's plain numeric type.
                    unsafe { gpu.dtoh(ptr(&a), &mut va) }?;
                    // SAFETY: the source is a live allocation of this GPU holding as many values of the
                    // destination's plain numeric type.
                    unsafe { gpu.dtoh(ptr(&b), &mut vb) }?;
                    let differing = va.iter().zip(&vb).filter(|(x, y)| x != y).count();
                    // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
                    // GPU.
                    let us = self.time(|| unsafe { gpu.qdequant_with(&q, ptr(&b), how) }.map_err(kerr))?;
                    self.push_exact(
                        &format!("expand {fmt} {label}"),
                        format!("{n} x {k}"),
                        differing,
                        n * k,
                        us,
                        bytes,
                    );
                }
            }
        }
        Ok(())
    }

    fn quant_linear(&mut self) -> Result<()> {
        // (rows, out, in): V2-Lite q_proj / o_proj and V3 q_b_proj / kv_a at decode sizes, plus a
        // split-K-free 100-row case and prefill-sized expansions.
        let shapes: &[(usize, usize, usize)] = if self.quick {
            &[(1, 256, 256), (40, 136, 384), (300, 256, 256)]
        } else {
            &[
                (1, 3072, 2048),
                (16, 2048, 2048),
                (64, 24576, 1536),
                (64, 576, 7168),
                (100, 7168, 2048),
                (256, 2048, 2048),
                (4096, 24576, 1536),
            ]
        };
        for (fmt, make) in FORMATS {
            for &(rows, n, k) in shapes {
                let w = make(&mut self.rng, n, k);
                let wc = self.cpu.load_linear(&[w.source()])?;
                let wg = self.cu.load_linear(&[w.source()])?;
                ensure!(wg.quant().is_some(), "linear {fmt} {n}x{k}: the loader expanded it to bf16");
                let (err, us, check) = self.compare_linear(&wc, &wg, rows, k, n)?;
                let bytes = (n * k) as f64 * w.bytes_per_value() + (rows * k * 2 + rows * n * 4) as f64;
                let flops = 2.0 * (rows * n * k) as f64;
                let ceil = if rows > cleave_engine::backend::cuda::QGEMM_MAX_ROWS { Ceiling::Tc } else { Ceiling::Mem };
                let note = if check < rows { format!(" ({check} rows checked)") } else { String::new() };
                self.push(
                    &format!("linear {fmt}"),
                    format!("{rows} x {k} -> {n}{note}"),
                    err,
                    1e-2,
                    us,
                    bytes,
                    flops,
                    ceil,
                );
            }
        }
        Ok(())
    }

    fn quant_experts(&mut self) -> Result<()> {
        let (e, h, i, top) = if self.quick { (8, 256, 128, 3) } else { (64, 2048, 1408, 6) };
        // 600 quick rows average 225 per expert: the AWQ prefill expansion runs (CLEAVE_AWQ_PREFILL);
        // 24 average 9, where 16-row AWQ tiles leave the experts' last 1-8 rows to half tiles.
        let sizes: &[usize] = if self.quick { &[1, 5, 24, 100, 600] } else { &[1, 16, 64, 256, 4096] };
        for (fmt, make) in FORMATS {
            let layers = RandomQuant::experts(&mut self.rng, make, e, h, i);
            let sources = RandomQuant::expert_sources(&layers);
            let ec = self.cpu.load_experts(&sources, 0, 0)?;
            let eg = self.cu.load_experts(&sources, 0, 0)?;
            ensure!(eg.quant().is_some(), "moe_experts {fmt}: the loader expanded them to bf16");
            let shape = ExpertShape { e, h, i, top, shared: 0, bytes_per_param: layers[0][0].bytes_per_value() };
            for &n in sizes {
                self.check_experts(&format!("moe_experts {fmt}"), &ec, &eg, shape, n)?;
            }
            let on = self.cu.variants();
            // Half tiles are a persistent-kernel split: the tiled variant has none to compare.
            if fmt.starts_with("awq") && matches!(on.qgemm, QuantGemm::Persistent(_)) {
                // Every row with the half tiles on the 8-row kernel against 16-row tiles alone.
                let off = ("16-row tiles alone", Variants { qgemm_halves: None, ..on });
                let halves = [(format!("moe_experts {fmt} half tiles"), Variants { qgemm_halves: Some(0), ..on })];
                self.variants_agree(&eg, shape, if self.quick { 24 } else { 96 }, off, &halves)?;
            }
            self.shared_experts(&format!("moe_experts {fmt} shared"), &sources, shape, &[1, 64, 4096])?;
        }
        Ok(())
    }
}
