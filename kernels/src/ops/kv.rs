//! Paged KV-cache launchers: writing new latents, and block export/import (bf16 fast path and
//! the f32 reference-precision cache share one argument layout each).

use crate::{Arg, Gpu, Result};

use Arg::{Ptr, F32, I32, U64};

/// A cache slot that [`Gpu::write_kv`] skips: the padding rows of a captured decode step.
pub const NO_SLOT: u32 = u32::MAX;

/// Heads of q per block of [`Gpu::mla_prologue`] (at most; the kernel reads it from the grid).
const MLA_PROLOGUE_HEADS: usize = 4;

/// One [`Gpu::mla_prologue`]: device addresses and shapes.
#[derive(Debug, Clone, Copy)]
pub struct MlaPrologue {
    pub rows: usize,
    /// `[rows, heads * (nope + rope)]` f32, rotated in place.
    pub q: u64,
    /// Where the rotated q is also written as bf16 (0: not written).
    pub q_bf16: u64,
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    /// `[rows, lora + rope]` f32: kv_a's output.
    pub kv: u64,
    pub lora: usize,
    /// `lora` f32 RMSNorm weights.
    pub norm: u64,
    pub eps: f32,
    /// `[max_pos, rope]` f32 and each row's position (u32).
    pub cos_sin: u64,
    pub positions: u64,
    pub interleaved: bool,
    /// Each row's cache slot (u32, [`NO_SLOT`] to skip) and the cache (`f32_cache`: f32, else
    /// bf16) of `layers` layers in blocks of `block_size`.
    pub slots: u64,
    pub cache: u64,
    pub f32_cache: bool,
    pub layers: usize,
    pub layer: usize,
    pub block_size: usize,
}

impl Gpu {
    /// RoPE on q's rope columns, and kv_a's output RMS-normalized, its key rotated and written
    /// into the cache: per row, one block for the latent and one per four heads of q.
    ///
    /// # Safety
    /// Every address is a live device allocation of this context holding what [`MlaPrologue`]
    /// describes; positions index `cos_sin`, slots lie in the cache (or are [`NO_SLOT`]). Under
    /// PDL the positions, slots, `cos_sin` and norm weights are read before the kernel waits for
    /// the one before it: no kernel still in flight may write them (they are the step's uploads
    /// and constants).
    pub unsafe fn mla_prologue(&self, m: &MlaPrologue) -> Result<()> {
        let args = [
            Ptr(m.q),
            Ptr(m.q_bf16),
            I32((m.heads * (m.nope + m.rope)) as i32),
            I32(m.heads as i32),
            I32(m.nope as i32),
            I32((m.nope + m.rope) as i32),
            Ptr(m.kv),
            Ptr(m.norm),
            F32(m.eps),
            Ptr(m.cos_sin),
            Ptr(m.positions),
            Ptr(m.slots),
            Ptr(m.cache),
            I32(m.lora as i32),
            I32(m.rope as i32),
            I32(m.layers as i32),
            I32(m.layer as i32),
            I32(m.block_size as i32),
            I32(m.interleaved as i32),
        ];
        let name = if m.f32_cache { "mla_prologue_f32" } else { "mla_prologue_bf16" };
        let q_blocks = m.heads.div_ceil(MLA_PROLOGUE_HEADS) as u32;
        self.launch(name, (m.rows as u32, 1 + q_blocks, 1), 256, 0, &args)
    }

    /// # Safety
    /// `cache` is a KV cache of this context whose blocks include the `nb` u32 ids at `blocks`, each
    /// `per_block` bf16; `out` holds `nb * per_block` bf16.
    pub unsafe fn kv_export(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_export_f32", cache, blocks, out, nb, per_block)
    }

    /// # Safety
    /// `input` holds `nb * per_block` bf16; `cache` is a KV cache of this context whose blocks include
    /// the `nb` u32 ids at `blocks`, each `per_block` bf16.
    pub unsafe fn kv_import(&self, input: u64, blocks: u64, cache: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_import_f32", input, blocks, cache, nb, per_block)
    }

    /// # Safety
    /// As [`Gpu::kv_export`], of an f32 cache and into f32 `out`.
    pub unsafe fn kv_gather_f32(&self, cache: u64, blocks: u64, out: u64, nb: usize, per_block: usize) -> Result<()> {
        self.kv_blocks("kv_gather_f32", cache, blocks, out, nb, per_block)
    }

    /// # Safety
    /// As [`Gpu::kv_import`], from f32 `input` into an f32 cache.
    pub unsafe fn kv_scatter_f32(
        &self,
        input: u64,
        blocks: u64,
        cache: u64,
        nb: usize,
        per_block: usize,
    ) -> Result<()> {
        self.kv_blocks("kv_scatter_f32", input, blocks, cache, nb, per_block)
    }

    /// Writes `n` latent rows `width` wide into their cache slots (a row whose slot is
    /// [`NO_SLOT`] is not written), of a bf16 cache or (`f32_cache`) the f32 reference-precision one.
    ///
    /// # Safety
    /// `latent` holds `n * width` f32, `slots` `n` u32 slots of the cache (or [`NO_SLOT`]), `cache` the
    /// whole cache (`layers` layers of blocks of `bs` slots, `width` values a slot, bf16 or f32 as
    /// `f32_cache` says): device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_kv(
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
    ///
    /// # Safety
    /// As [`Gpu::kv_export`] and [`Gpu::kv_import`].
    unsafe fn kv_blocks(
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
