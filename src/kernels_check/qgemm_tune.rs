//! The persistent compressed decode GEMM (`Gpu::qgemm_persistent`) in every compiled shape against
//! the tiled kernel (`Gpu::qgemm`) at DeepSeek decode shapes: the routed experts (V2-Lite and V3,
//! 16 and 64 tokens) and the dense linears (1, 16 and 64 rows, split over the input channels as
//! the backend splits them). Weights are random, packed on the host for a few experts and copied
//! to the rest. AWQ outputs are compared with the tiled kernel's (the same exact arithmetic); FP8
//! outputs, whose activations are quantized here, with the first persistent shape's. Times are
//! CUDA-event medians; HBM shares count the compressed bytes of the matrices read.

use anyhow::Result;
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::{Fp8Order, QGemm, QPersist, QWeights};
use cleave_kernels::quant::{pack, QFormat, QShape};
use cleave_kernels::{ptr, Gpu};

use super::moe_tune::DecodeTiles;
use super::ops::{kerr, Ctx};
use super::{experts_touched, hbm_ceiling, rel_err, Ceiling};

/// A random compressed stack on the device (the buffers behind a [`QWeights`]).
struct Synthetic {
    words: CudaSlice<u32>,
    scales: CudaSlice<u8>,
    zeros: CudaSlice<u32>,
    shape: QShape,
}

impl Synthetic {
    /// `experts` matrices `[n, k]`, `distinct` of them packed from random values and the others
    /// copies of those.
    fn new(g: &Gpu, shape: QShape, distinct: usize, seed: u64) -> Result<Self> {
        let per = (shape.words_per_matrix(), shape.scales_per_matrix() * shape.format.scale_bytes());
        let zw = shape.zero_words_per_matrix();
        let words = g.alloc::<u32>(shape.experts * per.0)?;
        let scales = g.alloc::<u8>(shape.experts * per.1)?;
        let zeros = g.alloc::<u32>((shape.experts * zw).max(1))?;
        let one = QShape { experts: 1, ..shape };
        let base = (3.0 / shape.k as f32).sqrt();
        for d in 0..distinct.min(shape.experts) {
            let h = |a: usize, b: usize, salt: u64| mix(seed ^ (d as u64) << 40 ^ (a as u64) << 20 ^ b as u64 ^ salt);
            let p = pack(
                &one,
                |c, kk| match shape.format {
                    QFormat::AwqInt4 => (h(c, kk, 1) % 16) as u8,
                    // any e4m3 byte but the NaNs
                    QFormat::Fp8E4m3 => match (h(c, kk, 1) % 256) as u8 {
                        b if b & 0x7f == 0x7f => b & 0xfe,
                        b => b,
                    },
                },
                |grp, c| {
                    let u = (h(grp, c, 3) % 1000) as f32 / 1000.0 + 0.5;
                    match shape.format {
                        QFormat::AwqInt4 => half::f16::from_f32(base / 7.5 * u).to_f32(),
                        QFormat::Fp8E4m3 => base / 240.0 * u,
                    }
                },
                |grp, c| (5 + h(grp, c, 4) % 6) as u8,
            )
            .expect("f16 scales");
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { g.htod(&p.words, ptr(&words) + (d * per.0 * 4) as u64) }?;
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { g.htod(&p.scales, ptr(&scales) + (d * per.1) as u64) }?;
            if zw > 0 {
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { g.htod(&p.zeros, ptr(&zeros) + (d * zw * 4) as u64) }?;
            }
            g.sync()?;
        }
        for e in distinct..shape.experts {
            let d = e % distinct;
            // SAFETY: source and destination are distinct live allocations of this GPU of at least the
            // bytes copied.
            unsafe { g.dtod(ptr(&words) + (e * per.0 * 4) as u64, ptr(&words) + (d * per.0 * 4) as u64, per.0 * 4) }?;
            // SAFETY: source and destination are distinct live allocations of this GPU of at least the
            // bytes copied.
            unsafe { g.dtod(ptr(&scales) + (e * per.1) as u64, ptr(&scales) + (d * per.1) as u64, per.1) }?;
            if zw > 0 {
                // SAFETY: source and destination are distinct live allocations of this GPU of at least the
                // bytes copied.
                unsafe { g.dtod(ptr(&zeros) + (e * zw * 4) as u64, ptr(&zeros) + (d * zw * 4) as u64, zw * 4) }?;
            }
        }
        Ok(Synthetic { words, scales, zeros, shape })
    }

    fn view(&self) -> QWeights {
        QWeights { shape: self.shape, words: ptr(&self.words), scales: ptr(&self.scales), zeros: ptr(&self.zeros) }
    }

    /// Bytes the GPU reads for one matrix.
    fn matrix_bytes(&self) -> f64 {
        (self.shape.bytes() / self.shape.experts) as f64
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// One GEMM of a case: its operands and the f32 or bf16 output it writes.
struct Case<'a> {
    label: String,
    w: &'a Synthetic,
    g: QGemm,
    /// Expert cases: `g` with the same sorted rows in 8-row tiles (the 8-row shapes). Dense GEMMs
    /// cut their rows by the shape's own tile.
    tiles8: Option<QGemm>,
    /// AWQ expert cases: the 16-row tiles and the half tiles of 8 (`moe_align` with halves), run
    /// one after the other on the default 16- and 8-row shapes as the backend runs them.
    halves: Option<[QGemm; 2]>,
    out_words: usize,
    /// Rows of a dense GEMM (split over the input channels); 0 for expert tiles.
    dense_rows: usize,
    bytes: f64,
}

impl Ctx<'_> {
    pub fn qgemm_tune(&mut self) -> Result<()> {
        let formats = [(QFormat::AwqInt4, 64), (QFormat::AwqInt4, 128), (QFormat::Fp8E4m3, 128)];
        let mut summary = Vec::new();
        for (format, group) in formats {
            let tag = format!("{} g{group}", format.name());
            self.qgemm_tune_experts(format, group, &tag, &mut summary)?;
            self.qgemm_tune_dense(format, group, &tag, &mut summary)?;
        }
        println!("qgemm_tune: tiled kernel against the fastest persistent shape (BN/BK/stages) per case");
        summary.iter().for_each(|l| println!("{l}"));
        Ok(())
    }

    fn qgemm_tune_experts(
        &mut self,
        format: QFormat,
        group: usize,
        tag: &str,
        summary: &mut Vec<String>,
    ) -> Result<()> {
        let g = self.cu.gpu();
        // (name, experts, hidden, moe_intermediate, top_k)
        let shapes: &[(&str, usize, usize, usize, usize)] = if self.quick {
            &[("small", 8, 256, 128, 3)]
        } else {
            // V3 with 64 experts: the 61-layer one-GPU share's layers (8 rows an expert at 64 tokens).
            &[("V2-Lite", 64, 2048, 1408, 6), ("V3", 256, 7168, 2048, 8), ("V3 share", 64, 7168, 2048, 8)]
        };
        for &(name, e, h, i, top_k) in shapes {
            let gu = Synthetic::new(g, QShape { format, experts: e, n: 2 * i, k: h, group }, 4, 1)?;
            let dn = Synthetic::new(g, QShape { format, experts: e, n: h, k: i, group }, 4, 2)?;
            for &b in if self.quick { &[4usize][..] } else { &[16, 64][..] } {
                let a = b * top_k;
                let ids = self.rng.routes(b, e, top_k);
                let touched = experts_touched(&ids);
                let dt = DecodeTiles::new(g, &ids, e, top_k, false)?;
                let (sorted, tiles, meta, max_tiles) = (&dt.sorted, &dt.tiles, &dt.meta, dt.max_tiles);
                let (tiles8, meta8, max_tiles8) = dt.cut(g, 8)?;
                // Half tiles run only for AWQ (the 8-row kernel's format).
                let awq = format == QFormat::AwqInt4;
                let dh = awq.then(|| DecodeTiles::new(g, &ids, e, top_k, true)).transpose()?;
                let x = Activations::new(g, b, h, 9)?;
                let act = Activations::new(g, a, i, 10)?;
                let base = QGemm {
                    silu: true,
                    x: 0,
                    x_scales: 0,
                    rowidx: ptr(sorted),
                    y: 0,
                    tiles: ptr(tiles),
                    meta: ptr(meta),
                    max_tiles,
                    rows: a,
                    bm: 16,
                    splits: 1,
                    streamk: false,
                };
                let down = QGemm { silu: false, rowidx: 0, ..base };
                let eight =
                    |g: QGemm| QGemm { tiles: ptr(&tiles8), meta: ptr(&meta8), max_tiles: max_tiles8, bm: 8, ..g };
                // The sort places rows as without half tiles (stably, by expert), so `g`'s rows
                // (dt.sorted) serve both lists.
                let halves = |g: QGemm| {
                    let dh = dh.as_ref()?;
                    let main = QGemm { tiles: ptr(&dh.tiles), meta: ptr(&dh.meta), max_tiles: dh.max_tiles, ..g };
                    let half = QGemm {
                        tiles: ptr(dh.halves.as_ref()?),
                        meta: ptr(&dh.meta) + 4,
                        max_tiles: dh.max_halves,
                        bm: 8,
                        ..main
                    };
                    Some([main, half])
                };
                let label = format!("{name} {b} tok, {e} experts, {touched} used");
                let cases = [
                    Case {
                        label: format!("{label}, gate_up {}x{h}", 2 * i),
                        w: &gu,
                        g: QGemm { ..base },
                        tiles8: Some(eight(base)),
                        halves: halves(base),
                        out_words: a * i / 2,
                        dense_rows: 0,
                        bytes: touched as f64 * gu.matrix_bytes(),
                    },
                    Case {
                        label: format!("{label}, down {h}x{i}"),
                        w: &dn,
                        g: down,
                        tiles8: Some(eight(down)),
                        halves: halves(down),
                        out_words: a * h,
                        dense_rows: 0,
                        bytes: touched as f64 * dn.matrix_bytes(),
                    },
                ];
                for (c, acts) in cases.iter().zip([&x, &act]) {
                    self.qgemm_tune_case(c, acts, tag, summary)?;
                }
            }
        }
        Ok(())
    }

    fn qgemm_tune_dense(&mut self, format: QFormat, group: usize, tag: &str, summary: &mut Vec<String>) -> Result<()> {
        let g = self.cu.gpu();
        let shapes: &[(&str, usize, usize)] = if self.quick {
            &[("small", 256, 384)]
        } else {
            &[
                ("V3 q_a", 1536, 7168),
                ("V3 q_b", 24576, 1536),
                ("V3 kv_a", 576, 7168),
                ("V3 o_proj", 7168, 16384),
                ("V3 mlp gate/up", 36864, 7168),
                ("V3 mlp down", 7168, 18432),
                ("V2-Lite q", 3072, 2048),
                ("V2-Lite o", 2048, 2048),
            ]
        };
        for &(name, n, k) in shapes {
            let w = Synthetic::new(g, QShape { format, experts: 1, n, k, group }, 1, 3)?;
            for &rows in if self.quick { &[1usize, 20][..] } else { &[1, 16, 64][..] } {
                let x = Activations::new(g, rows, k, 11)?;
                let c = Case {
                    label: format!("{name} {rows} rows, {n}x{k}"),
                    w: &w,
                    g: QGemm::dense(rows, 0),
                    tiles8: None,
                    halves: None,
                    out_words: rows * n,
                    dense_rows: rows,
                    bytes: w.matrix_bytes(),
                };
                self.qgemm_tune_case(&c, &x, tag, summary)?;
            }
        }
        Ok(())
    }

    /// Runs one case on the tiled kernel, then on every compiled persistent shape that takes it.
    fn qgemm_tune_case(&mut self, c: &Case<'_>, x: &Activations, tag: &str, summary: &mut Vec<String>) -> Result<()> {
        let g = self.cu.gpu();
        let w = c.w.view();
        let n = w.shape.n;
        let out = g.alloc::<u32>(c.out_words)?;
        let read = |o: &CudaSlice<u32>| -> Result<Vec<f32>> {
            let mut v = vec![0u32; c.out_words];
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { g.dtoh(ptr(o), &mut v) }?;
            Ok(if c.g.silu {
                v.iter().flat_map(|&x| [f32::from_bits(x << 16), f32::from_bits(x & 0xffff0000)]).collect()
            } else {
                v.iter().map(|&x| f32::from_bits(x)).collect()
            })
        };
        let rows = c.g.rows;
        // The tiled kernel on bf16 activations, split over the input channels as the backend does.
        let tiled = |splits: usize, part: u64| -> cleave_engine::Result<()> {
            let y = if splits > 1 { part } else { ptr(&out) };
            // SAFETY: the weights, the input rows, the tile lists and the outputs named in the launch are
            // live buffers of this GPU sized for these rows and this weight.
            unsafe { g.qgemm(&w, &QGemm { x: x.bf16(), y, splits, ..c.g }) }.map_err(kerr)?;
            if splits > 1 {
                // SAFETY: the split partials and the outputs are live buffers of this GPU of these rows and
                // columns.
                unsafe { g.qgemm_reduce(part, ptr(&out), splits, rows, n, None) }.map_err(kerr)?;
            }
            Ok(())
        };
        let shapes: Vec<QPersist> = QPersist::compiled(w.shape.format)
            .filter(|cfg| cfg.takes(w.shape.format, w.shape.group) && (c.dense_rows > 0 || cfg.bm <= 16))
            .filter(|cfg| cfg.runs_with(g.has_wgmma()))
            .collect();
        let (t_splits, p_splits) = if c.dense_rows > 0 {
            let p = shapes.iter().map(|&cfg| g.qgp_splits(&w, rows, cfg)).collect::<Result<Vec<_>, _>>()?;
            (g.qgemm_splits(&w, rows, c.g.bm), p)
        } else {
            (1, vec![1; shapes.len()])
        };
        let most = p_splits.iter().copied().chain([t_splits]).max().unwrap_or(1);
        let part = g.alloc::<f32>((most * rows * n).max(1))?;
        // SAFETY: the address and byte count lie within one live allocation of this GPU.
        unsafe { g.memset(ptr(&out), 0xff, c.out_words * 4) }?;
        tiled(t_splits, ptr(&part))?;
        let tiled_out = read(&out)?;
        let t_us = self.time(|| tiled(t_splits, ptr(&part)))?;
        let ok = if tiled_out.iter().all(|v| v.is_finite()) { 0.0 } else { f64::INFINITY };
        let label = format!("{} ({t_splits} splits)", c.label);
        self.push(&format!("qg tiled {tag}"), label, ok, 1e-2, t_us, c.bytes, 0.0, Ceiling::Mem);
        let fp8 = w.shape.format == QFormat::Fp8E4m3;
        let mut want: Option<Vec<f32>> = (!fp8).then_some(tiled_out);
        // The fastest run within tolerance: its time and its shape as the summary names it.
        let mut best: Option<(f64, String)> = None;
        // Each shape with whole items per block (split-K for dense GEMMs, as the backend picks)
        // and with stream-K (one split, equal runs of k-tiles per block).
        let runs = shapes.iter().zip(&p_splits).flat_map(|(&cfg, &splits)| [(cfg, splits, false), (cfg, 1, true)]);
        for (cfg, splits, streamk) in runs {
            let run = || -> cleave_engine::Result<()> {
                let y = if splits > 1 { ptr(&part) } else { ptr(&out) };
                let (xp, xs) = if fp8 { (x.fp8(), x.fp8_scales()) } else { (x.bf16(), 0) };
                let base = match c.tiles8 {
                    Some(t) if cfg.bm == 8 => t,
                    _ => c.g,
                };
                let run = QGemm { x: xp, x_scales: xs, y, splits, streamk, ..base };
                // SAFETY: the weights, the input rows (and FP8 scales), the tile lists and the outputs named
                // in the launch are live buffers of this GPU sized for these rows and this weight.
                unsafe { g.qgemm_persistent(&w, &run, cfg, None) }.map_err(kerr)?;
                if splits > 1 {
                    // SAFETY: the split partials and the outputs are live buffers of this GPU of these rows and
                    // columns.
                    unsafe { g.qgemm_reduce(ptr(&part), ptr(&out), splits, rows, n, None) }.map_err(kerr)?;
                }
                Ok(())
            };
            // SAFETY: the address and byte count lie within one live allocation of this GPU.
            unsafe { g.memset(ptr(&out), 0xff, c.out_words * 4) }?;
            run()?;
            let got = read(&out)?;
            let err = match &want {
                Some(v) => rel_err(&got, v),
                None => {
                    want = Some(got);
                    0.0
                }
            };
            let us = self.time(run)?;
            let label =
                if streamk { format!("{} (stream-K)", c.label) } else { format!("{} ({splits} splits)", c.label) };
            self.push(&format!("qgp {tag} {cfg}"), label, err, 1e-3, us, c.bytes, 0.0, Ceiling::Mem);
            if err <= 1e-3 && best.as_ref().is_none_or(|(b, _)| us < *b) {
                best = Some((us, format!("{cfg}{}", if streamk { " stream-K" } else { "" })));
            }
        }
        if let Some(pair) = c.halves {
            // The backend's two launches: 16-row tiles, then the half tiles on the 8-row kernel.
            let wgmma = g.has_wgmma();
            let shapes = [16, 8].map(|bm| QPersist::default_for(w.shape.format, w.shape.group, bm, wgmma));
            if let [Some(s16), Some(s8)] = shapes {
                let run = || -> cleave_engine::Result<()> {
                    for (cfg, base) in [(s16, pair[0]), (s8, pair[1])] {
                        let run = QGemm { x: x.bf16(), y: ptr(&out), streamk: true, ..base };
                        // SAFETY: the weights, the input rows (and FP8 scales), the tile lists and the outputs named
                        // in the launch are live buffers of this GPU sized for these rows and this weight.
                        unsafe { g.qgemm_persistent(&w, &run, cfg, None) }.map_err(kerr)?;
                    }
                    Ok(())
                };
                // SAFETY: the address and byte count lie within one live allocation of this GPU.
                unsafe { g.memset(ptr(&out), 0xff, c.out_words * 4) }?;
                run()?;
                let got = read(&out)?;
                let err = want.as_ref().map_or(0.0, |v| rel_err(&got, v));
                let us = self.time(run)?;
                let label = format!("{} (stream-K)", c.label);
                self.push(&format!("qgp {tag} {s16}+{s8}"), label, err, 1e-3, us, c.bytes, 0.0, Ceiling::Mem);
                if err <= 1e-3 && best.as_ref().is_none_or(|(b, _)| us < *b) {
                    // Both shapes without a space: tune_ab (kernels/bench/lib.sh) reads one word.
                    best = Some((us, format!("{s16}+{s8} stream-K")));
                }
            }
        }
        let ceiling = hbm_ceiling(&self.cu.gpu().name);
        let hbm = |t: f64| 100.0 * c.bytes / (t * 1e-6) / ceiling;
        let best =
            best.map_or("none passed".to_string(), |(us, shape)| format!("{shape} {us:.1} us ({:.1}% HBM)", hbm(us)));
        summary.push(format!("  {tag} {}: tiled {t_us:.1} us ({:.1}% HBM), persistent {best}", c.label, hbm(t_us)));
        Ok(())
    }
}

/// Random bf16 activations `[rows, k]` and their FP8 quantization for the persistent kernel.
struct Activations {
    bf16: CudaSlice<u16>,
    fp8: CudaSlice<u32>,
    scales: CudaSlice<f32>,
}

impl Activations {
    fn new(g: &Gpu, rows: usize, k: usize, seed: u64) -> Result<Self> {
        let bf16 = g.alloc::<u16>(rows * k)?;
        // SAFETY: the destination is a live buffer of this GPU of n bf16.
        unsafe { g.fill_uniform_bf16(ptr(&bf16), rows * k, seed, -1.0, 1.0) }?;
        let fp8 = g.alloc::<u32>((rows * k).div_ceil(4))?;
        let scales = g.alloc::<f32>((rows * k.div_ceil(128)).max(1))?;
        if k.is_multiple_of(128) {
            // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
            // for these rows and channels.
            unsafe { g.act_quant_fp8_mma(Fp8Order::Mma, ptr(&bf16), true, rows, k, ptr(&fp8), ptr(&scales)) }?;
        }
        Ok(Activations { bf16, fp8, scales })
    }
    fn bf16(&self) -> u64 {
        ptr(&self.bf16)
    }
    fn fp8(&self) -> u64 {
        ptr(&self.fp8)
    }
    fn fp8_scales(&self) -> u64 {
        ptr(&self.scales)
    }
}
