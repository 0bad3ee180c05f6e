//! MoE launchers: routing, expert alignment, grouped GEMM (tiled v1/v2, persistent and wgmma
//! kernels, one argument layout), the weighted combine, and the f32 reference expert MLP.

use super::{QGemm, QWeights, GG_BN};
use crate::quant::{QFormat, QShape};
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, I32};

/// (bm, bn, bk, stages, f32 kernel, silu kernel) of every compiled persistent grouped-GEMM shape.
pub(super) const GGP_KERNELS: [(usize, usize, usize, usize, &str, &str); 14] = [
    (16, 16, 32, 8, "ggp16_32_8_f32", "ggp16_32_8_silu"),
    (16, 16, 64, 4, "ggp16_64_4_f32", "ggp16_64_4_silu"),
    (16, 16, 64, 8, "ggp16_64_8_f32", "ggp16_64_8_silu"),
    (16, 32, 32, 4, "ggp32_32_4_f32", "ggp32_32_4_silu"),
    (16, 32, 32, 8, "ggp32_32_8_f32", "ggp32_32_8_silu"),
    (16, 32, 64, 4, "ggp32_64_4_f32", "ggp32_64_4_silu"),
    (16, 32, 64, 6, "ggp32_64_6_f32", "ggp32_64_6_silu"),
    (16, 64, 32, 4, "ggp64_32_4_f32", "ggp64_32_4_silu"),
    (16, 64, 32, 6, "ggp64_32_6_f32", "ggp64_32_6_silu"),
    (16, 64, 32, 8, "ggp64_32_8_f32", "ggp64_32_8_silu"),
    (32, 32, 64, 4, "ggpr32_32_64_4_f32", "ggpr32_32_64_4_silu"),
    (32, 32, 64, 5, "ggpr32_32_64_5_f32", "ggpr32_32_64_5_silu"),
    (32, 64, 32, 6, "ggpr32_64_32_6_f32", "ggpr32_64_32_6_silu"),
    (32, 64, 64, 3, "ggpr32_64_64_3_f32", "ggpr32_64_64_3_silu"),
];

/// (bm, bn, stages, threads) of every compiled wgmma grouped-GEMM shape (wgmma.cu); shape i is the
/// kernels `GGW_KERNELS[2 i]` (f32) and `[2 i + 1]` (SiLU).
const GGW_SHAPES: [(usize, usize, usize, u32); 3] = [(128, 128, 3, 128), (128, 256, 3, 256), (128, 256, 4, 256)];
/// Stage counts of the FP8 wgmma grouped GEMM (128 x 256 tiles, a producer and two consumer
/// warpgroups); count i is the kernels `GGW_KERNELS[2 (GGW_SHAPES.len() + i)]` (f32) and the one
/// after it (SiLU), then the same with per-column scales `GGW_FP8_STAGES.len()` pairs later.
const GGW_FP8_STAGES: [usize; 2] = [3, 4];
/// Columns per item of the FP8 wgmma grouped GEMM.
const GGW_FP8_BN: usize = 256;
/// Threads of the FP8 wgmma grouped GEMM: one producer and two consumer warpgroups.
const GGW_FP8_THREADS: u32 = 384;
/// Rows per tile of the FP8 wgmma grouped GEMM (`moe_align` must tile by it).
pub const GGW_FP8_BM: usize = 128;
/// The functions of wgmma.cu.
pub const GGW_KERNELS: &[&str] = &[
    "ggw_128x128_3_f32",
    "ggw_128x128_3_silu",
    "ggw_128x256_3_f32",
    "ggw_128x256_3_silu",
    "ggw_128x256_4_f32",
    "ggw_128x256_4_silu",
    "ggw_fp8_128x256_3_f32",
    "ggw_fp8_128x256_3_silu",
    "ggw_fp8_128x256_4_f32",
    "ggw_fp8_128x256_4_silu",
    "ggw_fp8c_128x256_3_f32",
    "ggw_fp8c_128x256_3_silu",
    "ggw_fp8c_128x256_4_f32",
    "ggw_fp8c_128x256_4_silu",
];

/// The operands of a grouped GEMM over expert row tiles: for each tile (expert e, sorted rows
/// rs..rs+rc) of `tiles`/`meta` (from `moe_align`), `Y[rs + r, :n] = X[row(rs + r), :k] W[e]^T` with
/// `row(p) = rowidx[p]` (or p when `rowidx` is 0). `silu` takes interleaved gate/up columns and
/// writes bf16 `[*, n/2]` = silu(gate) * up, else f32 `[*, n]`.
#[derive(Debug, Clone, Copy)]
pub struct GroupedGemm {
    pub silu: bool,
    pub x: u64,
    pub rowidx: u64,
    pub w: u64,
    pub y: u64,
    pub tiles: u64,
    pub meta: u64,
    pub max_tiles: usize,
    pub n: usize,
    pub k: usize,
}

/// Which grouped-GEMM kernel runs: one block per (tile of `bm` rows, 128 columns), v1 or v2, the
/// persistent decode kernel (`gg_persistent` in moe.cu: one wave of resident blocks, each
/// streaming a balanced range of (row tile, `bn` columns) items through one cp.async pipeline),
/// or the Hopper warpgroup-MMA kernel for prefill sizes (`gg_wgmma`, sm_90a only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmKernel {
    Tiled { v2: bool, bm: usize },
    Persistent(PersistentGemm),
    Wgmma(WgmmaGemm),
}

/// A wgmma grouped-GEMM shape: rows per tile (`moe_align` must tile by it), columns per block and
/// pipeline stages of 64 channels; written `BMxBN/STAGES`, e.g. `128x128/3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaGemm {
    pub bm: usize,
    pub bn: usize,
    pub stages: usize,
}

impl WgmmaGemm {
    /// Every compiled shape.
    pub fn compiled() -> impl Iterator<Item = WgmmaGemm> {
        GGW_SHAPES.iter().map(|&(bm, bn, stages, _)| WgmmaGemm { bm, bn, stages })
    }

    /// The shape's kernel and threads per block.
    fn kernel(&self, silu: bool) -> Result<(&'static str, u32)> {
        let i = GGW_SHAPES
            .iter()
            .position(|s| (s.0, s.1, s.2) == (self.bm, self.bn, self.stages))
            .ok_or_else(|| KernelError::Invalid(format!("wgmma grouped GEMM shape {self} is not compiled")))?;
        Ok((GGW_KERNELS[2 * i + silu as usize], GGW_SHAPES[i].3))
    }

    /// Dynamic shared memory per block: the stages of both operands' 128-byte rows, and 1 KB to
    /// align them to the swizzle's 1024 bytes.
    pub fn smem_bytes(&self) -> usize {
        self.stages * (self.bm + self.bn) * 128 + 1024
    }
}

impl std::fmt::Display for WgmmaGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}/{}", self.bm, self.bn, self.stages)
    }
}

impl std::str::FromStr for WgmmaGemm {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || KernelError::Invalid(format!("wgmma grouped GEMM `{s}`: expected BMxBN/STAGES"));
        let (bm, rest) = s.split_once('x').ok_or_else(bad)?;
        let (bn, stages) = rest.split_once('/').ok_or_else(bad)?;
        let num = |v: &str| v.trim().parse::<usize>().map_err(|_| bad());
        let cfg = WgmmaGemm { bm: num(bm)?, bn: num(bn)?, stages: num(stages)? };
        cfg.kernel(false)?;
        Ok(cfg)
    }
}

/// A persistent decode grouped-GEMM configuration: rows per tile (16, or 32 for 16-32 rows per
/// expert: `moe_align` must tile by it), columns per work item, k-tile width, pipeline stages
/// (together one compiled kernel) and the L2 prefetch distance in k-tiles (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistentGemm {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub stages: usize,
    pub prefetch: usize,
}

impl PersistentGemm {
    /// Default L2 prefetch distance (gg16 v2 prefetches 4 k-tiles ahead too).
    pub const DEFAULT_PREFETCH: usize = 4;

    /// Every compiled shape with the default prefetch distance.
    pub fn compiled() -> impl Iterator<Item = PersistentGemm> {
        GGP_KERNELS.iter().map(|k| PersistentGemm {
            bm: k.0,
            bn: k.1,
            bk: k.2,
            stages: k.3,
            prefetch: Self::DEFAULT_PREFETCH,
        })
    }
}

impl std::fmt::Display for PersistentGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.bm != 16 {
            write!(f, "{}x", self.bm)?;
        }
        write!(f, "{}/{}/{}/{}", self.bn, self.bk, self.stages, self.prefetch)
    }
}

impl std::str::FromStr for PersistentGemm {
    type Err = KernelError;

    /// `[BMx]BN/BK/STAGES/PREFETCH`, e.g. `32/64/4/4` (16-row tiles) or `32x32/64/5/0`; the shape
    /// must be compiled.
    fn from_str(s: &str) -> Result<Self> {
        let bad =
            || KernelError::Invalid(format!("persistent grouped GEMM `{s}`: expected [BMx]BN/BK/STAGES/PREFETCH"));
        let (bm, rest) = match s.split_once('x') {
            Some((bm, rest)) => (bm.trim().parse().map_err(|_| bad())?, rest),
            None => (16, s),
        };
        let v: Vec<usize> = rest.split('/').map(|x| x.trim().parse().map_err(|_| bad())).collect::<Result<_>>()?;
        let [bn, bk, stages, prefetch] = v[..] else { return Err(bad()) };
        let cfg = PersistentGemm { bm, bn, bk, stages, prefetch };
        Gpu::persistent_kernel(cfg, false)?;
        Ok(cfg)
    }
}

impl Gpu {
    /// Grouped GEMM over expert row tiles (see moe.cu) with `kernel`. Both kernels take the same
    /// operands; each reads tiles from `moe_align` with its `bm`.
    ///
    /// # Safety
    /// Every address in `g` is a live device allocation of this context: the input rows, the expert
    /// weights (`experts * n * k` bf16), the tile lists from `moe_align`, and the output rows.
    pub unsafe fn grouped_gemm(&self, kernel: GemmKernel, g: &GroupedGemm) -> Result<()> {
        let (n, k) = (g.n, g.k);
        if k % 8 != 0 || (g.silu && n % 2 != 0) || n > i32::MAX as usize || k > i32::MAX as usize {
            return Err(KernelError::Invalid(format!(
                "grouped GEMM needs K divisible by 8 and, with SiLU, an even N (got N {n}, K {k})"
            )));
        }
        let args =
            [Ptr(g.x), Ptr(g.rowidx), Ptr(g.w), Ptr(g.y), Ptr(g.tiles), Ptr(g.meta), I32(n as i32), I32(k as i32)];
        match kernel {
            GemmKernel::Tiled { v2, bm } => {
                let name = match (bm, g.silu, v2) {
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
                self.launch(name, (n.div_ceil(GG_BN) as u32, g.max_tiles as u32, 1), 128, 0, &args)
            }
            GemmKernel::Persistent(cfg) => {
                // One wave of resident blocks, no more than there are work items.
                let items = g.max_tiles * n.div_ceil(cfg.bn);
                let blocks = (self.persistent_blocks_per_sm(cfg, g.silu)? * self.sm_count).min(items);
                let mut all = args.to_vec();
                all.push(I32(cfg.prefetch.min(1 << 20) as i32));
                self.launch(Self::persistent_kernel(cfg, g.silu)?, (blocks as u32, 1, 1), 128, 0, &all)
            }
            GemmKernel::Wgmma(cfg) => {
                if !self.has_wgmma() {
                    return Err(KernelError::Invalid(format!(
                        "the wgmma grouped GEMM needs sm_90a, not {}",
                        self.arch
                    )));
                }
                let (name, threads) = cfg.kernel(g.silu)?;
                let grid = (n.div_ceil(cfg.bn) as u32, g.max_tiles as u32, 1);
                self.launch(name, grid, threads, cfg.smem_bytes() as u32, &args)
            }
        }
    }

    /// Whether the device runs Hopper's warpgroup MMA (the kernels are compiled for sm_90a).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// Whether the FP8 wgmma grouped GEMM takes weights of `shape`: FP8 with one scale per 128
    /// input channels (one stage's), K a multiple of 128.
    pub fn wgmma_fp8_takes(shape: &QShape) -> bool {
        shape.format == QFormat::Fp8E4m3 && shape.group == 128 && shape.k.is_multiple_of(128)
    }

    /// Whether the FP8 wgmma grouped GEMM runs `stages` stages (a compiled count).
    pub fn fp8_wgmma_stages_compiled(stages: usize) -> bool {
        GGW_FP8_STAGES.contains(&stages)
    }

    /// The FP8 wgmma kernel with `stages` stages and its dynamic shared memory: per stage both
    /// operands' 128-byte rows and their f32 scales, and 1 KB for the alignment. `columns`: the
    /// kernel reading every column's scale rather than two per 128-column block.
    fn fp8_wgmma_kernel(stages: usize, silu: bool, columns: bool) -> Result<(&'static str, usize)> {
        let i = GGW_FP8_STAGES
            .iter()
            .position(|&s| s == stages)
            .ok_or_else(|| KernelError::Invalid(format!("the FP8 wgmma grouped GEMM has no {stages}-stage kernel")))?;
        let i = i + if columns { GGW_FP8_STAGES.len() } else { 0 };
        let name = GGW_KERNELS[2 * (GGW_SHAPES.len() + i) + silu as usize];
        Ok((name, stages * (GGW_FP8_BM + GGW_FP8_BN) * (128 + 4) + 1024))
    }

    /// The grouped GEMM over FP8 expert weights on FP8 tensor cores (`gg_wgmma_fp8`): `g.x` holds
    /// e4m3 activations quantized by [`Gpu::act_quant_fp8`] in [`super::Fp8Order::Wgmma`] and
    /// `g.x_scales` their scales; tiles from `moe_align` with [`GGW_FP8_BM`]. Persistent: as many
    /// blocks as fit at once, each walking (tile, column block) items. `paired_scales`: the
    /// weights have, per group and 128-column block, one scale for the even columns and one for
    /// the odd (DeepSeek's 128 x 128 blocks, gate/up interleaved or not; the faster kernel), else
    /// every column's scale is read.
    ///
    /// # Safety
    /// As [`Gpu::qgemm`], with `g.x` e4m3 and `g.x_scales` its scales.
    pub unsafe fn qgemm_wgmma_fp8(&self, w: &QWeights, g: &QGemm, stages: usize, paired_scales: bool) -> Result<()> {
        let s = w.shape;
        if !self.has_wgmma() || !Self::wgmma_fp8_takes(&s) || g.tiles == 0 {
            return Err(KernelError::Invalid(format!(
                "the FP8 wgmma grouped GEMM needs sm_90a ({}), expert tiles and FP8 experts in 128-channel \
                 blocks with K % 128 == 0 (got {:?}, group {}, K {})",
                self.arch, s.format, s.group, s.k
            )));
        }
        if g.rows.max(1) as u64 * s.k as u64 > u32::MAX as u64 {
            return Err(KernelError::Invalid(format!(
                "the FP8 wgmma grouped GEMM addresses its input with 32-bit offsets: {} rows of {} bytes are too many",
                g.rows, s.k
            )));
        }
        let (name, smem) = Self::fp8_wgmma_kernel(stages, g.silu, !paired_scales)?;
        let args = [
            Ptr(g.x),
            Ptr(g.x_scales),
            Ptr(g.rowidx),
            Ptr(w.words),
            Ptr(w.scales),
            Ptr(g.y),
            Ptr(g.tiles),
            Ptr(g.meta),
            I32(s.n as i32),
            I32(s.k as i32),
            I32(s.np() as i32),
        ];
        let items = s.n.div_ceil(GGW_FP8_BN) * g.max_tiles;
        let blocks = (self.resident_blocks(name, GGW_FP8_THREADS, smem)? * self.sm_count).min(items).max(1);
        self.launch(name, (blocks as u32, 1, 1), GGW_FP8_THREADS, smem as u32, &args)
    }

    fn persistent_kernel(cfg: PersistentGemm, silu: bool) -> Result<&'static str> {
        GGP_KERNELS
            .iter()
            .find(|k| (k.0, k.1, k.2, k.3) == (cfg.bm, cfg.bn, cfg.bk, cfg.stages))
            .map(|k| if silu { k.5 } else { k.4 })
            .ok_or_else(|| KernelError::Invalid(format!("persistent grouped GEMM shape {cfg} is not compiled")))
    }

    /// Resident blocks per SM of a persistent grouped-GEMM shape (the driver's occupancy with the
    /// shared-memory carveout set to its maximum; queried once per kernel and thread).
    pub fn persistent_blocks_per_sm(&self, cfg: PersistentGemm, silu: bool) -> Result<usize> {
        self.resident_blocks(Self::persistent_kernel(cfg, silu)?, 128, 0)
    }

    /// Reference precision: the f32 expert MLP (gate/up with SiLU, then down) per sorted row.
    ///
    /// # Safety
    /// `x` holds the tokens' `h` f32 rows, `sorted_tok` and `row_expert` `rows` u32, `gate_up` and
    /// `down` every expert's f32 weights, `act` `rows * i` f32 and `y` `rows * h` f32: device addresses
    /// of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn moe_f32(
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
    fn persistent_shapes_are_compiled_kernels() {
        let moe = crate::MODULES.iter().find(|m| m.0 == "moe").expect("moe module");
        assert_eq!(PersistentGemm::compiled().count(), GGP_KERNELS.len());
        for cfg in PersistentGemm::compiled() {
            for silu in [false, true] {
                let name = Gpu::persistent_kernel(cfg, silu).expect("compiled");
                assert!(moe.2.contains(&name), "{name} is not in MODULES");
                let epi = if silu { "silu" } else { "f32" };
                let rows = if cfg.bm == 16 { String::new() } else { format!("r{}_", cfg.bm) };
                assert_eq!(name, format!("ggp{rows}{}_{}_{}_{epi}", cfg.bn, cfg.bk, cfg.stages));
            }
            assert_eq!(cfg.to_string().parse::<PersistentGemm>().unwrap(), cfg);
        }
        let r32: PersistentGemm = "32x32/64/5/0".parse().unwrap();
        assert_eq!((r32.bm, r32.bn, r32.stages), (32, 32, 5));
        assert!("32x32/64/6/0".parse::<PersistentGemm>().is_err(), "not compiled with 32-row tiles");
        assert!("128/32/4/4".parse::<PersistentGemm>().is_err());
        assert!("32/64/4".parse::<PersistentGemm>().is_err());
        assert!("a/64/4/4".parse::<PersistentGemm>().is_err());
    }

    #[test]
    fn wgmma_shapes_are_compiled_kernels() {
        assert_eq!(2 * (WgmmaGemm::compiled().count() + 2 * GGW_FP8_STAGES.len()), GGW_KERNELS.len());
        for cfg in WgmmaGemm::compiled() {
            for silu in [false, true] {
                let epi = if silu { "silu" } else { "f32" };
                let (name, threads) = cfg.kernel(silu).unwrap();
                assert_eq!(name, format!("ggw_{}x{}_{}_{epi}", cfg.bm, cfg.bn, cfg.stages));
                assert_eq!(threads % 128, 0, "{cfg}: whole warpgroups");
            }
            assert_eq!(cfg.to_string().parse::<WgmmaGemm>().unwrap(), cfg);
            assert!(cfg.smem_bytes() <= crate::DYN_SMEM_MAX, "{cfg}: over the opt-in limit set in Gpu::new");
        }
        assert!("128x128/5".parse::<WgmmaGemm>().is_err(), "not compiled");
        assert!("64x256/3".parse::<WgmmaGemm>().is_err(), "dropped after run 54");
        let fp8 = QShape { format: QFormat::Fp8E4m3, experts: 4, n: 256, k: 1408, group: 128 };
        assert!(Gpu::wgmma_fp8_takes(&fp8));
        assert!(!Gpu::wgmma_fp8_takes(&QShape { group: 64, ..fp8 }), "one scale per stage of 128 channels");
        assert!(!Gpu::wgmma_fp8_takes(&QShape { k: 1400, ..fp8 }));
        assert!(!Gpu::wgmma_fp8_takes(&QShape { format: QFormat::AwqInt4, ..fp8 }));
        for stages in GGW_FP8_STAGES {
            assert!(Gpu::fp8_wgmma_stages_compiled(stages));
            for (silu, epi) in [(false, "f32"), (true, "silu")] {
                for (columns, tag) in [(false, ""), (true, "c")] {
                    let (name, smem) = Gpu::fp8_wgmma_kernel(stages, silu, columns).unwrap();
                    assert_eq!(name, format!("ggw_fp8{tag}_128x256_{stages}_{epi}"));
                    assert!(smem <= crate::DYN_SMEM_MAX, "{name}: over the opt-in limit set in Gpu::new");
                }
            }
        }
        assert!(Gpu::fp8_wgmma_kernel(6, false, false).is_err());
        assert!("128x128".parse::<WgmmaGemm>().is_err());
        assert!("128/3".parse::<WgmmaGemm>().is_err());
    }
}
