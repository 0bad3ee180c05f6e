//! MLA attention launchers: absorbed decode (v1 and v2 kernels, one argument layout), split
//! combine, expanded-prefill helpers, and the f32 reference attention.

use super::{MlaLaunch, MLA_HEADS_PER_BLOCK, MLA_MAX_LATENT};
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32};

impl Gpu {
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

    #[allow(clippy::too_many_arguments)]
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
        self.launch_flat(
            "gather_latent",
            ctx * width / 8,
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
        self.launch_rows("softmax_causal", rows, 256, &[Ptr(s), Ptr(p), I32(ql as i32), I32(ctx as i32), F32(scale)])
    }

    /// Reference precision: `out[row, h*V..]` for every row and head, all in f32 (see attention.cu
    /// `mla_ref_f32`).
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
}
