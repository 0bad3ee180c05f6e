//! Kernel variants: which of the checked implementations of an op the backend launches. Every
//! side of each is checked against the CPU by kernels-check, so any can be the default.

pub use cleave_kernels::ops::{
    MlaDecode, Pdl, PersistentGemm, QPersist, WgmmaGemm, GEMV_MAX_ROWS, ROUTE_ALIGN_MAX_TOKENS,
};
use cleave_kernels::quant::QFormat;
use cleave_kernels::Gpu;

use crate::error::{EngineError, Result};

mod env;

/// Kernel variants, from the environment: `CLEAVE_MLA_DECODE=auto|v1|v2|v3[:HEADS]|v4` (default
/// auto: v4 at 64 heads or more on sm_90a, else v3),
/// `CLEAVE_MOE_GEMM=v1|v2|persistent[:BN/BK/STAGES/PREFETCH]` (default persistent with
/// [`DEFAULT_PERSISTENT`]), `CLEAVE_PREFILL_ATTN=absorbed|expanded` (default expanded),
/// `CLEAVE_FP8_GEMM=tensor-cores|bf16` (default tensor-cores),
/// `CLEAVE_QGEMM=persistent[:[BMx]BN/BK/STAGES]|tiled` (default persistent in
/// [`QPersist::default_for`]), `CLEAVE_MOE_ROWS32=off|32xBN/BK/STAGES/PREFETCH` (default
/// [`DEFAULT_ROWS32`]), `CLEAVE_SHARED_EXPERTS=folded|separate` (default folded; read when a
/// model loads), `CLEAVE_DENSE_GEMV=off|ROWS` (default [`DEFAULT_GEMV_ROWS`]),
/// `CLEAVE_ROUTER_GEMV=off|ROWS` (default [`DEFAULT_ROUTER_GEMV_ROWS`]),
/// `CLEAVE_MLA_PROLOGUE=fused|separate` (default fused), `CLEAVE_PDL=off|light|all` (default
/// [`DEFAULT_PDL`]), `CLEAVE_PREFILL_GEMM=wgmma[:BMxBN/STAGES]|mma` (default wgmma with
/// [`DEFAULT_WGMMA`] on sm_90a), `CLEAVE_PREFILL_FP8=wgmma[:STAGES]|mma` (default wgmma with
/// [`DEFAULT_FP8_WGMMA_STAGES`] on sm_90a), `CLEAVE_QGEMM_ROWS8=off|AVG` (default
/// [`ROWS8_MAX_AVG`]), `CLEAVE_QGEMM_HALVES=off|MIB` (default
/// [`HALVES_MIN_BYTES`]), `CLEAVE_QGEMM_STREAMK=on|off`
/// (default on), `CLEAVE_AWQ_PREFILL=off|ROWS` (default [`AWQ_EXPAND_MIN_AVG`]), and the
/// decode fusions ([`Fusion`]): `CLEAVE_ROUTE_ALIGN=off|TOKENS` (default [`Fusion::DEFAULT`]),
/// `CLEAVE_MOE_END=fused|separate` (default fused), `CLEAVE_MLA_COMBINE=fused|separate` (default
/// fused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variants {
    /// The absorbed MLA decode kernel.
    pub mla: MlaDecode,
    pub gemm_v2: bool,
    /// Prefill-sized bf16 expert batches through the warpgroup-MMA grouped GEMM in this shape (on
    /// sm_90a; elsewhere, or when None, the tiled mma.sync kernel with 64-row tiles).
    pub prefill_gemm: Option<WgmmaGemm>,
    /// Prefill-sized FP8 expert batches through the FP8 wgmma grouped GEMM with this many stages
    /// (W8A8, activations quantized per token per 128 channels; on sm_90a, with
    /// `fp8_tensor_cores`); elsewhere, or when None, the tiled kernel on bf16 tensor cores.
    pub prefill_fp8: Option<usize>,
    /// Prefill-sized AWQ expert batches averaging at least this many rows per expert: the
    /// routed experts expanded to bf16 for the call and run on the bf16 wgmma grouped GEMM
    /// (`prefill_gemm`) instead of the tiled int4 kernel's 64-row tiles; 0: never.
    pub awq_prefill_rows: usize,
    /// Decode-sized expert batches (row tiles of 16) through the persistent grouped GEMM in this
    /// configuration instead of one block per (tile, 128 columns).
    pub moe_persistent: Option<PersistentGemm>,
    /// Expert batches of [`ROWS32_MIN_AVG`] to 32 rows per expert on average: 32-row tiles through
    /// the persistent grouped GEMM in this configuration (with `moe_persistent`), so that an
    /// expert's weights are read once where two 16-row tiles read them twice.
    pub moe_rows32: Option<PersistentGemm>,
    /// Prefill chunks of at least [`EXPAND_MIN_ROWS`] rows: expanded keys/values and cuBLAS
    /// attention instead of the absorbed kernel.
    pub expanded_prefill: bool,
    /// GEMMs over FP8 block-scaled weights on FP8 tensor cores (activations quantized per token
    /// per 128 channels: DeepSeek's scheme) instead of bf16 tensor cores over weights converted
    /// exactly (prefill: cuBLASLt's block-scaled GEMM; decode: the persistent kernel).
    pub fp8_tensor_cores: bool,
    /// Decode GEMMs over compressed weights.
    pub qgemm: QuantGemm,
    /// AWQ expert GEMMs on the persistent kernel share their k-tiles equally among its blocks,
    /// cut items handed over between blocks (stream-K), instead of whole items per block.
    pub qgemm_streamk: bool,
    /// Compressed experts averaging at most this many rows run 8-row tiles where the format has
    /// them (AWQ), else 16-row ones; 0: never.
    pub qgemm_rows8: usize,
    /// With 16-row AWQ expert tiles over expert stacks (gate/up and down) of at least this many
    /// bytes, each expert's last tile of at most 8 rows runs on the 8-row kernel in a launch of
    /// its own; None: never. At 8 rows an expert on average about half the experts then need no
    /// 16-row tile; the second launch's fill and drain cost more than that saves on small stacks.
    pub qgemm_halves: Option<usize>,
    /// Shared experts folded into the routed experts' grouped GEMMs (where the model can: a
    /// rank holding the whole shared MLP, cut on its format's blocks) instead of a dense MLP of
    /// their own; prefill-sized batches still run them as dense GEMMs, reading the folded copy.
    pub fold_shared: bool,
    /// Dense linears over bf16 or f32 weights of at most this many rows (up to
    /// [`GEMV_MAX_ROWS`]) through the GEMV kernel instead of cuBLAS (the first of two projections
    /// of one input, MLA's q and kv_a, in one launch), and at one row (unless 0) MLA's absorbed
    /// projections (W_UK, W_UV) through their per-head GEMV kernels instead of cuBLAS's batched
    /// GEMM; 0: never.
    pub gemv_rows: usize,
    /// Linears over f32 weights (the MoE router's gate) of at most this many rows through the
    /// GEMV kernel (in groups of rows past [`GEMV_MAX_ROWS`], while the groups' weight reads stay
    /// within [`ROUTER_GEMV_MAX_READS`] bytes) instead of cuBLAS's SGEMM; 0: never.
    pub router_gemv_rows: usize,
    /// MLA's q RoPE, latent RMSNorm, latent RoPE and cache write as one kernel
    /// ([`crate::backend::Backend::mla_prologue`]) instead of four.
    pub fused_prologue: bool,
    /// Programmatic dependent launch for the kernels that take it (`ops::pdl_kernels`): each
    /// may be scheduled, and a GEMV start reading its weights, while the kernel before it ends.
    pub pdl: Pdl,
    pub fusion: Fusion,
}

/// Small-batch decode ops done in one kernel where they were two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fusion {
    /// MoE routing and the assignment sort in one block (`moe_route_align`) up to this many
    /// tokens (at most [`ROUTE_ALIGN_MAX_TOKENS`]); 0: never.
    pub route_align: usize,
    /// The MoE combine, the residual add and the next RMSNorm in one kernel (`moe_combine_norm`).
    pub moe_end: bool,
    /// MLA decode's split combine done by the decode kernel's own blocks after a grid barrier
    /// (v3 and v4, where every block of the launch is resident at once) instead of a
    /// `mla_combine` launch.
    pub mla_join: bool,
}

impl Fusion {
    pub const OFF: Fusion = Fusion { route_align: 0, moe_end: false, mla_join: false };
    /// Run 81: a token per warp of `moe_route_align` (at 64 tokens, two per warp, the V2-Lite
    /// step was 2.4% slower than routing and sorting apart); the fused MoE end saved 3% at batch
    /// 1.
    pub const DEFAULT: Fusion = Fusion { route_align: 32, moe_end: true, mla_join: true };
}

/// Which kernel runs decode-sized GEMMs (up to `QGEMM_MAX_ROWS` rows) over compressed weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantGemm {
    /// One block per (row tile, 128 columns), weights converted to bf16 in registers (`qgemm`).
    Tiled,
    /// The persistent kernel (`qg_persistent`) in a forced shape, or each format's default.
    Persistent(Option<QPersist>),
}

impl QuantGemm {
    /// The persistent shape for weights of `format` grouped by `group`, if the persistent kernel
    /// takes them (else the tiled kernel runs), for `rows` on a GPU with warpgroup MMAs (`wgmma`)
    /// or without: a forced shape when it is compiled for the format, fits the grouping and the
    /// GPU and (expert tiles) has tiles of at most 16 rows, else the format's default for the
    /// rows: dense GEMMs of up to 8 rows on 8-row tiles where the format has them (AWQ), up to 16
    /// on 16-row ones, more on 64-row ones; expert tiles as asked (FP8: 16 rows).
    pub fn shape(&self, format: QFormat, group: usize, rows: QRows, wgmma: bool) -> Option<QPersist> {
        let bm = match rows {
            QRows::Dense(r) if r > 16 => 64,
            QRows::Dense(r) if r > 8 => 16,
            QRows::Dense(_) => 8,
            QRows::Tiles(bm) => bm,
        };
        match self {
            QuantGemm::Tiled => None,
            QuantGemm::Persistent(Some(c))
                if c.takes(format, group) && c.runs_with(wgmma) && (matches!(rows, QRows::Dense(_)) || c.bm <= 16) =>
            {
                Some(*c)
            }
            QuantGemm::Persistent(_) => QPersist::default_for(format, group, bm, wgmma),
        }
    }
}

/// The rows a compressed GEMM computes, for [`QuantGemm::shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QRows {
    /// A dense GEMM of this many rows.
    Dense(usize),
    /// Expert tiles of at most this many rows (8 or 16, from `moe_align`).
    Tiles(usize),
}

/// Experts averaging at most this many rows take the 8-row AWQ tiles (run 63, `qgemm_tune`: at
/// 0.5-2 rows per expert, V3's experts at 70-89% of HBM on 8-row tiles against 64-71% on 16-row
/// ones; at V2-Lite's 6 rows, 54% against 54% for gate/up and 37% against 50% for down, some
/// experts then needing two tiles).
pub const ROWS8_MAX_AVG: usize = 4;

/// Expert layers whose compressed gate/up and down stacks take at least this many bytes run half
/// tiles (`Variants::qgemm_halves`). Run 174 (`qgemm_tune`, 64 tokens): the V3 share's 64
/// experts (1.4 GB) gate/up 336.8 -> 313.2 us and down 185.6 -> 171.8 with them; V2-Lite's 64
/// (0.29 GB) 81.5 -> 82.5 and 49.9 -> 51.5 us.
pub const HALVES_MIN_BYTES: usize = 512 << 20;

/// Rows per expert on average from which prefill's AWQ experts are expanded to bf16 for the
/// wgmma GEMM (`Variants::awq_prefill_rows`). The expansion writes the experts' bf16 bytes once
/// per call (54 us per V3 expert on an H200 since `qdequant_awq_rows`, run 106), which the wgmma
/// tiles repay at 0.58 us per row (0.83 on the int4 tiles, 0.25 on wgmma): break-even near 92
/// rows. Four V3 layers with 128 rows per expert: 69.0 -> 63.8 ms (run 106).
pub const AWQ_EXPAND_MIN_AVG: usize = 96;

/// Most rows per expert `CLEAVE_AWQ_PREFILL` takes.
const AWQ_EXPAND_MAX_AVG: usize = 1 << 16;

pub const EXPAND_MIN_ROWS: usize = 64;

/// Which kernels take programmatic dependent launch by default (run 49: every listed kernel made
/// V2-Lite batch 1 1.8% faster and batch 64 2% slower; `light` leaves the bf16 grouped GEMMs
/// out, and since run 88 takes the compressed ones: AWQ/FP8 V2-Lite batch 8 4-5% faster).
pub const DEFAULT_PDL: Pdl = Pdl::Light;

/// Dense linears of up to this many rows run on the GEMV by default: at 8 rows its 8-row
/// instance made the V2-Lite step slower than cuBLAS (6.85 -> 7.17 ms), at 4 faster (5.14 ->
/// 4.95 ms; run 48).
pub const DEFAULT_GEMV_ROWS: usize = 4;

/// The f32 router gate runs on the GEMV up to this many rows (every decode batch up to
/// `max_num_seqs` 256); cuBLAS's SGEMM took about 14 us per layer at 64 and 256 rows (run 90's
/// events profile) for 512 KB of weights.
pub const DEFAULT_ROUTER_GEMV_ROWS: usize = 256;

/// The most bytes of f32 weights the router's GEMV reads over all its row groups (each group
/// reads them again, from L2): V2-Lite's gate (512 KB) up to 128 rows, V3's (7.3 MB) up to 8.
/// Beyond, cuBLAS was as fast or faster (run 92-93's linear stage: V2-Lite at 256 rows equal in
/// the step, V3's 256 x 7168 -> 256 79 us against 46).
pub const ROUTER_GEMV_MAX_READS: usize = 16 << 20;

/// The largest `CLEAVE_ROUTER_GEMV` (beyond, with every 4-row group re-reading the gate, cuBLAS
/// is the better GEMM).
pub const ROUTER_GEMV_MAX_ROWS: usize = 1024;

/// The default persistent grouped-GEMM configuration: the fastest in `kernels-check --stages
/// moe_tune` at the V2-Lite and V3 decode shapes of 16 and 64 tokens (82-98% of HBM bandwidth on
/// an H200, kernels/bench/results/run6-tune.txt) and in whole V2-Lite decode steps.
pub const DEFAULT_PERSISTENT: PersistentGemm = PersistentGemm { bm: 16, bn: 32, bk: 64, stages: 6, prefetch: 0 };

/// The default 32-row configuration (`gg_persistent` with BM 32): the fastest of the compiled
/// 32-row shapes in the V2-Lite batch-256 step (15.44 ms against 16.15-19.99, run 41; 64
/// columns per item halve the activation tile's re-reads).
pub const DEFAULT_ROWS32: PersistentGemm = PersistentGemm { bm: 32, bn: 64, bk: 64, stages: 3, prefetch: 0 };

/// Average rows per expert from which expert batches take 32-row tiles (when configured): at 12
/// (V2-Lite batch 128) 16-row tiles were still 7% faster over the whole step, at 24 (batch 256)
/// 32-row ones 26% (run 40).
pub const ROWS32_MIN_AVG: usize = 16;

/// Pipeline stages of the FP8 wgmma grouped GEMM by default.
pub const DEFAULT_FP8_WGMMA_STAGES: usize = 4;

/// The default wgmma grouped-GEMM shape for prefill-sized bf16 expert batches: the fastest of the
/// compiled shapes on V2-Lite's 4096-token prefill (experts 27.1 ms against 30.1 for 128x128/3
/// and 72.7 for mma.sync; run 55).
pub const DEFAULT_WGMMA: WgmmaGemm = WgmmaGemm { bm: 128, bn: 256, stages: 4 };

impl Variants {
    /// The first kernel versions (a fallback if the defaults regress).
    pub const FIRST: Variants = Variants {
        mla: MlaDecode::V1,
        gemm_v2: false,
        prefill_gemm: None,
        prefill_fp8: None,
        awq_prefill_rows: 0,
        moe_persistent: None,
        moe_rows32: None,
        expanded_prefill: false,
        fp8_tensor_cores: false,
        qgemm: QuantGemm::Tiled,
        qgemm_streamk: false,
        qgemm_rows8: 0,
        qgemm_halves: None,
        fold_shared: false,
        gemv_rows: 0,
        router_gemv_rows: 0,
        fused_prologue: false,
        pdl: Pdl::Off,
        fusion: Fusion::OFF,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use cleave_kernels::ops::QMma;

    #[test]
    fn compressed_gemm_shapes_follow_the_format_and_grouping() {
        use QRows::{Dense, Tiles};
        let cfg = QPersist { bm: 16, bn: 64, bk: 128, stages: 4, mma: QMma::TokensA };
        let forced = QuantGemm::Persistent(Some(cfg));
        assert_eq!(forced.shape(QFormat::AwqInt4, 128, Tiles(8), true), Some(cfg));
        assert_eq!(forced.shape(QFormat::AwqInt4, 128, Dense(64), false), Some(cfg));
        // groups of 64 cannot take 128-channel k-tiles: the format's default instead
        let awq8 = QPersist::default_for(QFormat::AwqInt4, 64, 8, true);
        assert_eq!(forced.shape(QFormat::AwqInt4, 64, Tiles(8), true), awq8);
        let wide = QuantGemm::Persistent(Some(QPersist { bm: 64, bn: 64, bk: 64, stages: 4, mma: QMma::TokensA }));
        assert_eq!(wide.shape(QFormat::AwqInt4, 64, Tiles(8), true).unwrap().bm, 8, "expert tiles as asked");
        // a forced wgmma shape only where the GPU has warpgroup MMAs
        let wg: QPersist = "wg64x64/64/4".parse().unwrap();
        let forced_wg = QuantGemm::Persistent(Some(wg));
        assert_eq!(forced_wg.shape(QFormat::AwqInt4, 64, Dense(64), true), Some(wg));
        assert!(forced_wg.shape(QFormat::AwqInt4, 64, Dense(64), false).is_some_and(|c| c.runs_with(false)));
        let def = QuantGemm::Persistent(None);
        for hopper in [false, true] {
            assert_eq!(def.shape(QFormat::AwqInt4, 64, Tiles(16), hopper).unwrap().bm, 16);
            assert_eq!(def.shape(QFormat::AwqInt4, 64, Dense(16), hopper).unwrap().bm, 16);
            assert_eq!(def.shape(QFormat::AwqInt4, 64, Dense(8), hopper).unwrap().bm, 8);
            assert_eq!(def.shape(QFormat::Fp8E4m3, 128, Tiles(8), hopper).unwrap().bm, 16, "FP8 has no 8-row tiles");
            assert_eq!(def.shape(QFormat::Fp8E4m3, 128, Dense(17), hopper).unwrap().bm, 64);
            assert_eq!(def.shape(QFormat::AwqInt4, 32, Tiles(8), hopper), None);
            assert_eq!(QuantGemm::Tiled.shape(QFormat::Fp8E4m3, 128, Tiles(16), hopper), None);
        }
    }
}
