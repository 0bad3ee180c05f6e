//! Expert routing (`moe_route`) against the CPU backend, the assignment sort (`moe_align`)
//! against its host reference, exactly (each expert's rows in assignment order), and the two in
//! one block (`moe_route_align`) against both kernels' own results, exactly.

use anyhow::Result;
use cleave_engine::backend::{Backend, RouterParams};
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::{align_reference, Align, Route};
use cleave_kernels::{ptr, Gpu};

use super::ops::{kerr, Ctx};
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    pub fn router(&mut self) -> Result<()> {
        let odd = (
            "odd",
            RouterParams {
                n_experts: 12,
                n_group: 4,
                topk_group: 2,
                top_k: 4,
                norm_topk_prob: true,
                scaling: 2.5,
                shared: 0,
            },
        );
        let [lite, v3, v3_64] = models();
        let cases = [lite, v3, v3_64, odd];
        let sizes: &[usize] = if self.quick { &[7] } else { &[1, 64, 4096] };
        for (label, p) in cases {
            for &n in sizes {
                let logits = self.rng.vec(n * p.n_experts, 4.0);
                let bias = self.rng.vec(p.n_experts, 0.3);
                let (lc, lg) = self.up(&logits, n, p.n_experts)?;
                let (bc, bg) = self.up(&bias, 1, p.n_experts)?;
                let want = self.cpu.moe_route(&lc, &bc, p)?;
                let (ids, w) = self.cu.routing_to_host(&self.cu.moe_route(&lg, &bg, p)?)?;
                // Per token and expert (shared ones included), the weight given.
                let (k, width) = (p.top_k + p.shared, p.n_experts + p.shared);
                let dense = |ids: &[u32], w: &[f32]| {
                    let mut d = vec![0f32; n * width];
                    for (i, (&e, &x)) in ids.iter().zip(w).enumerate() {
                        d[(i / k) * width + (e as usize).min(width - 1)] += x;
                    }
                    d
                };
                let err = rel_err(&dense(&ids, &w), &dense(&want.ids, &want.weights));
                let us = self.time(|| self.cu.moe_route(&lg, &bg, p).map(drop))?;
                self.push(
                    "moe_route",
                    format!("{label}: {n} tokens, {} experts, top {}, {} shared", p.n_experts, p.top_k, p.shared),
                    err,
                    1e-3,
                    us,
                    (n * p.n_experts * 4) as f64,
                    0.0,
                    Ceiling::Mem,
                );
            }
        }
        Ok(())
    }

    /// `moe_route_align` at the batch sizes it takes (the one-warp sort up to 32 assignments, the
    /// block's above): its ids and weights equal `moe_route`'s bit for bit, its sort equals the
    /// host reference on those ids.
    pub fn route_align(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        let [lite, v3, v3_64] = models();
        // (model, local experts, first local expert, bm, half tiles)
        let cases = [
            (lite, 66, 0, 8, false),
            (v3, 257, 0, 16, false),
            (("V3 rank 2 of EP4", v3.1), 64, 128, 16, false),
            (v3_64, 65, 0, 16, false),
            (v3_64, 65, 0, 16, true),
        ];
        let sizes: &[usize] = if self.quick { &[1, 5] } else { &[1, 3, 4, 16, 64] };
        for ((label, p), local, first, bm, halves) in cases {
            let (experts, top_k) = (p.n_experts, p.top_k);
            for &n in sizes {
                let k = top_k + p.shared;
                let a = n * k;
                let (logits, bias) = (self.rng.vec(n * experts, 4.0), self.rng.vec(experts, 0.3));
                let (lg, bg) = (g.alloc::<f32>(logits.len()).map_err(kerr)?, g.alloc::<f32>(experts).map_err(kerr)?);
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { g.htod(&logits, ptr(&lg)) }.map_err(kerr)?;
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { g.htod(&bias, ptr(&bg)) }.map_err(kerr)?;
                // moe_route's results (0), moe_route_align's (1).
                let (ids0, w0) = (g.alloc::<u32>(a).map_err(kerr)?, g.alloc::<f32>(a).map_err(kerr)?);
                let (ids1, w1) = (g.alloc::<u32>(a).map_err(kerr)?, g.alloc::<f32>(a).map_err(kerr)?);
                let route = |ids: u64, wts: u64| Route {
                    logits: ptr(&lg),
                    bias: ptr(&bg),
                    ids,
                    wts,
                    n,
                    experts,
                    n_group: p.n_group,
                    topk_group: p.topk_group,
                    top_k,
                    shared: p.shared,
                    norm: p.norm_topk_prob,
                    scaling: p.scaling,
                };
                // SAFETY: the router's logits, bias, and the id and weight outputs are live buffers of this
                // GPU sized for these tokens and experts.
                unsafe { g.moe_route(&route(ptr(&ids0), ptr(&w0))) }.map_err(kerr)?;
                let sort = SortBufs::new(g, a, local, bm)?;
                let align = sort.align(ptr(&ids1), a, k, local, first, bm, halves);
                let fused = route(ptr(&ids1), ptr(&w1));
                // SAFETY: the routing's and the sort's buffers are live buffers of this GPU sized for these
                // tokens, experts and tiles.
                unsafe { g.moe_route_align(&fused, &align) }.map_err(kerr)?;
                let (mut want_ids, mut want_w, mut ids, mut w) =
                    (vec![0u32; a], vec![0f32; a], vec![0u32; a], vec![0f32; a]);
                // SAFETY: the source is a live allocation of this GPU holding as many values of the
                // destination's plain numeric type.
                unsafe { g.dtoh(ptr(&ids0), &mut want_ids) }.map_err(kerr)?;
                // SAFETY: the source is a live allocation of this GPU holding as many values of the
                // destination's plain numeric type.
                unsafe { g.dtoh(ptr(&w0), &mut want_w) }.map_err(kerr)?;
                // SAFETY: the source is a live allocation of this GPU holding as many values of the
                // destination's plain numeric type.
                unsafe { g.dtoh(ptr(&ids1), &mut ids) }.map_err(kerr)?;
                // SAFETY: the source is a live allocation of this GPU holding as many values of the
                // destination's plain numeric type.
                unsafe { g.dtoh(ptr(&w1), &mut w) }.map_err(kerr)?;
                let (sort_differing, sort_total) = sort.against_reference(g, &align, &ids)?;
                let differing = ids.iter().zip(&want_ids).filter(|(x, y)| x != y).count()
                    + w.iter().zip(&want_w).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
                    + sort_differing;
                // SAFETY: the routing's and the sort's buffers are live buffers of this GPU sized for these
                // tokens, experts and tiles.
                let us = self.time(|| unsafe { g.moe_route_align(&fused, &align) }.map_err(kerr))?;
                let half = if halves { format!(" and {}", bm / 2) } else { String::new() };
                self.push_exact(
                    "moe_route_align",
                    format!("{label}: {n} tokens, {local} local experts from {first}, tiles of {bm}{half}"),
                    differing,
                    2 * a + sort_total,
                    us,
                    (n * experts * 4) as f64,
                );
            }
        }
        Ok(())
    }

    /// `moe_align` on random routes (with the shared experts each token also takes) at decode and
    /// prefill sizes, over all experts and over one rank's share of them.
    pub fn align(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        // (label, routed experts, top_k, shared, local experts, first local expert, bm, half tiles)
        let cases = [
            ("V2-Lite", 64, 6, 2, 66, 0, 8, false),
            ("V2-Lite", 64, 6, 2, 66, 0, 16, false),
            ("V2-Lite", 64, 6, 2, 66, 0, 16, true),
            ("V3", 256, 8, 1, 257, 0, 16, false),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 16, false),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 16, true),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 64, false),
        ];
        let sizes: &[usize] = if self.quick { &[1, 37] } else { &[1, 8, 64, 256, 4096] };
        for (label, routed, top_k, shared, experts, first, bm, halves) in cases {
            for &n in sizes {
                let k = top_k + shared;
                let ids: Vec<u32> = self
                    .rng
                    .routes(n, routed, top_k)
                    .chunks(top_k)
                    .flat_map(|r| r.iter().copied().chain((0..shared).map(|s| (routed + s) as u32)))
                    .collect();
                let a = ids.len();
                let id_buf = g.alloc::<u32>(a).map_err(kerr)?;
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { g.htod(&ids, ptr(&id_buf)) }.map_err(kerr)?;
                let sort = SortBufs::new(g, a, experts, bm)?;
                let align = sort.align(ptr(&id_buf), a, k, experts, first, bm, halves);
                // SAFETY: the assignment ids and the sort's outputs (sized for the most tiles these
                // assignments can make) are live buffers of this GPU.
                unsafe { g.moe_align(&align) }.map_err(kerr)?;
                let (differing, total) = sort.against_reference(g, &align, &ids)?;
                // SAFETY: the assignment ids and the sort's outputs (sized for the most tiles these
                // assignments can make) are live buffers of this GPU.
                let us = self.time(|| unsafe { g.moe_align(&align) }.map_err(kerr))?;
                let half = if halves { format!(" and {}", bm / 2) } else { String::new() };
                self.push_exact(
                    "moe_align",
                    format!("{label}: {n} tokens, {experts} local experts from {first}, tiles of {bm}{half}"),
                    differing,
                    total,
                    us,
                    (a * 4 * 3) as f64,
                );
            }
        }
        Ok(())
    }
}

/// The sort's device outputs for `a` assignments over `experts` local experts in tiles of `bm`
/// (and half tiles).
struct SortBufs {
    sorted: CudaSlice<i32>,
    inv: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    halves: CudaSlice<i32>,
    meta: CudaSlice<i32>,
}

impl SortBufs {
    fn new(g: &Gpu, a: usize, experts: usize, bm: usize) -> Result<Self> {
        let max_tiles = Gpu::moe_max_tiles(a, experts, bm);
        Ok(SortBufs {
            sorted: g.alloc::<i32>(a).map_err(kerr)?,
            inv: g.alloc::<i32>(a).map_err(kerr)?,
            tiles: g.alloc::<i32>(3 * max_tiles).map_err(kerr)?,
            halves: g.alloc::<i32>(3 * Gpu::moe_max_halves(a, experts).max(1)).map_err(kerr)?,
            meta: g.alloc::<i32>(2).map_err(kerr)?,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn align(&self, ids: u64, a: usize, top_k: usize, experts: usize, first: usize, bm: usize, halves: bool) -> Align {
        Align {
            ids,
            assignments: a,
            top_k,
            experts,
            first,
            bm,
            sorted_tok: ptr(&self.sorted),
            inv: ptr(&self.inv),
            tiles: ptr(&self.tiles),
            halves: if halves { ptr(&self.halves) } else { 0 },
            meta: ptr(&self.meta),
            row_expert: 0,
        }
    }

    /// (entries differing from `align_reference` on the host `ids`, entries compared): the
    /// placed rows, `inv`, the tiles, the half tiles and their counts.
    fn against_reference(&self, g: &Gpu, al: &Align, ids: &[u32]) -> Result<(usize, usize)> {
        let want = align_reference(ids, al.top_k, al.experts, al.first, al.bm, al.halves != 0);
        let (mut sorted, mut inv, mut meta) = (vec![0i32; ids.len()], vec![0i32; ids.len()], [0i32; 2]);
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { g.dtoh(ptr(&self.sorted), &mut sorted) }.map_err(kerr)?;
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { g.dtoh(ptr(&self.inv), &mut inv) }.map_err(kerr)?;
        // SAFETY: the source is a live allocation of this GPU holding as many values of the
        // destination's plain numeric type.
        unsafe { g.dtoh(ptr(&self.meta), &mut meta) }.map_err(kerr)?;
        let triples = |buf: &CudaSlice<i32>, want: &[[i32; 3]]| -> Result<(usize, usize)> {
            let mut got = vec![0i32; 3 * want.len()];
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { g.dtoh(ptr(buf), &mut got) }.map_err(kerr)?;
            Ok((got.iter().zip(want.iter().flatten()).filter(|(x, y)| x != y).count(), got.len()))
        };
        let (tiles_diff, tiles_n) = triples(&self.tiles, &want.tiles)?;
        let (halves_diff, halves_n) = triples(&self.halves, &want.halves)?;
        let counts = (meta[0] as usize != want.tiles.len()) as usize
            + (al.halves != 0 && meta[1] as usize != want.halves.len()) as usize;
        let differing = sorted.iter().zip(&want.sorted_tok).filter(|(x, y)| x != y).count()
            + inv.iter().zip(&want.inv).filter(|(x, y)| x != y).count()
            + tiles_diff
            + halves_diff
            + counts;
        Ok((differing, want.sorted_tok.len() + inv.len() + tiles_n + halves_n + 2))
    }
}

/// The routers of the models checked: V2-Lite, V3/R1, and V3's routing over 64 experts (the
/// V3-shaped bench models: groups of 8 experts, four per lane column).
fn models() -> [(&'static str, RouterParams); 3] {
    let v3 = RouterParams {
        n_experts: 256,
        n_group: 8,
        topk_group: 4,
        top_k: 8,
        norm_topk_prob: true,
        scaling: 2.5,
        shared: 1,
    };
    let lite = RouterParams {
        n_experts: 64,
        n_group: 1,
        topk_group: 1,
        top_k: 6,
        norm_topk_prob: false,
        scaling: 1.0,
        shared: 2,
    };
    [("V2-Lite", lite), ("V3", v3), ("V3, 64 experts", RouterParams { n_experts: 64, ..v3 })]
}
