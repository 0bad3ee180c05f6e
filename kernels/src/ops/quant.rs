//! Launchers of the quantized-weight kernels (`cu/quant.cu`): the grouped / dense GEMM over
//! compressed weights, its split-K reduction and the expansion to bf16.

use super::GG_BN;
use crate::quant::{QFormat, QShape};
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, I32, U64};

/// A stack of quantized matrices on the device, laid out as [`crate::quant`] packs them.
#[derive(Debug, Clone, Copy)]
pub struct QWeights {
    pub shape: QShape,
    pub words: u64,
    pub scales: u64,
    /// AWQ zero points (0 for FP8).
    pub zeros: u64,
}

impl QWeights {
    /// Matrices `first..first + count` of the stack, as a stack of their own (`None` past the
    /// last).
    pub fn matrices(&self, first: usize, count: usize) -> Option<QWeights> {
        let s = self.shape;
        if first + count > s.experts {
            return None;
        }
        let at = |base: u64, per: usize| if base == 0 { 0 } else { base + (first * per) as u64 };
        Some(QWeights {
            shape: QShape { experts: count, ..s },
            words: at(self.words, s.words_per_matrix() * 4),
            scales: at(self.scales, s.scales_per_matrix() * s.format.scale_bytes()),
            zeros: at(self.zeros, s.zero_words_per_matrix() * 4),
        })
    }
}

/// The operands of a GEMM over [`QWeights`]: `Y[p, :n] = X[row(p), :k] W[e]^T` for the rows `p`
/// of each expert tile of `tiles`/`meta` (from `moe_align`, with row tiles of `bm`), or, when
/// `tiles` is 0, for rows `0..rows` of matrix 0. `rowidx` maps `p` to an input row (0: identity).
/// `silu` takes interleaved gate/up columns and stores bf16 `[*, n/2]`, else f32 `[*, n]`.
/// `splits > 1` splits the input channels: split `z` stores f32 partials at `y + z * rows * n`,
/// which [`Gpu::qgemm_reduce`] sums (not with `silu`).
#[derive(Debug, Clone, Copy)]
pub struct QGemm {
    pub silu: bool,
    pub x: u64,
    /// The activations' FP8 scales (the persistent FP8 kernel; 0 otherwise).
    pub x_scales: u64,
    pub rowidx: u64,
    pub y: u64,
    pub tiles: u64,
    pub meta: u64,
    pub max_tiles: usize,
    /// Rows of `y` (the dense rows, or the sorted expert rows).
    pub rows: usize,
    pub bm: usize,
    pub splits: usize,
    /// The persistent kernel's blocks take equal runs of k-tiles, handing cut items over between
    /// them (one split; [`Gpu::qgemm_persistent`]), instead of whole items. Its results depend
    /// on which tile holds each row (whole items' do not): moe_align's stable order fixes that.
    pub streamk: bool,
}

impl QGemm {
    /// The operands every compressed GEMM kernel takes first, in quant.cu's order.
    pub(super) fn args(&self, w: &QWeights) -> [Arg; 14] {
        let s = w.shape;
        [
            Ptr(self.x),
            Ptr(self.rowidx),
            Ptr(w.words),
            Ptr(w.scales),
            Ptr(w.zeros),
            Ptr(self.y),
            Ptr(self.tiles),
            Ptr(self.meta),
            I32(self.rows as i32),
            I32(s.n as i32),
            I32(s.k as i32),
            I32(s.np() as i32),
            I32(s.kp() as i32),
            I32(s.group as i32),
        ]
    }

    /// A dense GEMM of `rows` rows into f32 `y` (`x` is for the caller to set). The tiled kernel's
    /// row tile: one deep-pipelined tile of 16 up to 16 rows, else tiles of 64, so that weights
    /// larger than L2 (V3's dense MLP: 132 MB in int4) are not streamed once per 16 rows (the
    /// persistent kernel's tile comes with its shape).
    pub fn dense(rows: usize, y: u64) -> Self {
        let bm = if rows <= 16 { 16 } else { 64 };
        QGemm {
            silu: false,
            x: 0,
            x_scales: 0,
            rowidx: 0,
            y,
            tiles: 0,
            meta: 0,
            max_tiles: 0,
            rows,
            bm,
            splits: 1,
            streamk: false,
        }
    }
}

/// (row tile, format) -> (kernel stem, input channels per stage, stages), as compiled in quant.cu.
const QG_SHAPES: [(usize, QFormat, &str, usize, usize); 4] = [
    (16, QFormat::AwqInt4, "qg16_awq", 128, 6),
    (64, QFormat::AwqInt4, "qg64_awq", 32, 4),
    (16, QFormat::Fp8E4m3, "qg16_fp8", 64, 8),
    (64, QFormat::Fp8E4m3, "qg64_fp8", 32, 4),
];

/// A dense GEMM's `[rows, n]` result cut after column `first` into two matrices: `[rows, first]`
/// at the GEMM's own output, `[rows, n - first]` at `rest`.
#[derive(Debug, Clone, Copy)]
pub struct QCut {
    pub first: usize,
    pub rest: u64,
}

/// The functions of quant.cu; the `qg*` GEMMs get the opt-in dynamic shared memory at start-up.
/// Which kernel expands compressed weights to bf16 ([`Gpu::qdequant_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expansion {
    /// One value per thread, any shape: the reference (`qdequant_awq`, `qdequant_fp8`).
    PerValue,
    /// AWQ, 8 rows per block, each store a warp's 512 contiguous bytes (`qdequant_awq_rows`).
    Rows,
}

pub const QUANT_KERNELS: &[&str] = &[
    "qg16_awq_f32",
    "qg16_awq_silu",
    "qg64_awq_f32",
    "qg64_awq_silu",
    "qg16_fp8_f32",
    "qg16_fp8_silu",
    "qg64_fp8_f32",
    "qg64_fp8_silu",
    "qgemm_reduce",
    "qdequant_awq",
    "qdequant_awq_rows",
    "qdequant_fp8",
    "qbytes_fp8",
    // The FP8 decode GEMMs' activations, per token and 128 channels (Gpu::act_quant_fp8_mma).
    "act_quant_fp8",
    "act_quant_fp8_mma_f32",
    "act_quant_fp8_mma_bf16",
    "act_quant_fp8_wg_f32",
    "act_quant_fp8_wg_bf16",
];

/// Kernel name, input channels per stage and dynamic shared memory of a qgemm launch.
fn qg_shape(bm: usize, format: QFormat, silu: bool) -> Result<(&'static str, usize, usize)> {
    let &(_, _, stem, bk, stages) = QG_SHAPES
        .iter()
        .find(|s| s.0 == bm && s.1 == format)
        .ok_or_else(|| KernelError::Invalid(format!("qgemm row tile {bm} (16 or 64)")))?;
    let name = QUANT_KERNELS
        .iter()
        .find(|k| k.starts_with(stem) && k.ends_with(if silu { "_silu" } else { "_f32" }))
        .expect("every shape has both epilogues");
    // Per stage: A tile bm x (bk + 8) bf16, B 16 column blocks x bk/32 units x 32 lanes x words.
    let stage = bm * (bk + 8) * 2 + 16 * (bk / 32) * 32 * format.words_per_lane() * 4;
    Ok((name, bk, stages * stage))
}

impl Gpu {
    /// Runs [`QGemm`] over `w`.
    ///
    /// # Safety
    /// Every address in `w` and `g` is a live device allocation of this context: the weights as
    /// `w.shape` describes them, the input rows and tile lists `g` names, and outputs of `g.rows`
    /// (or the tiles' rows) by `w.shape.n` (times `g.splits` partials).
    pub unsafe fn qgemm(&self, w: &QWeights, g: &QGemm) -> Result<()> {
        let s = w.shape;
        if !QShape::supported(s.k, s.group)
            || (g.silu && (!s.n.is_multiple_of(2) || g.splits > 1))
            || g.splits == 0
            || g.streamk
        {
            return Err(KernelError::Invalid(format!(
                "qgemm needs K % 8 == 0, groups of a power of two >= 32 channels, one split and an even N with SiLU, \
                 and has no stream-K (got N {}, K {}, group {}, splits {}, stream-K {})",
                s.n, s.k, s.group, g.splits, g.streamk
            )));
        }
        let (name, _, smem) = qg_shape(g.bm, s.format, g.silu)?;
        let row_blocks = if g.tiles == 0 { g.rows.div_ceil(g.bm) } else { g.max_tiles };
        let threads = 256;
        let args = g.args(w);
        self.launch(name, (s.n.div_ceil(GG_BN) as u32, row_blocks as u32, g.splits as u32), threads, smem as u32, &args)
    }

    /// Split-K count for a dense [`QGemm`] of `rows` over `w`: enough blocks for two waves, each
    /// split at least two pipeline stages of input channels.
    pub fn qgemm_splits(&self, w: &QWeights, rows: usize, bm: usize) -> usize {
        let blocks = w.shape.n.div_ceil(GG_BN) * rows.div_ceil(bm);
        let stage_k = qg_shape(bm, w.shape.format, false).map_or(32, |s| s.1);
        let stages = w.shape.kp() / stage_k;
        (2 * self.sm_count).div_ceil(blocks.max(1)).clamp(1, (stages / 2).clamp(1, 16))
    }

    /// The f32 `[rows, n]` result of a dense GEMM from its `splits` split-K partials at `part`
    /// (`part + z * rows * n`; one split copies) into `y`, or with `cut` into `y` and `cut.rest`.
    ///
    /// # Safety
    /// `part` holds `splits * rows * n` f32, `y` `rows * n` f32 (with `cut`: `rows * cut.first`, and
    /// `cut.rest` the remaining `rows * (n - cut.first)`): device addresses of this context.
    pub unsafe fn qgemm_reduce(
        &self,
        part: u64,
        y: u64,
        splits: usize,
        rows: usize,
        n: usize,
        cut: Option<QCut>,
    ) -> Result<()> {
        let (first, rest) = match cut {
            None => (n, 0),
            Some(c) if (1..n).contains(&c.first) => (c.first, c.rest),
            Some(c) => {
                return Err(KernelError::Invalid(format!("qgemm_reduce: a cut after column {} of {n}", c.first)));
            }
        };
        if splits == 0 || n > i32::MAX as usize {
            return Err(KernelError::Invalid(format!("qgemm_reduce: {splits} splits of rows of {n}")));
        }
        let total = (rows * n) as u64;
        let args = [Ptr(part), Ptr(y), I32(splits as i32), U64(total), Ptr(rest), I32(n as i32), I32(first as i32)];
        self.launch("qgemm_reduce", (self.grid1(total), 1, 1), 256, 0, &args)
    }

    /// Expands `w` to bf16 `[experts * n, k]` at `out`: AWQ with groups and inputs of a multiple
    /// of 32 by rows of k-tiles (`qdequant_awq_rows`), anything else by the per-value reference.
    ///
    /// # Safety
    /// Every address in `w` is a live device allocation of this context holding the weights as
    /// `w.shape` describes them; `out` holds `experts * n * k` bf16.
    pub unsafe fn qdequant(&self, w: &QWeights, out: u64) -> Result<()> {
        let how = if Self::awq_rows(w) { Expansion::Rows } else { Expansion::PerValue };
        self.qdequant_with(w, out, how)
    }

    fn awq_rows(w: &QWeights) -> bool {
        let s = w.shape;
        s.format == QFormat::AwqInt4 && s.group.is_multiple_of(32) && s.k.is_multiple_of(32) && s.n.is_multiple_of(8)
    }

    /// [`Gpu::qdequant`] by the kernel `how` names, for kernels-check to compare them.
    ///
    /// # Safety
    /// As [`Gpu::qdequant`].
    pub unsafe fn qdequant_with(&self, w: &QWeights, out: u64, how: Expansion) -> Result<()> {
        let s = w.shape;
        let (name, grid) = match (s.format, how) {
            (QFormat::AwqInt4, Expansion::PerValue) => ("qdequant_awq", self.grid1((s.experts * s.n * s.k) as u64)),
            (QFormat::Fp8E4m3, _) => ("qdequant_fp8", self.grid1((s.experts * s.n * s.k) as u64)),
            (QFormat::AwqInt4, Expansion::Rows) if !Self::awq_rows(w) => {
                return Err(KernelError::Invalid(format!(
                    "qdequant_awq_rows: group {} or input {} is not a multiple of 32, or output {} of 8",
                    s.group, s.k, s.n
                )))
            }
            (QFormat::AwqInt4, Expansion::Rows) => {
                // One block per (column block of 8 rows, 16 k-tiles), at most 8 per SM.
                let items = s.experts * (s.n / 8) * (s.k / 32).div_ceil(16);
                if items > i32::MAX as usize {
                    return Err(KernelError::Invalid(format!("qdequant_awq_rows: {items} blocks of work")));
                }
                ("qdequant_awq_rows", items.clamp(1, self.sm_count * 8) as u32)
            }
        };
        let args = [
            Ptr(w.words),
            Ptr(w.scales),
            Ptr(w.zeros),
            Ptr(out),
            I32(s.experts as i32),
            I32(s.n as i32),
            I32(s.k as i32),
            I32(s.np() as i32),
            I32(s.kp() as i32),
            I32(s.group as i32),
        ];
        self.launch(name, (grid, 1, 1), 256, 0, &args)
    }

    /// Matrix 0 of an FP8 stack as row-major e4m3 bytes `[n, k]` at `out` (for
    /// [`Gpu::gemm_fp8_block`]).
    ///
    /// # Safety
    /// Every address in `w` is a live device allocation of this context holding the FP8 weights as
    /// `w.shape` describes them; `out` holds `experts * n * k` bytes.
    pub unsafe fn qbytes_fp8(&self, w: &QWeights, out: u64) -> Result<()> {
        let s = w.shape;
        if s.format != QFormat::Fp8E4m3 || !s.k.is_multiple_of(4) {
            return Err(KernelError::Invalid(format!("qbytes_fp8 takes FP8 weights with K % 4 == 0 (K {})", s.k)));
        }
        let args = [Ptr(w.words), Ptr(out), I32(s.n as i32), I32(s.k as i32), I32(s.np() as i32), I32(s.kp() as i32)];
        self.launch("qbytes_fp8", (self.grid1((s.n * s.k / 4) as u64), 1, 1), 256, 0, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_qgemm_shape_names_compiled_kernels_within_the_shared_memory_opt_in() {
        let module = crate::MODULES.iter().find(|m| m.0 == "quant").expect("quant module");
        for &(bm, format, ..) in &QG_SHAPES {
            for silu in [false, true] {
                let (name, bk, smem) = qg_shape(bm, format, silu).unwrap();
                assert!(module.2.contains(&name), "{name}");
                assert!(128 % bk == 0 && smem <= 110 * 1024, "{name}: two blocks must fit an SM ({smem} bytes)");
            }
        }
        assert!(qg_shape(32, QFormat::AwqInt4, false).is_err());
    }
}
