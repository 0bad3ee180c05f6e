//! The absorbed MLA decode kernels' launch shapes: which kernel a launch takes, its block and
//! shared memory, and how a context is split over blocks.

use std::fmt;

/// Keys per tile of the decode kernels but v4 (must match attention.cu `TT` and mla_decode.cu
/// `V3_TT`).
pub const MLA_TILE: usize = 32;
/// Keys per tile of v4 (mla_decode4.cu `V4_TT`): one cache block.
const V4_TILE: usize = 64;
/// The largest latent width the decode kernels take.
pub const MLA_MAX_LATENT: usize = 512;
/// Heads per block of v1 and v2 (attention.cu `HB`).
const V12_HEADS: usize = 16;
/// The mla_decode module's kernels: v3 by heads per block (mla_decode.cu), then v4 (mla_decode4.cu).
pub const MLA_DECODE_KERNELS: &[&str] = &["mla_decode3_h16", "mla_decode3_h32", "mla_decode3_h64", MLA4_KERNEL];
/// v4: warpgroup MMAs, 64 heads per block (sm_90a).
pub const MLA4_KERNEL: &str = "mla_decode4_h64";
/// v4's shared memory: the query and two key tiles (64 x 576 bf16 each), the running maxima, two
/// rescales and two warpgroups' sums (64 f32 each), 18 mbarriers (one per key buffer and
/// 64-column block), and 1 KB to align it all to the wgmma swizzle (mla_decode4.cu `V4_SMEM`: the
/// kernel traps when launched with less). More than [`crate::DYN_SMEM_MAX`]:
/// [`crate::Gpu::smem_limit`] grants it the device's whole opt-in.
const MLA4_SMEM: usize = 3 * 64 * 576 * 2 + 5 * 64 * 4 + 2 * 9 * 8 + 1024;
/// `mla_combine`'s instances (attention.cu), smallest first, and the most splits each holds in
/// registers: a launch takes the first that holds its split count.
pub const MLA_COMBINE_KERNELS: &[&str] = &["mla_combine8", "mla_combine16", "mla_combine"];
pub const MLA_COMBINE_SPLITS: [usize; 3] = [8, 16, MLA_MAX_SPLITS];
/// The most splits a row's keys are dealt over (the largest `mla_combine` instance).
pub const MLA_MAX_SPLITS: usize = 64;
/// The shape v3 is compiled for: latent 512, rope 64, cache blocks of 64 keys.
const V3_SHAPE: (usize, usize, usize) = (512, 64, 64);

/// The fewest rows [`MlaDecode::Auto`] gives v4 where it would take it. Below, v3 with 16 heads
/// a block (measured at 128 heads; fewer heads keep v3's default): more, shorter blocks, each
/// loading a quarter of v4's query and storing a quarter of its partial sums. Four V3 layers in
/// AWQ (runs 181-182), v3:16 against v4: batch 1 1.216 / 1.221 against 1.234 / 1.226 ms, 2 1.354
/// against 1.382; 4 1.593 against 1.574, 8 1.652 against 1.596.
pub const MLA4_MIN_ROWS: usize = 3;

/// Which absorbed MLA decode kernel runs (`CLEAVE_MLA_DECODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlaDecode {
    /// The default: v4 where a block's 64 heads are filled on a GPU with warpgroup MMA, else v3
    /// by the head count; v3 with 16 heads a block in v4's place below `MLA4_MIN_ROWS` rows.
    Auto,
    /// `mla_decode`: 16 heads per block, MMA operands as 32-bit shared loads.
    V1,
    /// `mla_decode2` (`mla_decode2_dsv` at the DeepSeek shape): 16 heads per block.
    V2,
    /// `mla_decode3_h{16,32,64}` at the DeepSeek shape (other shapes take v2): one key tile read
    /// by 16, 32 or 64 heads; `None` picks by the head count ([`MlaDecode::v3_heads`]).
    V3(Option<usize>),
    /// `mla_decode4_h64` at the DeepSeek shape on sm_90a (v3 elsewhere): warpgroup MMAs, 64 heads
    /// and 64 keys a tile.
    V4,
}

impl MlaDecode {
    /// The heads per block v3 is compiled for.
    pub const V3_HEADS: [usize; 3] = [16, 32, 64];

    /// Heads per block v3 takes by default: the largest of 64, 32, 16 that the heads fill.
    pub fn v3_heads(heads: usize) -> usize {
        Self::V3_HEADS.into_iter().rev().find(|&h| heads >= h).unwrap_or(16)
    }
}

impl fmt::Display for MlaDecode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlaDecode::V1 => write!(f, "v1"),
            MlaDecode::V2 => write!(f, "v2"),
            MlaDecode::V3(None) => write!(f, "v3"),
            MlaDecode::V3(Some(h)) => write!(f, "v3:{h}"),
            MlaDecode::V4 => write!(f, "v4"),
            MlaDecode::Auto => write!(f, "auto"),
        }
    }
}

impl std::str::FromStr for MlaDecode {
    type Err = String;
    /// `auto`, `v1`, `v2`, `v3`, `v3:HEADS` (16, 32 or 64 heads per block) or `v4`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(MlaDecode::Auto),
            "v4" => Ok(MlaDecode::V4),
            "v1" => Ok(MlaDecode::V1),
            "v2" => Ok(MlaDecode::V2),
            "v3" => Ok(MlaDecode::V3(None)),
            _ => match s.strip_prefix("v3:").map(str::parse::<usize>) {
                Some(Ok(h)) if Self::V3_HEADS.contains(&h) => Ok(MlaDecode::V3(Some(h))),
                _ => Err(format!("`{s}` is not one of auto, v1, v2, v3, v3:16, v3:32, v3:64, v4")),
            },
        }
    }
}

/// A decode kernel chosen for a launch: its name, block size, heads per block and dynamic shared
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaKernel {
    pub name: &'static str,
    pub threads: u32,
    pub heads_per_block: usize,
    pub smem: usize,
    /// Keys per tile: a split is a whole number of them.
    pub tile: usize,
    /// v3's and v4's argument list (no latent, rope or block widths: they are compiled in).
    pub(crate) fixed_shape: bool,
}

impl MlaKernel {
    /// Whether this kernel at `splits` writes the attention output itself (v3 or v4 with one split),
    /// so that no [`crate::Gpu::mla_combine`] runs.
    pub fn writes_output(&self, splits: usize) -> bool {
        self.fixed_shape && splits == 1
    }

    /// Whether this kernel at `splits` can merge its own splits ([`crate::ops::MlaOut::Joined`]):
    /// v3 and v4 with more than one. Their grid barrier needs every block resident at once,
    /// which [`MlaLaunch::splits`] keeps (a launch that splits fits one wave) and
    /// [`crate::Gpu::mla_decode`] checks.
    pub fn merges_splits(&self, splits: usize) -> bool {
        self.fixed_shape && splits > 1
    }
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
    /// Longest context any row may have: the step's longest, or the bound a captured step serves.
    pub max_ctx: usize,
}

impl MlaLaunch {
    /// The kernel `which` names for these dimensions on a GPU with (`wgmma`) or without warpgroup
    /// MMA: v3 and v4 only at the DeepSeek shape (v2 elsewhere), v4 only with `wgmma` (v3
    /// without), v2's DeepSeek-shape build where it applies.
    pub fn kernel(&self, which: MlaDecode, wgmma: bool) -> MlaKernel {
        let deepseek = (self.kv_lora, self.rope, self.block_size) == V3_SHAPE;
        let which = match which {
            MlaDecode::Auto if wgmma && self.heads >= 64 && self.rows >= MLA4_MIN_ROWS => MlaDecode::V4,
            MlaDecode::Auto if wgmma && self.heads >= 64 => MlaDecode::V3(Some(16)),
            MlaDecode::Auto => MlaDecode::V3(None),
            MlaDecode::V4 if !wgmma => MlaDecode::V3(None),
            w => w,
        };
        match which {
            MlaDecode::V4 if deepseek => MlaKernel {
                name: MLA4_KERNEL,
                threads: 256,
                heads_per_block: 64,
                smem: MLA4_SMEM,
                tile: V4_TILE,
                fixed_shape: true,
            },
            MlaDecode::V3(h) if deepseek => {
                // (an uncompiled head count, only constructible in code, takes 16)
                let (name, hb, stages) = match h.unwrap_or_else(|| MlaDecode::v3_heads(self.heads)) {
                    64 => ("mla_decode3_h64", 64, 3),
                    32 => ("mla_decode3_h32", 32, 2),
                    _ => ("mla_decode3_h16", 16, 2),
                };
                let (g, w, tt) = (hb / 16, V3_SHAPE.0 + V3_SHAPE.1, MLA_TILE);
                // keys [stages][TT][W + 8] bf16, partial scores [G][4][16][TT + 8] f32,
                // probabilities [16G][TT + 8] bf16, (max, sum, scale) per head
                let smem = stages * tt * (w + 8) * 2 + g * (4 * 16 * (tt + 8) * 4 + 16 * (tt + 8) * 2 + 3 * 16 * 4);
                MlaKernel { name, threads: 8 * hb as u32, heads_per_block: hb, smem, tile: tt, fixed_shape: true }
            }
            _ => {
                let name = match (which, deepseek) {
                    (MlaDecode::V1, _) => "mla_decode",
                    (_, true) => "mla_decode2_dsv",
                    _ => "mla_decode2",
                };
                let smem = self.v12_smem();
                MlaKernel { name, threads: 128, heads_per_block: V12_HEADS, smem, tile: MLA_TILE, fixed_shape: false }
            }
        }
    }

    /// Dynamic shared memory of v1 and v2 for this latent width (attention.cu's layout).
    fn v12_smem(&self) -> usize {
        let w = self.kv_lora + self.rope;
        let s = w.div_ceil(16) * 16 + 8;
        let (hb, tt) = (V12_HEADS, MLA_TILE);
        hb * s * 2 + 2 * (tt * s + 64) * 2 + hb * tt * 4 + hb * (tt + 8) * 2 + 3 * hb * 4
    }

    /// How many splits each row's keys are dealt over (each split a whole number of tiles of
    /// the row, found by the kernel from the row's own length) for kernel `k` with `per_sm`
    /// resident blocks per SM: enough blocks for one wave when the rows allow it, no more splits
    /// than `max_ctx` has tiles, at most [`MLA_MAX_SPLITS`].
    pub fn splits(&self, k: &MlaKernel, sm_count: usize, per_sm: usize) -> usize {
        let tiles = self.max_ctx.div_ceil(k.tile).max(1);
        let base = self.rows * self.heads.div_ceil(k.heads_per_block);
        let want = ((per_sm.max(1) * sm_count) / base.max(1)).max(1);
        want.clamp(1, tiles.min(MLA_MAX_SPLITS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lite() -> MlaLaunch {
        MlaLaunch {
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
        }
    }

    #[test]
    fn splits_fill_one_wave_within_the_context() {
        let p = lite();
        let k = p.kernel(MlaDecode::V2, false);
        assert!(k.smem < crate::DYN_SMEM_MAX);
        assert_eq!(p.splits(&k, 132, 2), 64);
        let big = MlaLaunch { rows: 4096, ..p };
        assert_eq!(big.splits(&k, 132, 2), 1);
        let short = MlaLaunch { max_ctx: 1, ..p };
        assert_eq!(short.splits(&k, 132, 2), 1);
        let b16 = MlaLaunch { rows: 16, ..p };
        assert_eq!(b16.splits(&k, 132, 2), 16);
    }

    #[test]
    fn v3_takes_the_deepseek_shape_and_fills_its_blocks() {
        let v3 = MlaLaunch { heads: 128, ..lite() };
        let k = v3.kernel(MlaDecode::V3(None), false);
        assert_eq!((k.name, k.threads, k.heads_per_block), ("mla_decode3_h64", 512, 64));
        assert!(k.smem < crate::DYN_SMEM_MAX);
        assert_eq!(lite().kernel(MlaDecode::V3(None), false).name, "mla_decode3_h16");
        assert_eq!(lite().kernel(MlaDecode::V3(Some(32)), false).threads, 256);
        let odd_heads = lite().kernel(MlaDecode::V3(Some(48)), false);
        assert_eq!((odd_heads.name, odd_heads.threads, odd_heads.heads_per_block), ("mla_decode3_h16", 128, 16));
        // 64 rows x 2 blocks of 64 heads on 132 SMs at one block per SM: one split
        let b64 = MlaLaunch { rows: 64, max_ctx: 2048, ..v3 };
        assert_eq!(b64.splits(&k, 132, 1), 1);
        let odd = MlaLaunch { kv_lora: 256, ..v3 };
        assert_eq!(odd.kernel(MlaDecode::V3(None), false).name, "mla_decode2");
        assert_eq!(lite().kernel(MlaDecode::V1, false).name, "mla_decode");
    }

    #[test]
    fn v4_takes_64_heads_on_hopper_and_splits_by_its_tile() {
        let v3 = MlaLaunch { heads: 128, max_ctx: 2048, rows: MLA4_MIN_ROWS, ..lite() };
        let k = v3.kernel(MlaDecode::Auto, true);
        assert_eq!((k.name, k.threads, k.heads_per_block, k.tile), (MLA4_KERNEL, 256, 64, 64));
        // Hopper's opt-in (227 KB), which `FULL_SMEM_KERNELS` grants it.
        assert!(k.smem > crate::DYN_SMEM_MAX && k.smem <= 227 * 1024);
        assert!(crate::FULL_SMEM_KERNELS.contains(&k.name));
        // Without warpgroup MMA, or with fewer heads than a block, the default is v3's.
        assert_eq!(v3.kernel(MlaDecode::Auto, false).name, "mla_decode3_h64");
        assert_eq!(v3.kernel(MlaDecode::V4, false).name, "mla_decode3_h64");
        assert_eq!(lite().kernel(MlaDecode::Auto, true).name, "mla_decode3_h16");
        // Named, it takes any head count (a block's missing heads are zero queries).
        assert_eq!(lite().kernel(MlaDecode::V4, true).name, MLA4_KERNEL);
        assert_eq!(MlaLaunch { kv_lora: 256, ..v3 }.kernel(MlaDecode::V4, true).name, "mla_decode2");
        // Splits are whole 64-key tiles: at most 32 over 2,048 keys.
        let one = MlaLaunch { rows: 1, ..v3 };
        assert_eq!(one.splits(&k, 132, 1), 32);
        // Fewer rows take v3 with 16 heads a block by default.
        let few = MlaLaunch { rows: MLA4_MIN_ROWS - 1, ..v3 };
        assert_eq!(few.kernel(MlaDecode::Auto, true).name, "mla_decode3_h16");
        assert_eq!(few.kernel(MlaDecode::V4, true).name, MLA4_KERNEL);
        assert!(k.writes_output(1) && !k.writes_output(2));
    }

    #[test]
    fn only_v3_at_one_split_writes_its_output() {
        // kernels-check's "decode, one split" case: 300 rows of 16 heads at up to 3 blocks per SM.
        let p = MlaLaunch { rows: 300, max_ctx: 100, ..lite() };
        let v3 = p.kernel(MlaDecode::V3(None), false);
        for per_sm in 1..=3 {
            assert_eq!(p.splits(&v3, 132, per_sm), 1);
        }
        assert!(v3.writes_output(1) && !v3.writes_output(2));
        assert!(!p.kernel(MlaDecode::V2, false).writes_output(1));
        // 64 rows of 16 heads split their keys: the combine runs.
        let b64 = MlaLaunch { rows: 64, max_ctx: 1024, ..lite() };
        assert!(!v3.writes_output(b64.splits(&v3, 132, 2)));
    }

    #[test]
    fn split_launches_fit_one_wave() {
        // A kernel merging its own splits needs every block resident at once; the split count
        // keeps a launch that splits within one wave, so `merges_splits` needs no occupancy.
        for heads in [16, 32, 128] {
            for rows in [1, 2, 3, 7, 16, 64, 131, 133, 256, 300] {
                for max_ctx in [1, 33, 1024, 2000, 8192] {
                    let p = MlaLaunch { heads, rows, max_ctx, ..lite() };
                    for which in [MlaDecode::Auto, MlaDecode::V3(None), MlaDecode::V3(Some(16)), MlaDecode::V4] {
                        let k = p.kernel(which, true);
                        for per_sm in 1..=3 {
                            let splits = p.splits(&k, 132, per_sm);
                            let blocks = rows * heads.div_ceil(k.heads_per_block) * splits;
                            assert!(
                                !k.merges_splits(splits) || blocks <= per_sm * 132,
                                "{heads}h {rows} rows {max_ctx}: {splits} splits"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn settings_round_trip() {
        for s in ["auto", "v1", "v2", "v3", "v3:16", "v3:32", "v3:64", "v4"] {
            assert_eq!(s.parse::<MlaDecode>().unwrap().to_string(), s);
        }
        for bad in ["v5", "v3:8", "v3:", "v3:x", "v3:64/3", "v4:64"] {
            assert!(bad.parse::<MlaDecode>().unwrap_err().contains(bad));
        }
    }
}
