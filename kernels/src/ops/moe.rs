//! MoE launchers: routing, expert alignment, grouped GEMM (v1 and v2 kernels, one argument
//! layout), the weighted combine, and the f32 reference expert MLP.

use super::GG_BN;
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32};

impl Gpu {
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &self,
        logits: u64,
        bias: u64,
        ids: u64,
        wts: u64,
        n: usize,
        experts: usize,
        n_group: usize,
        topk_group: usize,
        top_k: usize,
        norm: bool,
        scaling: f32,
    ) -> Result<()> {
        if experts > 256
            || n_group == 0
            || n_group > 32
            || experts % n_group != 0
            || top_k == 0
            || top_k > 32
            || top_k > experts
            || topk_group == 0
        {
            return Err(KernelError::Invalid(format!(
                "moe_route supports up to 256 experts in up to 32 equal groups and top_k <= 32 (got {experts} experts, {n_group} groups, top_k {top_k}, topk_group {topk_group})"
            )));
        }
        self.launch(
            "moe_route",
            (n.div_ceil(4) as u32, 1, 1),
            128,
            0,
            &[
                Ptr(logits),
                Ptr(bias),
                Ptr(ids),
                Ptr(wts),
                I32(n as i32),
                I32(experts as i32),
                I32(n_group as i32),
                I32(topk_group as i32),
                I32(top_k as i32),
                I32(norm as i32),
                F32(scaling),
            ],
        )
    }

    /// Most row tiles `moe_align` can produce for `assignments` rows over `experts`.
    pub fn moe_max_tiles(assignments: usize, experts: usize, bm: usize) -> usize {
        assignments.div_ceil(bm) + experts.min(assignments)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn moe_align(
        &self,
        ids: u64,
        assignments: usize,
        top_k: usize,
        experts: usize,
        bm: usize,
        sorted_tok: u64,
        inv: u64,
        tiles: u64,
        meta: u64,
        row_expert: u64,
    ) -> Result<()> {
        if experts > 4096 {
            return Err(KernelError::Invalid(format!("moe_align: {experts} experts (at most 4096)")));
        }
        self.launch(
            "moe_align",
            (1, 1, 1),
            1024,
            (16 * experts) as u32,
            &[
                Ptr(ids),
                I32(assignments as i32),
                I32(top_k as i32),
                I32(experts as i32),
                I32(bm as i32),
                Ptr(sorted_tok),
                Ptr(inv),
                Ptr(tiles),
                Ptr(meta),
                Ptr(row_expert),
            ],
        )
    }

    /// Grouped GEMM over expert row tiles (see moe.cu). `bm` 16 or 64; `silu` fuses the
    /// interleaved gate/up activation and writes bf16 `[*, n/2]`, else f32 `[*, n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm(
        &self,
        v2: bool,
        bm: usize,
        silu: bool,
        x: u64,
        rowidx: u64,
        w: u64,
        y: u64,
        tiles: u64,
        meta: u64,
        max_tiles: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if k % 8 != 0 {
            return Err(KernelError::Invalid(format!("grouped GEMM needs K divisible by 8 (got {k})")));
        }
        let name = match (bm, silu, v2) {
            (16, false, false) => "gg16_f32",
            (16, true, false) => "gg16_silu",
            (64, false, false) => "gg64_f32",
            (64, true, false) => "gg64_silu",
            (16, false, true) => "gg16_f32_v2",
            (16, true, true) => "gg16_silu_v2",
            (64, false, true) => "gg64_f32_v2",
            (64, true, true) => "gg64_silu_v2",
            _ => return Err(KernelError::Invalid(format!("grouped GEMM row tile {bm}"))),
        };
        let gx = n.div_ceil(GG_BN) as u32;
        self.launch(
            name,
            (gx, max_tiles as u32, 1),
            128,
            0,
            &[Ptr(x), Ptr(rowidx), Ptr(w), Ptr(y), Ptr(tiles), Ptr(meta), I32(n as i32), I32(k as i32)],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(&self, y: u64, inv: u64, wts: u64, out: u64, n: usize, top_k: usize, h: usize) -> Result<()> {
        self.launch_rows(
            "moe_combine",
            n,
            256,
            &[Ptr(y), Ptr(inv), Ptr(wts), Ptr(out), I32(n as i32), I32(top_k as i32), I32(h as i32)],
        )
    }

    /// Reference precision: the f32 expert MLP (gate/up with SiLU, then down) per sorted row.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_f32(
        &self,
        x: u64,
        sorted_tok: u64,
        row_expert: u64,
        gate_up: u64,
        down: u64,
        act: u64,
        y: u64,
        rows: usize,
        h: usize,
        i: usize,
    ) -> Result<()> {
        self.launch(
            "moe_f32_gateup",
            (rows as u32, 1, 1),
            128,
            0,
            &[Ptr(x), Ptr(sorted_tok), Ptr(row_expert), Ptr(gate_up), Ptr(act), I32(h as i32), I32(i as i32)],
        )?;
        self.launch(
            "moe_f32_down",
            (rows as u32, 1, 1),
            128,
            0,
            &[Ptr(act), Ptr(row_expert), Ptr(down), Ptr(y), I32(h as i32), I32(i as i32)],
        )
    }
}
