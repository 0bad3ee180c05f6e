//! Paged KV-cache launchers: writing new latents, and block export/import (bf16 fast path and
//! the f32 reference-precision cache share one argument layout each).

use crate::{Arg, Gpu, Result};

use Arg::{Ptr, I32, U64};

/// A cache slot that [`Gpu::write_kv`] skips: the padding rows of a captured decode step.
pub const NO_SLOT: u32 = u32::MAX;

impl Gpu {
    pub fn kv_export(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_export_f32", cache, blocks, out, nb, per_block)
    }

    pub fn kv_import(&self, input: u64, blocks: u64, cache: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_import_f32", input, blocks, cache, nb, per_block)
    }

    pub fn kv_gather_f32(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_gather_f32", cache, blocks, out, nb, per_block)
    }

    pub fn kv_scatter_f32(&self, input: u64, blocks: u64, cache: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_scatter_f32", input, blocks, cache, nb, per_block)
    }

    /// Writes `n` latent rows `width` wide into their cache slots (a row whose slot is
    /// [`NO_SLOT`] is not written), of a bf16 cache or (`f32_cache`) the f32 reference-precision one.
    #[allow(clippy::too_many_arguments)]
    pub fn write_kv(
        &self,
        f32_cache: bool,
        latent: u64,
        slots: u64,
        cache: u64,
        n: usize,
        width: usize,
        layers: usize,
        layer: usize,
        bs: usize,
    ) -> Result<()> {
        self.launch_flat(
            if f32_cache { "write_kv_f32" } else { "write_kv_bf16" },
            n * width,
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

    /// Copies `nb` whole blocks of `per_block` values between `src` and `dst` (one of them the cache).
    fn kv_blocks(
        &self,
        name: &'static str,
        src: u64,
        blocks: u64,
        dst: u64,
        nb: usize,
        per_block: usize,
    ) -> Result<()> {
        self.launch_flat(
            name,
            nb * per_block,
            &[Ptr(src), Ptr(blocks), Ptr(dst), I32(nb as i32), U64(per_block as u64)],
        )
    }
}
