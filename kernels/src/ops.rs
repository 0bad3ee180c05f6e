//! Typed launchers: one method per kernel, over raw device addresses (`u64`) and sizes. Callers
//! own the buffers; these only check what the kernels assume and pick the launch shape.

use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32, U64};

/// Heads per attention block and keys per tile (must match attention.cu).
pub const MLA_HEADS_PER_BLOCK: usize = 16;
pub const MLA_TILE: usize = 32;
pub const MLA_MAX_LATENT: usize = 512;
/// Output columns per grouped-GEMM block (must match moe.cu).
pub const GG_BN: usize = 128;

/// Stored weight dtypes `convert_weight` understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcDtype {
    Bf16 = 0,
    F16 = 1,
    F32 = 2,
    Fp8E4m3 = 3,
}

/// MLA attention launch parameters.
#[derive(Debug, Clone, Copy)]
pub struct MlaLaunch {
    pub rows: usize,
    pub heads: usize,
    pub kv_lora: usize,
    pub rope: usize,
    pub nope: usize,
    pub layers: usize,
    pub layer: usize,
    pub block_size: usize,
    pub scale: f32,
    /// Longest visible context of any row.
    pub max_ctx: usize,
}

impl MlaLaunch {
    /// Dynamic shared memory of `mla_decode` for this latent width.
    pub fn smem_bytes(&self) -> usize {
        let w = self.kv_lora + self.rope;
        let s = w.div_ceil(16) * 16 + 8;
        let (hb, tt) = (MLA_HEADS_PER_BLOCK, MLA_TILE);
        hb * s * 2 + 2 * (tt * s + 64) * 2 + hb * tt * 4 + hb * (tt + 8) * 2 + 3 * hb * 4
    }

    /// (splits, keys per split): enough blocks to fill the GPU, each split a whole number of tiles.
    pub fn splits(&self, sm_count: usize) -> (usize, usize) {
        let tiles = self.max_ctx.div_ceil(MLA_TILE).max(1);
        let base = self.rows * self.heads.div_ceil(MLA_HEADS_PER_BLOCK);
        // At most one wave of two blocks per SM when the rows allow it.
        let want = ((2 * sm_count) / base.max(1)).max(1);
        let splits = want.clamp(1, tiles.min(64));
        let per = tiles.div_ceil(splits);
        (tiles.div_ceil(per), per * MLA_TILE)
    }
}

impl Gpu {
    fn grid1(&self, n: u64) -> u32 {
        (n.div_ceil(256)).clamp(1, (self.sm_count * 16) as u64) as u32
    }

    pub fn embedding(&self, table: u64, ids: u64, out: u64, n: usize, cols: usize) -> Result<()> {
        self.launch(
            "embedding_f32",
            (n as u32, 1, 1),
            256,
            0,
            &[Ptr(table), Ptr(ids), Ptr(out), I32(n as i32), I32(cols as i32)],
        )
    }

    /// `y = rmsnorm(x)` over the first `wc` columns, or with `res != 0`: `res += x; y = rmsnorm(res)`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: u64,
        res: u64,
        w: u64,
        y: u64,
        rows: usize,
        cols: usize,
        wc: usize,
        eps: f32,
    ) -> Result<()> {
        let block = if cols > 4096 { 512 } else { 256 };
        self.launch(
            "rms_norm_f32",
            (rows as u32, 1, 1),
            block,
            0,
            &[Ptr(x), Ptr(res), Ptr(w), Ptr(y), I32(cols as i32), I32(wc as i32), F32(eps)],
        )
    }

    pub fn silu_mul(&self, x: u64, y: u64, rows: usize, half: usize) -> Result<()> {
        let n = (rows * half) as u64;
        self.launch(
            "silu_mul_f32",
            (self.grid1(n), 1, 1),
            256,
            0,
            &[Ptr(x), Ptr(y), I32(rows as i32), I32(half as i32)],
        )
    }

    pub fn add(&self, a: u64, b: u64, n: usize) -> Result<()> {
        self.launch("add_f32", (self.grid1(n as u64), 1, 1), 256, 0, &[Ptr(a), Ptr(b), U64(n as u64)])
    }

    pub fn gather_rows(&self, x: u64, rows: u64, y: u64, n: usize, cols: usize) -> Result<()> {
        self.launch(
            "gather_rows_f32",
            (n as u32, 1, 1),
            256,
            0,
            &[Ptr(x), Ptr(rows), Ptr(y), I32(n as i32), I32(cols as i32)],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: u64,
        cos_sin: u64,
        pos: u64,
        n: usize,
        cols: usize,
        heads: usize,
        offset: usize,
        stride: usize,
        rope: usize,
        interleaved: bool,
    ) -> Result<()> {
        let total = (n * heads * rope / 2) as u64;
        self.launch(
            "rope_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[
                Ptr(x),
                Ptr(cos_sin),
                Ptr(pos),
                I32(n as i32),
                I32(cols as i32),
                I32(heads as i32),
                I32(offset as i32),
                I32(stride as i32),
                I32(rope as i32),
                I32(interleaved as i32),
            ],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn write_kv(
        &self,
        latent: u64,
        slots: u64,
        cache: u64,
        n: usize,
        width: usize,
        layers: usize,
        layer: usize,
        bs: usize,
    ) -> Result<()> {
        let total = (n * width) as u64;
        self.launch(
            "write_kv_bf16",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[
                Ptr(latent),
                Ptr(slots),
                Ptr(cache),
                I32(n as i32),
                I32(width as i32),
                I32(layers as i32),
                I32(layer as i32),
                I32(bs as i32),
            ],
        )
    }

    pub fn kv_export(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        let total = (nb * per_block) as u64;
        self.launch(
            "kv_export_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[Ptr(cache), Ptr(blocks), Ptr(out), I32(nb as i32), U64(per_block as u64)],
        )
    }

    pub fn kv_import(&self, input: u64, blocks: u64, cache: u64, nb: usize, per_block: usize) -> Result<()> {
        let total = (nb * per_block) as u64;
        self.launch(
            "kv_import_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[Ptr(input), Ptr(blocks), Ptr(cache), I32(nb as i32), U64(per_block as u64)],
        )
    }

    pub fn cast_f32_bf16(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.launch("cast_f32_bf16", (self.grid1(n as u64), 1, 1), 256, 0, &[Ptr(x), Ptr(y), U64(n as u64)])
    }

    pub fn cast_bf16_f32(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.launch("cast_bf16_f32", (self.grid1(n as u64), 1, 1), 256, 0, &[Ptr(x), Ptr(y), U64(n as u64)])
    }

    /// Converts a stored `[rows, cols]` weight into bf16 rows `row_base + r * row_mul + row_off`
    /// of `dst` (`cols` wide). `scale`: fp8 block scales (0 for none) with block `[sb0, sb1]`.
    #[allow(clippy::too_many_arguments)]
    pub fn convert_weight(
        &self,
        src: u64,
        dtype: SrcDtype,
        rows: usize,
        cols: usize,
        scale: u64,
        block: [usize; 2],
        dst: u64,
        row_base: usize,
        row_mul: usize,
        row_off: usize,
    ) -> Result<()> {
        let total = (rows * cols) as u64;
        self.launch(
            "convert_weight",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[
                Ptr(src),
                I32(dtype as i32),
                I32(rows as i32),
                I32(cols as i32),
                Ptr(scale),
                I32(block[0] as i32),
                I32(block[1] as i32),
                Ptr(dst),
                I32(row_base as i32),
                I32(row_mul as i32),
                I32(row_off as i32),
            ],
        )
    }

    pub fn fill_uniform_bf16(&self, dst: u64, n: usize, seed: u64, lo: f32, hi: f32) -> Result<()> {
        self.launch(
            "fill_uniform_bf16",
            (self.grid1(n as u64), 1, 1),
            256,
            0,
            &[Ptr(dst), U64(n as u64), U64(seed), F32(lo), F32(hi)],
        )
    }

    /// Checks the shapes `mla_decode` supports.
    pub fn mla_supported(kv_lora: usize, rope: usize) -> Result<()> {
        if (kv_lora + rope) % 8 != 0 || kv_lora > MLA_MAX_LATENT || kv_lora == 0 {
            return Err(KernelError::Invalid(format!(
                "MLA attention needs kv_lora_rank + qk_rope_head_dim divisible by 8 and kv_lora_rank <= {MLA_MAX_LATENT} (got {kv_lora} + {rope})"
            )));
        }
        Ok(())
    }

    /// Partial attention of every row over its visible keys; see attention.cu.
    #[allow(clippy::too_many_arguments)]
    pub fn mla_decode(
        &self,
        v2: bool,
        p: &MlaLaunch,
        splits: usize,
        chunk: usize,
        q_lat: u64,
        q: u64,
        cache: u64,
        row_len: u64,
        row_tab: u64,
        tables: u64,
        part_o: u64,
        part_ml: u64,
    ) -> Result<()> {
        Self::mla_supported(p.kv_lora, p.rope)?;
        let smem = p.smem_bytes();
        if smem > self.max_smem_optin.min(200 * 1024) {
            return Err(KernelError::Invalid(format!("MLA attention needs {smem} bytes of shared memory")));
        }
        let qk = p.nope + p.rope;
        let hg = p.heads.div_ceil(MLA_HEADS_PER_BLOCK);
        self.launch(
            if v2 { "mla_decode2" } else { "mla_decode" },
            (p.rows as u32, splits as u32, hg as u32),
            128,
            smem as u32,
            &[
                Ptr(q_lat),
                Ptr(q),
                Ptr(cache),
                Ptr(row_len),
                Ptr(row_tab),
                Ptr(tables),
                Ptr(part_o),
                Ptr(part_ml),
                I32(p.heads as i32),
                I32(p.kv_lora as i32),
                I32(p.rope as i32),
                I32(p.nope as i32),
                I32(qk as i32),
                I32(p.layers as i32),
                I32(p.layer as i32),
                I32(p.block_size as i32),
                I32(chunk as i32),
                I32(splits as i32),
                F32(p.scale),
            ],
        )
    }

    pub fn mla_combine(
        &self,
        part_o: u64,
        part_ml: u64,
        o_lat: u64,
        rows: usize,
        heads: usize,
        kv_lora: usize,
        splits: usize,
    ) -> Result<()> {
        if splits > 64 {
            return Err(KernelError::Invalid(format!("mla_combine: {splits} splits (at most 64)")));
        }
        self.launch(
            "mla_combine",
            (rows as u32, heads as u32, 1),
            128,
            0,
            &[Ptr(part_o), Ptr(part_ml), Ptr(o_lat), I32(heads as i32), I32(kv_lora as i32), I32(splits as i32)],
        )
    }

    /// Expanded prefill: a sequence's latent rows `[ctx, width]` gathered from the paged cache.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_latent(
        &self,
        cache: u64,
        table: u64,
        out: u64,
        ctx: usize,
        layers: usize,
        layer: usize,
        bs: usize,
        width: usize,
    ) -> Result<()> {
        if width % 8 != 0 {
            return Err(KernelError::Invalid(format!("gather_latent: width {width} not divisible by 8")));
        }
        let total = (ctx * width / 8) as u64;
        self.launch(
            "gather_latent",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[
                Ptr(cache),
                Ptr(table),
                Ptr(out),
                I32(ctx as i32),
                I32(layers as i32),
                I32(layer as i32),
                I32(bs as i32),
                I32(width as i32),
            ],
        )
    }

    /// Causal softmax of `rows` score rows of length `ctx` (row r is query r % ql of the chunk).
    pub fn softmax_causal(&self, s: u64, p: u64, rows: usize, ql: usize, ctx: usize, scale: f32) -> Result<()> {
        self.launch(
            "softmax_causal",
            (rows as u32, 1, 1),
            256,
            0,
            &[Ptr(s), Ptr(p), I32(ql as i32), I32(ctx as i32), F32(scale)],
        )
    }

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
        self.launch(
            "moe_combine",
            (n as u32, 1, 1),
            256,
            0,
            &[Ptr(y), Ptr(inv), Ptr(wts), Ptr(out), I32(n as i32), I32(top_k as i32), I32(h as i32)],
        )
    }
}

/// Reference-precision (f32) kernels: the CPU backend's algorithms on the GPU, for small models
/// and for checking the fast kernels end to end.
impl Gpu {
    #[allow(clippy::too_many_arguments)]
    pub fn write_kv_f32(
        &self,
        latent: u64,
        slots: u64,
        cache: u64,
        n: usize,
        width: usize,
        layers: usize,
        layer: usize,
        bs: usize,
    ) -> Result<()> {
        let total = (n * width) as u64;
        self.launch(
            "write_kv_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[
                Ptr(latent),
                Ptr(slots),
                Ptr(cache),
                I32(n as i32),
                I32(width as i32),
                I32(layers as i32),
                I32(layer as i32),
                I32(bs as i32),
            ],
        )
    }

    pub fn kv_gather_f32(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        let total = (nb * per_block) as u64;
        self.launch(
            "kv_gather_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[Ptr(cache), Ptr(blocks), Ptr(out), I32(nb as i32), U64(per_block as u64)],
        )
    }

    pub fn kv_scatter_f32(&self, input: u64, blocks: u64, cache: u64, nb: usize, per_block: usize) -> Result<()> {
        let total = (nb * per_block) as u64;
        self.launch(
            "kv_scatter_f32",
            (self.grid1(total), 1, 1),
            256,
            0,
            &[Ptr(input), Ptr(blocks), Ptr(cache), I32(nb as i32), U64(per_block as u64)],
        )
    }

    /// `out[row, h*V..]` for every row and head, all in f32 (see attention.cu `mla_ref_f32`).
    #[allow(clippy::too_many_arguments)]
    pub fn mla_ref_f32(
        &self,
        p: &MlaLaunch,
        v: usize,
        q: u64,
        cache: u64,
        row_len: u64,
        row_tab: u64,
        tables: u64,
        kv_b: u64,
        out: u64,
    ) -> Result<()> {
        if p.kv_lora > 512 || p.rope > 64 {
            return Err(KernelError::Invalid(format!(
                "f32 MLA supports kv_lora_rank <= 512 and qk_rope_head_dim <= 64 (got {} and {})",
                p.kv_lora, p.rope
            )));
        }
        self.launch(
            "mla_ref_f32",
            (p.rows as u32, p.heads as u32, 1),
            128,
            0,
            &[
                Ptr(q),
                Ptr(cache),
                Ptr(row_len),
                Ptr(row_tab),
                Ptr(tables),
                Ptr(kv_b),
                Ptr(out),
                I32(p.heads as i32),
                I32(p.kv_lora as i32),
                I32(p.rope as i32),
                I32(p.nope as i32),
                I32(v as i32),
                I32(p.layers as i32),
                I32(p.layer as i32),
                I32(p.block_size as i32),
                F32(p.scale),
            ],
        )
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mla_smem_and_splits() {
        let p = MlaLaunch {
            rows: 1,
            heads: 16,
            kv_lora: 512,
            rope: 64,
            nope: 128,
            layers: 27,
            layer: 0,
            block_size: 64,
            scale: 0.1,
            max_ctx: 4096,
        };
        assert!(p.smem_bytes() < 200 * 1024);
        let (splits, chunk) = p.splits(132);
        assert!(splits * chunk >= 4096 && chunk % MLA_TILE == 0 && splits <= 64);
        let big = MlaLaunch { rows: 4096, ..p };
        assert_eq!(big.splits(132).0, 1);
        let short = MlaLaunch { max_ctx: 1, ..p };
        assert_eq!(short.splits(132), (1, MLA_TILE));
    }

    #[test]
    fn tile_bound_covers_worst_case() {
        // every expert with one row over: ceil(A/bm) + E bounds sum_e ceil(c_e/bm)
        let (a, e, bm) = (100usize, 8usize, 16usize);
        let counts = [13usize, 13, 13, 13, 12, 12, 12, 12];
        let tiles: usize = counts.iter().map(|c| c.div_ceil(bm)).sum();
        assert!(tiles <= Gpu::moe_max_tiles(a, e, bm));
    }
}
