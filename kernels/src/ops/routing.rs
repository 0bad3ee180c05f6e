//! Expert routing and the sort of assignments into row tiles (routing.cu), with the sort's host
//! reference.

use crate::{Arg, Gpu, KernelError, Result};
use Arg::{Ptr, F32, I32};

/// Threads of the one block that sorts assignments (`moe_align`, `moe_route_align`).
const ALIGN_THREADS: u32 = 1024;
/// The most local experts `moe_align`'s tables fit in the default 48 KiB of shared memory.
const ALIGN_MAX_EXPERTS: usize = 512;
/// Most tokens [`Gpu::moe_route_align`] takes (two per warp of its block).
pub const ROUTE_ALIGN_MAX_TOKENS: usize = 64;
/// Most assignments the sort takes with one warp (routing.cu `ALIGN_WARP_MAX`): no shared
/// memory, no barriers, a block of a warp per token.
const ALIGN_WARP_MAX: usize = 32;

/// DeepSeek's noaux_tc routing of `n` tokens over router `logits` `[n, experts]` (f32) with the
/// selection `bias`: `ids`/`wts` get `top_k + shared` entries per token, the routed experts then
/// the shared experts `experts..experts + shared` with weight 1.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub logits: u64,
    pub bias: u64,
    pub ids: u64,
    pub wts: u64,
    pub n: usize,
    pub experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub top_k: usize,
    pub shared: usize,
    pub norm: bool,
    pub scaling: f32,
}

impl Route {
    fn check(&self) -> Result<()> {
        let Route { experts, n_group, topk_group, top_k, shared, .. } = *self;
        if experts > 256
            || n_group == 0
            || n_group > 32
            || !experts.is_multiple_of(n_group)
            || top_k == 0
            || top_k + shared > 32
            || top_k > experts
            || topk_group == 0
        {
            return Err(KernelError::Invalid(format!(
                "moe_route supports up to 256 experts in up to 32 equal groups and top_k + shared experts <= 32 (got {experts} experts, {n_group} groups, top_k {top_k}, {shared} shared, topk_group {topk_group})"
            )));
        }
        Ok(())
    }

    fn args(&self) -> [Arg; 12] {
        [
            Ptr(self.logits),
            Ptr(self.bias),
            Ptr(self.ids),
            Ptr(self.wts),
            I32(self.n as i32),
            I32(self.experts as i32),
            I32(self.n_group as i32),
            I32(self.topk_group as i32),
            I32(self.top_k as i32),
            I32(self.shared as i32),
            I32(self.norm as i32),
            F32(self.scaling),
        ]
    }
}

/// The sort of `assignments` expert choices (`top_k` per token, in `ids`) into row tiles of at
/// most `bm` rows of this rank's experts `first..first + experts` (routing.cu `align_assignments`):
/// `sorted_tok`, `inv`, `tiles` ([`Gpu::moe_max_tiles`] triples), `meta` (the tile count) and,
/// when non-zero, `row_expert`. With `halves` non-zero, each expert's last tile of at most `bm / 2`
/// rows goes there instead ([`Gpu::moe_max_halves`] triples, their count in `meta[1]`): the
/// experts' rows split between GEMMs with tiles of `bm` and of `bm / 2` rows.
#[derive(Debug, Clone, Copy)]
pub struct Align {
    pub ids: u64,
    pub assignments: usize,
    pub top_k: usize,
    pub experts: usize,
    pub first: usize,
    pub bm: usize,
    pub sorted_tok: u64,
    pub inv: u64,
    pub tiles: u64,
    pub halves: u64,
    pub meta: u64,
    pub row_expert: u64,
}

impl Align {
    /// The arguments after `ids`.
    fn args(&self) -> Result<[Arg; 11]> {
        if self.experts > ALIGN_MAX_EXPERTS {
            return Err(KernelError::Invalid(format!(
                "moe_align: {} experts (at most {ALIGN_MAX_EXPERTS})",
                self.experts
            )));
        }
        if self.halves != 0 && self.bm < 2 {
            return Err(KernelError::Invalid(format!("moe_align: half tiles of tiles of {} rows", self.bm)));
        }
        Ok([
            I32(self.assignments as i32),
            I32(self.top_k as i32),
            I32(self.experts as i32),
            I32(self.first as i32),
            I32(self.bm as i32),
            Ptr(self.sorted_tok),
            Ptr(self.inv),
            Ptr(self.tiles),
            Ptr(self.halves),
            Ptr(self.meta),
            Ptr(self.row_expert),
        ])
    }

    /// Six ints per expert and one, then a u16 per expert per warp; none for the one-warp sort.
    fn smem(&self) -> u32 {
        if self.one_warp() {
            return 0;
        }
        (24 * self.experts + 4 + 2 * self.experts * (ALIGN_THREADS as usize / 32)) as u32
    }

    /// Whether the one-warp sort takes these assignments.
    fn one_warp(&self) -> bool {
        self.assignments <= ALIGN_WARP_MAX
    }
}

impl Gpu {
    /// Routes `r.n` tokens ([`Route`]).
    ///
    /// # Safety
    /// Every address in `r` is a live device allocation of this context: `logits` `r.n * experts` f32,
    /// `bias` (when non-zero) `experts` f32, `ids` and `wts` `r.n * (top_k + shared)` u32 and f32.
    pub unsafe fn moe_route(&self, r: &Route) -> Result<()> {
        r.check()?;
        self.launch("moe_route", (r.n.div_ceil(4) as u32, 1, 1), 128, 0, &r.args())
    }

    /// Most row tiles `moe_align` can produce for `assignments` rows over `experts`.
    pub fn moe_max_tiles(assignments: usize, experts: usize, bm: usize) -> usize {
        assignments.div_ceil(bm) + experts.min(assignments)
    }

    /// Most half tiles (one an expert at most) `moe_align` can produce for `assignments` rows
    /// over `experts` ([`Align::halves`]).
    pub fn moe_max_halves(assignments: usize, experts: usize) -> usize {
        experts.min(assignments)
    }

    /// Sorts the assignments in `a.ids` into row tiles ([`Align`]).
    ///
    /// # Safety
    /// Every address in `a` is a live device allocation of this context of the sizes [`Align`] gives
    /// (the tile lists of [`Gpu::moe_max_tiles`] entries).
    pub unsafe fn moe_align(&self, a: &Align) -> Result<()> {
        let mut args = vec![Ptr(a.ids)];
        args.extend(a.args()?);
        let threads = if a.one_warp() { 32 } else { ALIGN_THREADS };
        self.launch("moe_align", (1, 1, 1), threads, a.smem(), &args)
    }

    /// [`Gpu::moe_route`] then [`Gpu::moe_align`] on the ids just written, in one block: for
    /// batches of up to [`ROUTE_ALIGN_MAX_TOKENS`] tokens, where each is a launch of a few
    /// microseconds. `a.ids` must be `r.ids` and `a.assignments` all of `r`'s.
    ///
    /// # Safety
    /// As [`Gpu::moe_route`] for `r` and [`Gpu::moe_align`] for `a`.
    pub unsafe fn moe_route_align(&self, r: &Route, a: &Align) -> Result<()> {
        r.check()?;
        if a.ids != r.ids || a.assignments != r.n * (r.top_k + r.shared) || a.top_k != r.top_k + r.shared {
            return Err(KernelError::Invalid("moe_route_align: the sort must take the routed ids".into()));
        }
        if r.n > ROUTE_ALIGN_MAX_TOKENS {
            return Err(KernelError::Invalid(format!(
                "moe_route_align: {} tokens (at most {ROUTE_ALIGN_MAX_TOKENS})",
                r.n
            )));
        }
        let mut args = r.args().to_vec();
        args.extend(a.args()?);
        // A warp routes each token; the one-warp sort needs no more.
        let threads = if a.one_warp() { (32 * r.n.max(1)) as u32 } else { ALIGN_THREADS };
        self.launch("moe_route_align", (1, 1, 1), threads, a.smem(), &args)
    }

    /// `out[t] = sum_j wts[t, j] y[inv[t, j]]` over token t's `top_k` expert rows of `y` `[*, h]`.
    ///
    /// # Safety
    /// `y` holds the expert rows `inv` (`n * top_k` u32) indexes, `h` f32 each; `wts` `n * top_k` f32,
    /// `out` `n * h` f32: device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn moe_combine(
        &self,
        y: u64,
        inv: u64,
        wts: u64,
        out: u64,
        n: usize,
        top_k: usize,
        h: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.launch(
            "moe_combine",
            (h.div_ceil(4 * 128) as u32, n as u32, 1),
            128,
            0,
            &[Ptr(y), Ptr(inv), Ptr(wts), Ptr(out), I32(n as i32), I32(top_k as i32), I32(h as i32)],
        )
    }
}

/// What [`Gpu::moe_align`] writes, computed on the host ([`align_reference`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aligned {
    /// The token of each placed row (the kernel's unused rows after them are not compared).
    pub sorted_tok: Vec<i32>,
    /// Each assignment's sorted row, -1 for other ranks' experts.
    pub inv: Vec<i32>,
    /// (expert, first sorted row, rows) per tile.
    pub tiles: Vec<[i32; 3]>,
    /// The half tiles ([`Align::halves`]); empty without them.
    pub halves: Vec<[i32; 3]>,
}

/// [`Aligned`] for the assignments `ids` (`top_k` per token) over local experts
/// `first..first + experts` in row tiles of at most `bm`, with each expert's last tile of at most
/// `bm / 2` rows among the half tiles when `halves`; each expert's rows in assignment order.
pub fn align_reference(ids: &[u32], top_k: usize, experts: usize, first: usize, bm: usize, halves: bool) -> Aligned {
    let local = |id: u32| (id as usize).checked_sub(first).filter(|&e| e < experts);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); experts];
    for (i, &id) in ids.iter().enumerate() {
        if let Some(e) = local(id) {
            rows[e].push(i);
        }
    }
    let mut out = Aligned { sorted_tok: Vec::new(), inv: vec![-1; ids.len()], tiles: Vec::new(), halves: Vec::new() };
    for (e, assigned) in rows.iter().enumerate() {
        for chunk in assigned.chunks(bm) {
            let tile = [e as i32, out.sorted_tok.len() as i32, chunk.len() as i32];
            if halves && chunk.len() <= bm / 2 {
                out.halves.push(tile);
            } else {
                out.tiles.push(tile);
            }
            for &i in chunk {
                out.inv[i] = out.sorted_tok.len() as i32;
                out.sorted_tok.push((i / top_k) as i32);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_reference_keeps_assignment_order_per_expert() {
        // Two tokens of top 3 over local experts 2..5: expert 2 twice (token 0, then token 1),
        // expert 9 belongs to another rank.
        let ids = [2, 4, 9, 3, 2, 4];
        let one = align_reference(&ids, 3, 3, 2, 1, false);
        assert_eq!(one.sorted_tok, vec![0, 1, 1, 0, 1]);
        assert_eq!(one.inv, vec![0, 3, -1, 2, 1, 4]);
        assert_eq!(one.tiles, vec![[0, 0, 1], [0, 1, 1], [1, 2, 1], [2, 3, 1], [2, 4, 1]]);
        assert!(one.halves.is_empty());
        let wide = align_reference(&ids, 3, 3, 2, 16, false);
        assert_eq!(wide.tiles, vec![[0, 0, 2], [1, 2, 1], [2, 3, 2]]);
    }

    #[test]
    fn half_tiles_take_each_experts_last_rows_up_to_half_a_tile() {
        // Expert 0: 21 rows (16 + 5: the 5 go to a half tile), expert 1: 12 (one main tile),
        // expert 2: 3 (a half tile), expert 3: 16 (one main tile), expert 4: none.
        let counts = [21, 12, 3, 16, 0];
        let ids: Vec<u32> = counts.iter().enumerate().flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c)).collect();
        let a = align_reference(&ids, 1, 5, 0, 16, true);
        assert_eq!(a.tiles, vec![[0, 0, 16], [1, 21, 12], [3, 36, 16]]);
        assert_eq!(a.halves, vec![[0, 16, 5], [2, 33, 3]]);
        let whole = align_reference(&ids, 1, 5, 0, 16, false);
        assert_eq!((whole.sorted_tok, whole.inv), (a.sorted_tok, a.inv));
        assert_eq!(whole.tiles.len(), a.tiles.len() + a.halves.len());
        assert!(a.halves.len() <= Gpu::moe_max_halves(ids.len(), 5));
    }

    #[test]
    fn align_tables_fit_default_shared_memory() {
        let a = Align {
            ids: 0,
            assignments: 1,
            top_k: 1,
            experts: ALIGN_MAX_EXPERTS,
            first: 0,
            bm: 16,
            sorted_tok: 0,
            inv: 0,
            tiles: 0,
            halves: 0,
            meta: 0,
            row_expert: 0,
        };
        assert!(a.smem() <= 48 * 1024);
        assert!(Align { experts: ALIGN_MAX_EXPERTS + 1, ..a }.args().is_err());
    }
}
