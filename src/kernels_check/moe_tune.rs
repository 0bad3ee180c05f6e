//! The persistent decode grouped GEMM (`GemmKernel::Persistent`) in every compiled shape
//! against gg16 v2 (`GemmKernel::Tiled { v2: true, bm: 16 }`, itself checked against the CPU in the experts
//! stage) at DeepSeek decode shapes: relative error of each output against gg16 v2's, median time,
//! and the HBM share of the weight bytes of the experts the tokens touched. Every shape runs with
//! the default prefetch distance; the fastest one per case also with other distances. An odd shape
//! (partial column blocks and k-tiles, several tiles per expert) checks the bounds.

use anyhow::Result;
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::{Align, GemmKernel, GroupedGemm, PersistentGemm};
use cleave_kernels::{ptr, Gpu};

use super::ops::{kerr, Ctx};
use super::{experts_touched, hbm_ceiling, rel_err, Ceiling};

/// Prefetch distances also tried with the fastest shape of each case.
const OTHER_PREFETCH: [usize; 3] = [0, 2, 8];

impl Ctx<'_> {
    pub fn moe_tune(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        // (name, experts, hidden, moe_intermediate)
        let shapes: &[(&str, usize, usize, usize)] = if self.quick {
            &[("small", 8, 256, 128), ("odd", 8, 200, 72)]
        } else {
            &[("V2-Lite", 64, 2048, 1408), ("V3", 256, 7168, 2048), ("odd", 8, 200, 72)]
        };
        let top_k = 6;
        let mut summary = Vec::new();
        for &(shape_name, e, h, i) in shapes {
            let batches: &[usize] = if self.quick || shape_name == "odd" { &[4, 64] } else { &[1, 16, 64] };
            let gate_up = g.alloc::<u16>(e * 2 * i * h)?;
            let down = g.alloc::<u16>(e * h * i)?;
            // SAFETY: the destination is a live buffer of this GPU of n bf16.
            unsafe { g.fill_uniform_bf16(ptr(&gate_up), e * 2 * i * h, 7, -0.05, 0.05) }?;
            // SAFETY: the destination is a live buffer of this GPU of n bf16.
            unsafe { g.fill_uniform_bf16(ptr(&down), e * h * i, 8, -0.05, 0.05) }?;
            for &b in batches {
                let a = b * top_k;
                let ids = self.rng.routes(b, e, top_k);
                let dt = DecodeTiles::new(g, &ids, e, top_k, false)?;
                let (sorted, tiles, meta, max_tiles) = (&dt.sorted, &dt.tiles, &dt.meta, dt.max_tiles);
                let mut n_tiles = [0i32];
                // SAFETY: the source is a live allocation of this GPU holding as many values of the
                // destination's plain numeric type.
                unsafe { g.dtoh(ptr(meta), &mut n_tiles) }?;
                let x = g.alloc::<u16>(b * h)?;
                // SAFETY: the destination is a live buffer of this GPU of n bf16.
                unsafe { g.fill_uniform_bf16(ptr(&x), b * h, 9, -1.0, 1.0) }?;
                let act = g.alloc::<u16>(a * i)?;
                // SAFETY: the destination is a live buffer of this GPU of n bf16.
                unsafe { g.fill_uniform_bf16(ptr(&act), a * i, 10, -1.0, 1.0) }?;
                let touched = experts_touched(&ids);
                // (op, silu, x, rowidx, w, n, k, output u16 words, weight bytes read)
                let (s, guw, dnw) = (ptr(sorted), ptr(&gate_up), ptr(&down));
                let cases = [
                    ("gate_up", true, ptr(&x), s, guw, 2 * i, h, a * i, touched * 2 * i * h * 2),
                    ("down", false, ptr(&act), 0, dnw, h, i, a * h * 2, touched * h * i * 2),
                ];
                for (op, silu, xp, rowidx, wp, n, k, words, bytes) in cases {
                    let out = g.alloc::<u16>(words)?;
                    // bf16 outputs are compared through their bit patterns widened to f32.
                    let read = |o: &CudaSlice<u16>| -> Result<Vec<f32>> {
                        let mut v = vec![0u16; words];
                        // SAFETY: the source is a live allocation of this GPU holding as many values of the
                        // destination's plain numeric type.
                        unsafe { g.dtoh(ptr(o), &mut v) }?;
                        Ok(if silu {
                            v.iter().map(|&x| f32::from_bits((x as u32) << 16)).collect()
                        } else {
                            v.chunks(2).map(|c| f32::from_bits(c[0] as u32 | (c[1] as u32) << 16)).collect()
                        })
                    };
                    let yp = ptr(&out);
                    let gg = GroupedGemm {
                        silu,
                        x: xp,
                        rowidx,
                        w: wp,
                        y: yp,
                        tiles: ptr(tiles),
                        meta: ptr(meta),
                        max_tiles,
                        n,
                        k,
                    };
                    let gg16 = GemmKernel::Tiled { v2: true, bm: 16 };
                    let label = format!("{shape_name} {b} tok, {e}x{n}x{k}, {} tiles, {touched} experts", n_tiles[0]);
                    // SAFETY: the address and byte count lie within one live allocation of this GPU.
                    unsafe { g.memset(yp, 0xff, words * 2) }?;
                    // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
                    // launch are live buffers of this GPU of the sizes it gives.
                    unsafe { g.grouped_gemm(gg16, &gg) }?;
                    let want = read(&out)?;
                    // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
                    // launch are live buffers of this GPU of the sizes it gives.
                    let us = self.time(|| unsafe { g.grouped_gemm(gg16, &gg) }.map_err(kerr))?;
                    let base_err = if want.iter().all(|v| v.is_finite()) { 0.0 } else { f64::INFINITY };
                    self.push(
                        &format!("gg16 v2 {op}"),
                        label.clone(),
                        base_err,
                        1e-2,
                        us,
                        bytes as f64,
                        0.0,
                        Ceiling::Mem,
                    );
                    let run = |ctx: &mut Self, cfg: PersistentGemm| -> Result<f64> {
                        // SAFETY: the address and byte count lie within one live allocation of this GPU.
                        unsafe { g.memset(yp, 0xff, words * 2) }?;
                        // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
                        // launch are live buffers of this GPU of the sizes it gives.
                        unsafe { g.grouped_gemm(GemmKernel::Persistent(cfg), &gg) }?;
                        let err = rel_err(&read(&out)?, &want);
                        // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
                        // launch are live buffers of this GPU of the sizes it gives.
                        let us =
                            ctx.time(|| unsafe { g.grouped_gemm(GemmKernel::Persistent(cfg), &gg) }.map_err(kerr))?;
                        let per_sm = g.persistent_blocks_per_sm(cfg, silu)?;
                        let name = format!("ggp{}/{}/{} pf{} {op}", cfg.bn, cfg.bk, cfg.stages, cfg.prefetch);
                        let shape = format!("{label}, {per_sm}/SM");
                        ctx.push(&name, shape, err, 1e-2, us, bytes as f64, 0.0, Ceiling::Mem);
                        Ok(if err <= 1e-2 { us } else { f64::INFINITY })
                    };
                    let mut best: Option<(f64, PersistentGemm)> = None;
                    // 16-row shapes: the tiles above are aligned by 16 rows.
                    for cfg in PersistentGemm::compiled().filter(|c| c.bm == 16) {
                        let t = run(self, cfg)?;
                        if best.is_none_or(|(bt, _)| t < bt) {
                            best = Some((t, cfg));
                        }
                    }
                    let (mut best_us, mut best_cfg) = best.expect("compiled shapes");
                    if best_us.is_finite() {
                        let first = best_cfg;
                        for prefetch in OTHER_PREFETCH.into_iter().filter(|&p| p != first.prefetch) {
                            let cfg = PersistentGemm { prefetch, ..first };
                            let t = run(self, cfg)?;
                            if t < best_us {
                                (best_us, best_cfg) = (t, cfg);
                            }
                        }
                    }
                    let ceiling = hbm_ceiling(&self.cu.gpu().name);
                    let hbm = |t: f64| 100.0 * bytes as f64 / (t * 1e-6) / ceiling;
                    summary.push(format!(
                        "  {label} {op}: gg16 v2 {us:.1} us ({:.1}% HBM), best ggp{}/{}/{} pf{} {best_us:.1} us ({:.1}% HBM)",
                        hbm(us),
                        best_cfg.bn,
                        best_cfg.bk,
                        best_cfg.stages,
                        best_cfg.prefetch,
                        hbm(best_us)
                    ));
                }
            }
        }
        println!("moe_tune: the fastest persistent grouped GEMM per case (shape BN/BK/stages, prefetch)");
        summary.iter().for_each(|l| println!("{l}"));
        Ok(())
    }
}

/// Random routing's expert row tiles of 16 on the device, as `moe_align` leaves them (the ids and
/// the inverse map it wrote live as long as the tiles); with `halves`, each expert's last tile of
/// at most 8 rows in `halves` instead (its count in `meta[1]`).
pub(super) struct DecodeTiles {
    _ids: CudaSlice<u32>,
    pub sorted: CudaSlice<i32>,
    _inv: CudaSlice<i32>,
    pub tiles: CudaSlice<i32>,
    pub halves: Option<CudaSlice<i32>>,
    pub meta: CudaSlice<i32>,
    pub max_tiles: usize,
    pub max_halves: usize,
}

impl DecodeTiles {
    pub fn new(g: &Gpu, ids: &[u32], experts: usize, top_k: usize, halves: bool) -> Result<Self> {
        let a = ids.len();
        let id_buf = g.alloc::<u32>(a)?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { g.htod(ids, ptr(&id_buf)) }?;
        let max_tiles = Gpu::moe_max_tiles(a, experts, 16);
        let max_halves = if halves { Gpu::moe_max_halves(a, experts) } else { 0 };
        let (sorted, inv) = (g.alloc::<i32>(a)?, g.alloc::<i32>(a)?);
        let (tiles, meta) = (g.alloc::<i32>(3 * max_tiles)?, g.alloc::<i32>(2)?);
        let halves = if halves { Some(g.alloc::<i32>(3 * max_halves.max(1))?) } else { None };
        // SAFETY: the assignment ids and the sort's outputs (sized for the most tiles these
        // assignments can make) are live buffers of this GPU.
        unsafe {
            g.moe_align(&Align {
                ids: ptr(&id_buf),
                assignments: a,
                top_k,
                experts,
                first: 0,
                bm: 16,
                sorted_tok: ptr(&sorted),
                inv: ptr(&inv),
                tiles: ptr(&tiles),
                halves: halves.as_ref().map_or(0, ptr),
                meta: ptr(&meta),
                row_expert: 0,
            })
        }?;
        Ok(DecodeTiles { _ids: id_buf, sorted, _inv: inv, tiles, halves, meta, max_tiles, max_halves })
    }

    /// The same sorted rows in tiles of at most `bm` (< 16) rows: each 16-row tile cut in order.
    pub fn cut(&self, g: &Gpu, bm: usize) -> Result<(CudaSlice<i32>, CudaSlice<i32>, usize)> {
        let mut meta = [0i32];
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { g.dtoh(ptr(&self.meta), &mut meta) }?;
        let mut tiles = vec![0i32; 3 * meta[0] as usize];
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { g.dtoh(ptr(&self.tiles), &mut tiles) }?;
        let cut: Vec<i32> = tiles
            .chunks(3)
            .flat_map(|t| (0..t[2]).step_by(bm).flat_map(move |j| [t[0], t[1] + j, (t[2] - j).min(bm as i32)]))
            .collect();
        let max_tiles = cut.len() / 3;
        let (tiles, meta) = (g.alloc::<i32>(cut.len().max(3))?, g.alloc::<i32>(1)?);
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { g.htod(&cut, ptr(&tiles)) }?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { g.htod(&[max_tiles as i32], ptr(&meta)) }?;
        Ok((tiles, meta, max_tiles))
    }
}
