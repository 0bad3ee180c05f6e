//! Launchers of `cu/qdecode.cu`: the persistent decode GEMM over compressed weights (AWQ int4 on
//! bf16 tensor cores, FP8 on FP8 tensor cores) and DeepSeek's FP8 activation quantization in the
//! two layouts its consumers read.

use cudarc::driver::CudaSlice;

use super::quant::{QCut, QGemm, QWeights};
use crate::quant::QFormat;
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, I32};
use QMma::{TokensA, TokensN, Wgmma};

/// A persistent compressed-GEMM configuration: rows and columns per work item, input channels per
/// k-tile, pipeline stages and how the tensor cores take the operands (one compiled kernel per
/// format and epilogue). Rows: 16; 8 (AWQ, [`QMma::TokensN`], for tiles of at most 8 rows); or 64
/// for dense GEMMs of more rows, unpacking each weight once for four MMAs (or, [`QMma::Wgmma`], all
/// 64 tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QPersist {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub stages: usize,
    pub mma: QMma,
}

/// How a persistent compressed GEMM puts its operands on the tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QMma {
    /// `mma.sync` with the tokens as the 16-row A operand and the weights as B.
    TokensA,
    /// `mma.sync` (AWQ, tiles of 8 rows) with the weights as the 16-row A operand and the tokens as
    /// N: half the MMAs and scale folds of [`QMma::TokensA`] for 8 rows.
    TokensN,
    /// Warpgroup MMAs (AWQ, sm_90a, 64 rows): the weights as the 64-row register operand, the
    /// tile's 64 tokens as N read by the tensor cores from shared memory, each weight unpacked once
    /// for all of them.
    Wgmma,
}

/// (format, bm, bn, bk, stages, mma, f32 kernel, silu kernel) of every compiled shape
/// (qdecode.cu's list).
type Compiled = (QFormat, usize, usize, usize, usize, QMma, &'static str, &'static str);

/// Every compiled shape.
const QGP_KERNELS: [Compiled; 19] = [
    (QFormat::AwqInt4, 64, 64, 64, 4, Wgmma, "qgw64_awq_64_64_4_f32", "qgw64_awq_64_64_4_silu"),
    (QFormat::AwqInt4, 8, 256, 64, 4, TokensN, "qgp8_awq_256_64_4_f32", "qgp8_awq_256_64_4_silu"),
    (QFormat::AwqInt4, 8, 128, 64, 6, TokensN, "qgp8_awq_128_64_6_f32", "qgp8_awq_128_64_6_silu"),
    (QFormat::AwqInt4, 16, 64, 64, 8, TokensA, "qgp_awq_64_64_8_f32", "qgp_awq_64_64_8_silu"),
    (QFormat::AwqInt4, 16, 64, 128, 4, TokensA, "qgp_awq_64_128_4_f32", "qgp_awq_64_128_4_silu"),
    (QFormat::AwqInt4, 16, 64, 128, 6, TokensA, "qgp_awq_64_128_6_f32", "qgp_awq_64_128_6_silu"),
    (QFormat::AwqInt4, 16, 128, 64, 6, TokensA, "qgp_awq_128_64_6_f32", "qgp_awq_128_64_6_silu"),
    (QFormat::AwqInt4, 16, 32, 128, 6, TokensA, "qgp_awq_32_128_6_f32", "qgp_awq_32_128_6_silu"),
    (QFormat::AwqInt4, 16, 128, 64, 4, TokensA, "qgp_awq_128_64_4_f32", "qgp_awq_128_64_4_silu"),
    (QFormat::AwqInt4, 16, 128, 64, 8, TokensA, "qgp_awq_128_64_8_f32", "qgp_awq_128_64_8_silu"),
    (QFormat::AwqInt4, 16, 128, 128, 4, TokensA, "qgp_awq_128_128_4_f32", "qgp_awq_128_128_4_silu"),
    (QFormat::AwqInt4, 16, 256, 64, 4, TokensA, "qgp_awq_256_64_4_f32", "qgp_awq_256_64_4_silu"),
    (QFormat::AwqInt4, 64, 64, 64, 4, TokensA, "qgp64_awq_64_64_4_f32", "qgp64_awq_64_64_4_silu"),
    (QFormat::Fp8E4m3, 64, 64, 128, 4, TokensA, "qgp64_fp8_64_128_4_f32", "qgp64_fp8_64_128_4_silu"),
    (QFormat::Fp8E4m3, 16, 64, 128, 4, TokensA, "qgp_fp8_64_128_4_f32", "qgp_fp8_64_128_4_silu"),
    (QFormat::Fp8E4m3, 16, 64, 128, 6, TokensA, "qgp_fp8_64_128_6_f32", "qgp_fp8_64_128_6_silu"),
    (QFormat::Fp8E4m3, 16, 128, 128, 4, TokensA, "qgp_fp8_128_128_4_f32", "qgp_fp8_128_128_4_silu"),
    (QFormat::Fp8E4m3, 16, 32, 128, 8, TokensA, "qgp_fp8_32_128_8_f32", "qgp_fp8_32_128_8_silu"),
    (QFormat::Fp8E4m3, 16, 64, 64, 8, TokensA, "qgp_fp8_64_64_8_f32", "qgp_fp8_64_64_8_silu"),
];

/// The functions of qdecode.cu: every compiled persistent GEMM (which get the opt-in dynamic shared
/// memory), both epilogues.
pub const QDECODE_KERNELS: &[&str] = &qdecode_kernels();

const fn qdecode_kernels() -> [&'static str; 2 * QGP_KERNELS.len()] {
    let mut out = [""; 2 * QGP_KERNELS.len()];
    let mut i = 0;
    while i < QGP_KERNELS.len() {
        out[2 * i] = QGP_KERNELS[i].6;
        out[2 * i + 1] = QGP_KERNELS[i].7;
        i += 1;
    }
    out
}

/// Where [`Gpu::act_quant_fp8_mma`] puts each channel of a 32-channel unit: in the k-slot order of
/// the persistent decode GEMM's MMAs ([`crate::fp8::mma_position`]), or in the byte order of a
/// weight column's piece of the unit, which the FP8 wgmma grouped GEMM reads as it is
/// ([`crate::fp8::wgmma_position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Order {
    Mma,
    Wgmma,
}

impl QPersist {
    /// Every compiled shape for `format`.
    pub fn compiled(format: QFormat) -> impl Iterator<Item = QPersist> {
        QGP_KERNELS.iter().filter(move |k| k.0 == format).map(Self::of)
    }

    fn of(k: &Compiled) -> QPersist {
        QPersist { bm: k.1, bn: k.2, bk: k.3, stages: k.4, mma: k.5 }
    }

    /// The default shape for `format` with groups of `group` channels and row tiles of at most
    /// `bm` rows (8, 16 or 64), if it takes them (a k-tile must lie in one group), on a GPU with
    /// warpgroup MMAs (`wgmma`) or without: the fastest of `kernels-check --stages qgemm_tune` on
    /// the V3 expert shapes at 16 and 64 tokens on an H200 (runs 25 and 63;
    /// kernels/bench/results/). FP8 has no 8-row tiles (16 there).
    /// Row tiles of 64 (`bm` 64) are for dense GEMMs of more than 16 rows; AWQ ones go to wgmma
    /// where the GPU has it (run 157: 20-25% faster at every V3 dense shape).
    pub fn default_for(format: QFormat, group: usize, bm: usize, wgmma: bool) -> Option<QPersist> {
        let shape = |bm, bn, bk, stages, mma| QPersist { bm, bn, bk, stages, mma };
        let pick = match (format, bm) {
            (QFormat::AwqInt4, 64) if wgmma => shape(64, 64, 64, 4, Wgmma),
            (QFormat::AwqInt4, 64) => shape(64, 64, 64, 4, TokensA),
            (QFormat::Fp8E4m3, 64) => shape(64, 64, 128, 4, TokensA),
            (QFormat::AwqInt4, 8) => shape(8, 256, 64, 4, TokensN),
            (QFormat::AwqInt4, _) => shape(16, 256, 64, 4, TokensA),
            (QFormat::Fp8E4m3, _) => shape(16, 128, 128, 4, TokensA),
        };
        pick.takes(format, group).then_some(pick)
    }

    /// Whether this shape runs on a GPU with warpgroup MMAs (`wgmma`) or without.
    pub fn runs_with(&self, wgmma: bool) -> bool {
        self.mma != Wgmma || wgmma
    }

    /// Whether this shape is compiled for `format` and takes groups of `group` channels.
    pub fn takes(&self, format: QFormat, group: usize) -> bool {
        group >= self.bk && Self::compiled(format).any(|c| c == *self)
    }

    fn kernel(&self, format: QFormat, silu: bool) -> Result<&'static str> {
        QGP_KERNELS
            .iter()
            .find(|k| k.0 == format && Self::of(k) == *self)
            .map(|k| if silu { k.7 } else { k.6 })
            .ok_or_else(|| {
                KernelError::Invalid(format!("persistent {} GEMM shape {self} is not compiled", format.name()))
            })
    }

    /// Shared memory of one pipeline stage (mirrors qg_persistent's STAGE: 1024-byte multiples for
    /// wgmma's swizzled operand).
    fn stage_bytes(&self, format: QFormat) -> usize {
        let (xb, wpl, sb) = match format {
            QFormat::AwqInt4 => (2, 1, 2),
            QFormat::Fp8E4m3 => (1, 2, 4),
        };
        let tail = match format {
            QFormat::AwqInt4 => self.bn / 8,
            QFormat::Fp8E4m3 => self.bm,
        };
        let used = self.bm * self.bk * xb + (self.bn / 8) * (self.bk / 32) * 32 * wpl * 4 + self.bn * sb + tail * 4;
        if self.mma == Wgmma {
            used.next_multiple_of(1024)
        } else {
            used
        }
    }

    /// Dynamic shared memory of a block: the stages, and with wgmma 1 KB to align them.
    pub fn smem_bytes(&self, format: QFormat) -> usize {
        self.stages * self.stage_bytes(format) + if self.mma == Wgmma { 1024 } else { 0 }
    }
}

impl std::fmt::Display for QPersist {
    /// `BN/BK/STAGES`, prefixed `BMx` for row tiles other than 16, and before that `wg` for
    /// [`QMma::Wgmma`] (the mma.sync kind follows from the rows: 8 [`QMma::TokensN`], else
    /// [`QMma::TokensA`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.mma == Wgmma {
            write!(f, "wg")?;
        }
        if self.bm != 16 {
            write!(f, "{}x", self.bm)?;
        }
        write!(f, "{}/{}/{}", self.bn, self.bk, self.stages)
    }
}

impl std::str::FromStr for QPersist {
    type Err = KernelError;

    /// `[wg][BMx]BN/BK/STAGES`, e.g. `64/128/6`, `8x256/64/4` or `wg64x64/64/4`; the shape must
    /// be compiled for some format.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || KernelError::Invalid(format!("persistent compressed GEMM `{s}`: expected [wg][BMx]BN/BK/STAGES"));
        let s_trim = s.trim();
        let (wgmma, rest) = match s_trim.strip_prefix("wg") {
            Some(rest) => (true, rest),
            None => (false, s_trim),
        };
        let (bm, rest) = match rest.split_once('x') {
            Some((bm, rest)) => (bm.trim().parse().map_err(|_| bad())?, rest),
            None => (16, rest),
        };
        let v: Vec<usize> = rest.split('/').map(|x| x.trim().parse().map_err(|_| bad())).collect::<Result<_>>()?;
        let [bn, bk, stages] = v[..] else { return Err(bad()) };
        let mma = match (wgmma, bm) {
            (true, _) => Wgmma,
            (false, 8) => TokensN,
            (false, _) => TokensA,
        };
        let cfg = QPersist { bm, bn, bk, stages, mma };
        if !QGP_KERNELS.iter().any(|k| Self::of(k) == cfg) {
            return Err(KernelError::Invalid(format!("persistent compressed GEMM shape {cfg} is not compiled")));
        }
        Ok(cfg)
    }
}

/// The stream-K hand-over buffers of the persistent GEMMs (qdecode.cu): a slot of BM x BN f32
/// partial sums and a flag per block, for the largest grid of any compiled shape. The flags are
/// zero between launches: each block that reads one lowers it.
pub struct StreamK {
    slots: CudaSlice<f32>,
    flags: CudaSlice<u32>,
}

impl Gpu {
    /// [`StreamK`]'s buffers for this GPU, flags zeroed.
    pub(crate) fn streamk_workspace(&self) -> Result<StreamK> {
        let (mut slots, mut flags) = (0, 0);
        for k in QGP_KERNELS {
            let cfg = QPersist::of(&k);
            for name in [k.6, k.7] {
                let blocks = self.resident_blocks(name, 128, cfg.smem_bytes(k.0))? * self.sm_count;
                slots = slots.max(blocks * cfg.bm * cfg.bn);
                flags = flags.max(blocks);
            }
        }
        let sk = StreamK { slots: self.alloc::<f32>(slots)?, flags: self.alloc::<u32>(flags)? };
        // SAFETY: `sk.flags` was just allocated with `flags` u32.
        unsafe { self.memset(crate::ptr(&sk.flags), 0, flags * 4) }?;
        self.sync()?;
        Ok(sk)
    }

    /// Runs [`QGemm`] over `w` with the persistent kernel `cfg`: tiles from `moe_align` with BM
    /// `cfg.bm` (`g.bm`), or `cfg.bm`-row tiles of `rows` dense rows. FP8 weights take the activations as `fp8_quant_mma`
    /// leaves them (`g.x` e4m3, `g.x_scales`); AWQ takes bf16 `g.x`. Split-K (`g.splits`) only
    /// for dense f32 outputs, a divisor of the k-tiles ([`Gpu::qgp_splits`]); stream-K
    /// (`g.streamk`) with one split. A dense f32 result of one split may be cut in two (`cut`).
    ///
    /// # Safety
    /// As [`Gpu::qgemm`]; FP8 weights also read `g.x_scales`, `g.x` then e4m3; with `cut` the output's
    /// last `n - cut.first` columns go to `cut.rest` (`rows` of them).
    pub unsafe fn qgemm_persistent(&self, w: &QWeights, g: &QGemm, cfg: QPersist, cut: Option<QCut>) -> Result<()> {
        let s = w.shape;
        let kt = s.kp() / cfg.bk;
        let fp8_ok = s.format != QFormat::Fp8E4m3 || (s.k.is_multiple_of(128) && g.x_scales != 0);
        let cut_ok = cut.is_none_or(|c| g.tiles == 0 && !g.silu && g.splits == 1 && (1..s.n).contains(&c.first));
        if !cfg.takes(s.format, s.group)
            || !s.k.is_multiple_of(8)
            || (g.silu && (!s.n.is_multiple_of(2) || g.splits > 1))
            || g.splits == 0
            || !kt.is_multiple_of(g.splits)
            || (g.tiles != 0 && (g.splits > 1 || cfg.bm != g.bm))
            || (g.streamk && g.splits > 1)
            || !fp8_ok
            || !cut_ok
        {
            return Err(KernelError::Invalid(format!(
                "persistent {} GEMM {cfg}: needs groups of at least {} channels, K % 8 == 0 (FP8: K % 128 == 0 and \
                 activation scales), an even N with SiLU and splits dividing the {kt} k-tiles, splits for dense GEMMs \
                 only and not with stream-K, expert tiles of {} rows, a cut only of a dense f32 result of one split \
                 (got N {}, K {}, group {}, splits {}, tiles of {} rows, cut after {:?})",
                s.format.name(),
                cfg.bk,
                cfg.bm,
                s.n,
                s.k,
                s.group,
                g.splits,
                g.bm,
                cut.map(|c| c.first)
            )));
        }
        if !cfg.runs_with(self.has_wgmma()) {
            return Err(KernelError::Invalid(format!("persistent GEMM {cfg}: warpgroup MMAs need sm_90a")));
        }
        let name = cfg.kernel(s.format, g.silu)?;
        let smem = cfg.smem_bytes(s.format);
        let row_tiles = if g.tiles == 0 { g.rows.div_ceil(cfg.bm) } else { g.max_tiles };
        let items = row_tiles * s.n.div_ceil(cfg.bn) * g.splits;
        // Stream-K: at least MIN_STREAMK_STEPS k-tiles per block, so that its pipeline fills.
        let work = if g.streamk { (items * kt).div_ceil(MIN_STREAMK_STEPS) } else { items };
        let blocks = (self.resident_blocks(name, 128, smem)? * self.sm_count).min(work).max(1);
        let (ws, flags) = match (g.streamk, self.streamk.get()) {
            (false, _) => (0, 0),
            (true, Some(sk)) if blocks * cfg.bm * cfg.bn <= sk.slots.len() && blocks <= sk.flags.len() => {
                (crate::ptr(&sk.slots), crate::ptr(&sk.flags))
            }
            (true, _) => {
                return Err(KernelError::Invalid(format!(
                    "persistent GEMM {cfg}: no stream-K buffers for {blocks} blocks"
                )))
            }
        };
        let (first, rest) = cut.map_or((s.n, 0), |c| (c.first, c.rest));
        let mut args = g.args(w).to_vec();
        args.extend([Ptr(g.x_scales), I32(g.splits as i32), Ptr(ws), Ptr(flags), Ptr(rest), I32(first as i32)]);
        self.launch(name, (blocks as u32, 1, 1), 128, smem as u32, &args)
    }

    /// Split-K count for a dense persistent GEMM of `rows` over `w`: see `split_count`.
    pub fn qgp_splits(&self, w: &QWeights, rows: usize, cfg: QPersist) -> Result<usize> {
        let s = w.shape;
        let kt = s.kp() / cfg.bk;
        let items = rows.div_ceil(cfg.bm) * s.n.div_ceil(cfg.bn);
        let blocks = self.resident_blocks(cfg.kernel(s.format, false)?, 128, cfg.smem_bytes(s.format))? * self.sm_count;
        let bytes = SplitBytes { weights: (s.bytes() / s.experts) as f64, partial: (rows * s.n * 4) as f64 };
        Ok(split_count(kt, items, blocks, bytes))
    }

    /// DeepSeek's activation quantization for [`Gpu::qgemm_persistent`] and
    /// [`Gpu::qgemm_wgmma_fp8`] (`crate::fp8::act_quant` is the reference; the bytes are permuted
    /// within each 32-channel unit in `order`, see qdecode.cu): f32 or bf16 `x [rows, k]` -> e4m3
    /// `[rows, k]` at `q`, f32 scales `[rows, k / 128]` at `scales`.
    ///
    /// # Safety
    /// `x` holds `rows * k` f32 (or bf16 with `bf16`), `q` `rows * k` bytes and `scales`
    /// `rows * k / 128` f32: device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn act_quant_fp8_mma(
        &self,
        order: Fp8Order,
        x: u64,
        bf16: bool,
        rows: usize,
        k: usize,
        q: u64,
        scales: u64,
    ) -> Result<()> {
        let name = match (order, bf16) {
            (Fp8Order::Mma, true) => "act_quant_fp8_mma_bf16",
            (Fp8Order::Mma, false) => "act_quant_fp8_mma_f32",
            (Fp8Order::Wgmma, true) => "act_quant_fp8_wg_bf16",
            (Fp8Order::Wgmma, false) => "act_quant_fp8_wg_f32",
        };
        self.act_quant(name, x, rows, rows, k, q, scales)
    }

    /// Quantizes f32 activations `x [rows, k]` per token per 128 channels (`crate::fp8::act_quant`
    /// is the reference): e4m3 `[rows_p, k]` at `q`, token-major f32 scales `[k / 128, rows_p]` at
    /// `scales`, `rows_p = fp8::padded_rows(rows)` (the block-scaled prefill GEMM's layout).
    ///
    /// # Safety
    /// `x` holds `rows * k` f32, `q` `rows_p * k` bytes and `scales` `rows_p * k / 128` f32
    /// (`rows_p = fp8::padded_rows(rows)`): device addresses of this context.
    pub unsafe fn act_quant_fp8(&self, x: u64, rows: usize, k: usize, q: u64, scales: u64) -> Result<()> {
        self.act_quant("act_quant_fp8", x, rows, crate::fp8::padded_rows(rows), k, q, scales)
    }

    /// # Safety
    /// As [`Gpu::act_quant_fp8`] (`rows_p` rows of output).
    #[allow(clippy::too_many_arguments)]
    unsafe fn act_quant(
        &self,
        name: &'static str,
        x: u64,
        rows: usize,
        rows_p: usize,
        k: usize,
        q: u64,
        s: u64,
    ) -> Result<()> {
        if !k.is_multiple_of(crate::fp8::BLOCK) {
            return Err(KernelError::Invalid(format!("{name} needs K % 128 == 0 (K {k})")));
        }
        let threads = (rows_p * (k / crate::fp8::BLOCK) * 32) as u64;
        let args = [Ptr(x), Ptr(q), Ptr(s), I32(rows as i32), I32(rows_p as i32), I32(k as i32)];
        self.launch(name, (threads.div_ceil(256) as u32, 1, 1), 256, 0, &args)
    }
}

/// The fewest k-tiles a stream-K block takes (as [`MIN_SPLIT_KTILES`] for a split).
const MIN_STREAMK_STEPS: usize = 4;

/// The fewest k-tiles a split takes: below four an item's own costs (its sources, its epilogue)
/// outweigh a better balance (run 68: V3 o_proj at one row on 128 splits of two k-tiles, 39.9
/// against 32.5 us on 32 splits).
const MIN_SPLIT_KTILES: usize = 4;

/// What a split-K GEMM moves: its weights (once, whatever the splits) and one split's f32
/// partial sums (written, then read by `qgemm_reduce`).
#[derive(Debug, Clone, Copy)]
struct SplitBytes {
    weights: f64,
    partial: f64,
}

/// The split of `kt` k-tiles (a divisor leaving at least [`MIN_SPLIT_KTILES`] per split) with the least estimated
/// time for `items` work items per split on `blocks` resident blocks: the weights' bytes over the
/// share of the busiest block's items that the others match (each block takes whole items, so
/// `n` items take `ceil(n / blocks)` rounds), plus the partial sums' bytes written and read;
/// among the splits that give every block an item when there are such. The fewest splits among
/// equals.
fn split_count(kt: usize, items: usize, blocks: usize, bytes: SplitBytes) -> usize {
    let balance = |n: usize| n as f64 / (n.div_ceil(blocks).max(1) * blocks) as f64;
    let cost = |d: usize| bytes.weights / balance(items * d) + if d > 1 { 2.0 * bytes.partial * d as f64 } else { 0.0 };
    let ok: Vec<usize> =
        (1..=kt).filter(|d| kt.is_multiple_of(*d) && (kt / d >= MIN_SPLIT_KTILES || *d == 1)).collect();
    let full: Vec<usize> = ok.iter().copied().filter(|d| items * d >= blocks).collect();
    let pool = if full.is_empty() { ok } else { full };
    pool.into_iter().fold((1, f64::INFINITY), |best, d| if cost(d) < best.1 * 0.99 { (d, cost(d)) } else { best }).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiled_shapes_fit_an_sm() {
        // (That each named kernel exists: lib.rs every_module_defines_its_kernels, QDECODE_KERNELS
        // being built from the shape table.)
        for f in [QFormat::AwqInt4, QFormat::Fp8E4m3] {
            for cfg in QPersist::compiled(f) {
                assert!(cfg.smem_bytes(f) <= 100 * 1024, "{cfg}: two blocks must fit an SM");
                assert_eq!(cfg.to_string().parse::<QPersist>().unwrap(), cfg);
            }
        }
        for (bm, hopper) in [8, 16, 64].into_iter().flat_map(|bm| [(bm, false), (bm, true)]) {
            let awq = |group| QPersist::default_for(QFormat::AwqInt4, group, bm, hopper);
            assert_eq!(awq(64).unwrap().bk, 64);
            assert_eq!(awq(64).unwrap().bm, bm);
            assert!(awq(64).unwrap().runs_with(hopper), "wgmma only where the GPU has it");
            assert_eq!(awq(128), awq(64));
            assert!(awq(32).is_none());
            let fp8 = QPersist::default_for(QFormat::Fp8E4m3, 128, bm, hopper);
            assert!(fp8.is_some_and(|c| c.bm >= bm && c.mma == TokensA));
        }
        assert!("64/128".parse::<QPersist>().is_err() && "16/16/2".parse::<QPersist>().is_err());
        let shape = |bm, bn, mma| QPersist { bm, bn, bk: 64, stages: 4, mma };
        assert_eq!("64x64/64/4".parse::<QPersist>().unwrap(), shape(64, 64, TokensA));
        assert_eq!("wg64x64/64/4".parse::<QPersist>().unwrap(), shape(64, 64, Wgmma));
        assert_eq!("8x256/64/4".parse::<QPersist>().unwrap(), shape(8, 256, TokensN));
        assert_eq!("256/64/4".parse::<QPersist>().unwrap(), shape(16, 256, TokensA));
        assert!("32x64/64/4".parse::<QPersist>().is_err() && "wg256/64/4".parse::<QPersist>().is_err());
    }

    #[test]
    fn splits_divide_the_k_tiles_and_balance_the_blocks() {
        let one_row = SplitBytes { weights: 58.7e6, partial: 7168.0 * 4.0 };
        // V3 o_proj at one row: 28 column blocks on 528 blocks; 32 splits give 896 items (1.7
        // rounds of 2), as many as 64 would (3.4 of 4); 128 would leave two k-tiles per split.
        assert_eq!(split_count(256, 28, 528, one_row), 32);
        // V3's dense gate/up at one row: 144 column blocks; 7 splits give 1,008 items (1.9 of 2
        // rounds) where 4 (the fewest that fill the blocks) give 576 (1.1 of 2).
        assert_eq!(split_count(112, 144, 528, one_row), 7);
        // Enough items already: no split.
        assert_eq!(split_count(16, 528, 528, one_row), 1);
        // Large partial sums (many rows) keep the splits fewer than filling every block would
        // take (16): 4 splits cost 4 x 2 x 0.5 MB of partial sums for half the blocks busy.
        let many_rows = SplitBytes { weights: 2.0e6, partial: 64.0 * 2048.0 * 4.0 };
        assert_eq!(split_count(32, 64, 528, many_rows), 4);
        // Every answer divides the k-tiles and leaves at least MIN_SPLIT_KTILES per split (or none).
        for kt in 1..40 {
            let d = split_count(kt, 3, 400, one_row);
            assert!(kt.is_multiple_of(d) && (kt / d >= MIN_SPLIT_KTILES || d == 1), "kt {kt}: {d}");
        }
    }
}
