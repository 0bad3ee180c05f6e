//! Typed launchers: one method per kernel, over raw device addresses (`u64`) and sizes. Callers
//! own the buffers; these only check what the kernels assume and pick the launch shape.

use std::cell::RefCell;
use std::collections::HashMap;

use cudarc::driver::sys::CUfunction_attribute;

use crate::{Arg, Gpu, Result};

mod attention;
mod elementwise;
mod kv;
mod moe;
pub use moe::{GemmKernel, GroupedGemm, PersistentGemm};
mod qdecode;
pub use qdecode::{QPersist, QDECODE_KERNELS};
mod quant;
pub use quant::{QGemm, QWeights, QUANT_KERNELS};
mod sample;
pub use sample::{SampleLaunch, NO_MASK, SAMPLE_PARAM_WORDS};

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

    /// The decode kernel for these dimensions (128 threads per block, [`Self::smem_bytes`] of
    /// dynamic shared memory): v2 has a version compiled for the DeepSeek shape (latent 512,
    /// rope 64, cache block 64).
    pub fn decode_kernel(&self, v2: bool) -> &'static str {
        match (v2, self.kv_lora, self.rope, self.block_size) {
            (true, 512, 64, 64) => "mla_decode2_dsv",
            (true, ..) => "mla_decode2",
            _ => "mla_decode",
        }
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

thread_local! {
    /// Resident blocks per SM by (kernel handle, dynamic shared memory). A stale entry (a handle
    /// reused by another module) would only change a grid size, never a result.
    static OCCUPANCY: RefCell<HashMap<(usize, usize), usize>> = RefCell::new(HashMap::new());
}

impl Gpu {
    /// Resident blocks per SM of kernel `name` with `threads` per block and `smem` bytes of dynamic
    /// shared memory, with the shared-memory carveout at its maximum (the driver's occupancy,
    /// queried once per kernel, size and thread): the grid of a persistent kernel.
    pub(crate) fn resident_blocks(&self, name: &'static str, threads: u32, smem: usize) -> Result<usize> {
        let f = self.func(name)?;
        let key = (f.cu_function() as usize, smem);
        if let Some(b) = OCCUPANCY.with(|c| c.borrow().get(&key).copied()) {
            return Ok(b);
        }
        self.ctx.bind_to_thread()?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
        let b = (f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)? as usize).max(1);
        OCCUPANCY.with(|c| c.borrow_mut().insert(key, b));
        Ok(b)
    }

    fn grid1(&self, n: u64) -> u32 {
        (n.div_ceil(256)).clamp(1, (self.sm_count * 16) as u64) as u32
    }

    /// A grid-stride kernel over `total` elements: 256 threads, at most 16 blocks per SM.
    fn launch_flat(&self, name: &'static str, total: usize, args: &[Arg]) -> Result<()> {
        self.launch(name, (self.grid1(total as u64), 1, 1), 256, 0, args)
    }

    /// One block of `block` threads per row.
    fn launch_rows(&self, name: &'static str, rows: usize, block: u32, args: &[Arg]) -> Result<()> {
        self.launch(name, (rows as u32, 1, 1), block, 0, args)
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
