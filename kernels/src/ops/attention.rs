//! MLA attention launchers: absorbed decode (v1, v2 and v3; v3 takes no latent, rope or block
//! widths, they are compiled in), split combine, the expanded prefill (latent gather, flash
//! attention), and the f32 reference attention.

use super::{MlaKernel, MlaLaunch, MLA_COMBINE_KERNELS, MLA_COMBINE_SPLITS, MLA_MAX_LATENT, MLA_MAX_SPLITS};
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32};

/// The flash prefill kernels (prefill.cu): the generic one, and the one compiled for
/// [`PREFILL_FLASH_DS_DIMS`].
pub const PREFILL_FLASH: [&str; 2] = ["mla_prefill_flash", "mla_prefill_flash_ds"];
/// DeepSeek's (nope, rope, v) head dims, which `mla_prefill_flash_ds` has compiled in.
pub const PREFILL_FLASH_DS_DIMS: (usize, usize, usize) = (128, 64, 128);

/// Query rows per block and keys per tile of `mla_prefill_flash`, and the largest head dims it
/// takes (must match attention.cu `PF_*`).
const PREFILL_Q_TILE: usize = 64;
const PREFILL_KEY_TILE: usize = 64;
const PREFILL_MAX_QK: usize = 192;
const PREFILL_MAX_V: usize = 128;

/// Where [`Gpu::mla_decode`] writes: f32 partials per split for [`Gpu::mla_combine`], (one
/// split, a kernel that can) the bf16 output itself, or (several splits, where
/// [`MlaKernel::merges_splits`] holds) the partials and then, merged by the decode kernel's own blocks
/// after a grid barrier, the bf16 output: no `mla_combine` launch.
#[derive(Debug, Clone, Copy)]
pub enum MlaOut {
    Partials { part_o: u64, part_ml: u64 },
    Output(u64),
    Joined { part_o: u64, part_ml: u64, out: u64 },
}

impl Gpu {
    /// Checks the shapes `mla_decode` supports.
    pub fn mla_supported(kv_lora: usize, rope: usize) -> Result<()> {
        if !(kv_lora + rope).is_multiple_of(8) || kv_lora > MLA_MAX_LATENT || kv_lora == 0 {
            return Err(KernelError::Invalid(format!(
                "MLA attention needs kv_lora_rank + qk_rope_head_dim divisible by 8 and kv_lora_rank <= {MLA_MAX_LATENT} (got {kv_lora} + {rope})"
            )));
        }
        Ok(())
    }

    /// Resident blocks per SM of decode kernel `k`.
    pub fn mla_decode_blocks_per_sm(&self, k: &MlaKernel) -> Result<usize> {
        self.resident_blocks(k.name, k.threads, k.smem)
    }

    /// Partial attention of every row over its visible keys with kernel `k` (from
    /// [`MlaLaunch::kernel`]); see attention.cu, mla_decode.cu and mla_decode4.cu. Where
    /// [`MlaKernel::writes_output`] holds for `splits`, `out` is the bf16 `[rows, heads,
    /// kv_lora]` output (what [`Gpu::mla_combine`] would write; no partials), else the f32
    /// partials `(part_o, part_ml)`.
    ///
    /// # Safety
    /// Every address is a live device allocation of this context: the queries and the cache as `p`
    /// describes them, `row_len` and `row_tab` `p.rows` u32, `tables` the block tables they index (every
    /// block in the cache), and `out` sized for `p`, `k` and `splits` ([`MlaOut`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mla_decode(
        &self,
        k: &MlaKernel,
        p: &MlaLaunch,
        splits: usize,
        q_lat: u64,
        q: u64,
        cache: u64,
        row_len: u64,
        row_tab: u64,
        tables: u64,
        out: MlaOut,
    ) -> Result<()> {
        Self::mla_supported(p.kv_lora, p.rope)?;
        if k.smem > self.smem_limit(k.name) {
            return Err(KernelError::Invalid(format!(
                "MLA attention ({}) needs {} bytes of shared memory, the device allows {}",
                k.name,
                k.smem,
                self.smem_limit(k.name)
            )));
        }
        if splits == 0 || splits > MLA_MAX_SPLITS {
            return Err(KernelError::Invalid(format!("mla_decode: {splits} splits (1 to {MLA_MAX_SPLITS})")));
        }
        let qk = p.nope + p.rope;
        let hg = p.heads.div_ceil(k.heads_per_block);
        let (part_o, part_ml, o_lat, sync) = match out {
            MlaOut::Partials { part_o, part_ml } => (part_o, part_ml, 0, 0),
            MlaOut::Output(_) if !k.writes_output(splits) => {
                return Err(KernelError::Invalid(format!(
                    "mla_decode: {} writes its output only with one split (got {splits})",
                    k.name
                )))
            }
            MlaOut::Output(o) => (0, 0, o, 0),
            MlaOut::Joined { part_o, part_ml, out } => {
                // The grid barrier waits for every block: all must be resident at once.
                let blocks = p.rows * hg * splits;
                let resident = self.mla_decode_blocks_per_sm(k)? * self.sm_count;
                if !k.merges_splits(splits) || blocks > resident {
                    return Err(KernelError::Invalid(format!(
                        "mla_decode: {} cannot merge {splits} splits itself ({blocks} blocks, {resident} resident)",
                        k.name
                    )));
                }
                (part_o, part_ml, out, self.grid_barrier_word())
            }
        };
        let ptrs = [Ptr(q_lat), Ptr(q), Ptr(cache), Ptr(row_len), Ptr(row_tab), Ptr(tables), Ptr(part_o), Ptr(part_ml)];
        let (heads, nope, qk) = (I32(p.heads as i32), I32(p.nope as i32), I32(qk as i32));
        let (layers, layer) = (I32(p.layers as i32), I32(p.layer as i32));
        let tail = [I32(splits as i32), F32(p.scale)];
        let (dims, last): (Vec<Arg>, Vec<Arg>) = if k.fixed_shape {
            (vec![heads, nope, qk, layers, layer], vec![Ptr(o_lat), Ptr(sync)])
        } else {
            let (l, r, bs) = (I32(p.kv_lora as i32), I32(p.rope as i32), I32(p.block_size as i32));
            (vec![heads, l, r, nope, qk, layers, layer, bs], vec![])
        };
        let args: Vec<Arg> = ptrs.into_iter().chain(dims).chain(tail).chain(last).collect();
        self.launch(k.name, (p.rows as u32, splits as u32, hg as u32), k.threads, k.smem as u32, &args)
    }

    /// Merges [`Gpu::mla_decode`]'s partials into the bf16 `[rows, heads, kv_lora]` output,
    /// reading only the splits that hold keys (by each row's length at `row_len`, the decode
    /// launch's, read before the PDL wait: no kernel still in flight may write it, and the decode
    /// kernel's [`MlaKernel::tile`], by which its splits were dealt).
    ///
    /// # Safety
    /// `part_o` and `part_ml` hold the partials of `rows * heads` rows over `splits` splits (as
    /// [`Gpu::mla_decode`] writes them), `o_lat` `rows * heads * kv_lora` bf16, `row_len` `rows` u32:
    /// device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mla_combine(
        &self,
        part_o: u64,
        part_ml: u64,
        o_lat: u64,
        row_len: u64,
        rows: usize,
        heads: usize,
        kv_lora: usize,
        splits: usize,
        tile: usize,
    ) -> Result<()> {
        // The smallest instance that holds the splits.
        let Some(i) = MLA_COMBINE_SPLITS.iter().position(|&m| splits <= m) else {
            return Err(KernelError::Invalid(format!("mla_combine: {splits} splits (at most {MLA_MAX_SPLITS})")));
        };
        let args = [
            Ptr(part_o),
            Ptr(part_ml),
            Ptr(o_lat),
            I32(heads as i32),
            I32(kv_lora as i32),
            I32(splits as i32),
            Ptr(row_len),
            I32(tile as i32),
        ];
        // A thread per latent column (kv_lora <= 512, the kernel's bound).
        let threads = (kv_lora.div_ceil(32) * 32).clamp(32, MLA_MAX_LATENT) as u32;
        self.launch(MLA_COMBINE_KERNELS[i], (rows as u32, heads as u32, 1), threads, 0, &args)
    }

    /// Expanded prefill: a sequence's latent rows `[ctx, width]` gathered from the paged cache.
    ///
    /// # Safety
    /// `table` holds the block ids (u32) of the sequence's `ctx` keys in `cache` (`layers` layers of
    /// blocks of `bs` slots, `width` bf16 a slot), `out` `ctx * width` bf16: device addresses of this
    /// context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_latent(
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
        if !width.is_multiple_of(8) {
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

    /// Checks the head dimensions `mla_prefill_flash` supports, and that a gathered latent row's
    /// rope part (columns `kv_lora..`) starts 16-byte aligned.
    pub fn mla_prefill_supported(nope: usize, rope: usize, v: usize, kv_lora: usize) -> Result<()> {
        let (max_qk, max_v) = (PREFILL_MAX_QK, PREFILL_MAX_V);
        if nope == 0 || v == 0 || !(nope | rope | v | kv_lora).is_multiple_of(8) || nope + rope > max_qk || v > max_v {
            return Err(KernelError::Invalid(format!(
                "flash prefill attention needs qk_nope_head_dim, qk_rope_head_dim, v_head_dim and kv_lora_rank \
                 divisible by 8, nope + rope <= {max_qk}, 0 < v <= {max_v} (got nope {nope}, rope {rope}, v {v}, \
                 kv_lora {kv_lora})"
            )));
        }
        Ok(())
    }

    /// Dynamic shared memory of `mla_prefill_flash`: Q tile, two K tiles, two V tiles (bf16, rows
    /// padded to a multiple of 16 columns plus 8).
    pub fn mla_prefill_smem(nope: usize, rope: usize, v: usize) -> usize {
        let sk = (nope + rope).div_ceil(16) * 16 + 8;
        let sv = v.div_ceil(16) * 16 + 8;
        (PREFILL_Q_TILE * sk + 2 * PREFILL_KEY_TILE * (sk + sv)) * 2
    }

    /// Causal flash attention of one expanded prefill chunk, all heads: `out[i, h*v..]` for the
    /// chunk's `q_len` query rows, the last `q_len` positions of a `ctx`-key sequence (see
    /// attention.cu `mla_prefill_flash` for the operand layouts). `q`, `out` point at the chunk's
    /// first row, `kv` (per-head `[k_nope | v]`) and `k_rope` at the sequence's first key; leading
    /// dimensions are in elements.
    ///
    /// # Safety
    /// `q` and `out` hold `q_len` rows (leading dimensions `q_ld`, `out_ld`), `kv` and `k_rope` `ctx`
    /// rows (`kv_ld`, `kr_ld`), all bf16 with the heads' columns as attention.cu lays them out: device
    /// addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mla_prefill_flash(
        &self,
        q: u64,
        q_ld: usize,
        kv: u64,
        kv_ld: usize,
        k_rope: u64,
        kr_ld: usize,
        out: u64,
        out_ld: usize,
        q_len: usize,
        ctx: usize,
        heads: usize,
        nope: usize,
        rope: usize,
        v: usize,
        scale: f32,
    ) -> Result<()> {
        // kv_lora does not reach the kernel: the k_rope pointer's alignment is checked below.
        Self::mla_prefill_supported(nope, rope, v, 0)?;
        let bad = |what: String| Err(KernelError::Invalid(format!("mla_prefill_flash: {what}")));
        if q_len == 0 || heads == 0 {
            return Ok(());
        }
        if ctx < q_len || ctx > i32::MAX as usize || heads > 65535 {
            return bad(format!("{q_len} query rows in a context of {ctx}, {heads} heads"));
        }
        let lds = [(q_ld, heads * (nope + rope)), (kv_ld, heads * (nope + v)), (kr_ld, rope), (out_ld, heads * v)];
        if lds.iter().any(|&(ld, min)| ld < min || ld > i32::MAX as usize) {
            return bad(format!("leading dimensions {q_ld}, {kv_ld}, {kr_ld}, {out_ld} for {heads} heads"));
        }
        // 16-byte cp.async of bf16 rows, 8-byte float2 stores of the output.
        let aligned = (q | kv | k_rope).is_multiple_of(16) && out.is_multiple_of(8);
        if !aligned || !(q_ld | kv_ld | kr_ld).is_multiple_of(8) || !out_ld.is_multiple_of(2) {
            return bad(
                "operands must be 16-byte aligned (output 8-byte) with leading dimensions divisible by 8 (output 2)"
                    .into(),
            );
        }
        let limit = self.dyn_smem_limit();
        let smem = Self::mla_prefill_smem(nope, rope, v);
        if smem > limit {
            return bad(format!("needs {smem} bytes of shared memory, the device allows {limit}"));
        }
        let name = PREFILL_FLASH[((nope, rope, v) == PREFILL_FLASH_DS_DIMS) as usize];
        self.launch(
            name,
            (q_len.div_ceil(PREFILL_Q_TILE) as u32, heads as u32, 1),
            128,
            smem as u32,
            &[
                Ptr(q),
                Ptr(kv),
                Ptr(k_rope),
                Ptr(out),
                I32(q_len as i32),
                I32(ctx as i32),
                I32(nope as i32),
                I32(rope as i32),
                I32(v as i32),
                I32(q_ld as i32),
                I32(kv_ld as i32),
                I32(kr_ld as i32),
                I32(out_ld as i32),
                F32(scale),
            ],
        )
    }

    /// Reference precision: `out[row, h*V..]` for every row and head, all in f32 (see attention.cu
    /// `mla_ref_f32`).
    ///
    /// # Safety
    /// As [`Gpu::mla_decode`] for the f32 reference cache, `kv_b` the f32 up-projection and `out`
    /// `p.rows * heads * v` f32.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mla_ref_f32(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_flash_shapes() {
        // DeepSeek heads: two blocks per SM fit in an H100/H200's 228 KB of shared memory.
        assert_eq!(Gpu::mla_prefill_smem(128, 64, 128), 111_616);
        assert!(2 * (Gpu::mla_prefill_smem(128, 64, 128) + 1024) <= 228 * 1024);
        assert!(Gpu::mla_prefill_supported(128, 64, 128, 512).is_ok());
        assert!(Gpu::mla_prefill_supported(32, 16, 32, 64).is_ok());
        assert!(Gpu::mla_prefill_supported(16, 8, 24, 40).is_ok());
        assert!(Gpu::mla_prefill_supported(128, 72, 128, 512).is_err());
        assert!(Gpu::mla_prefill_supported(128, 64, 136, 512).is_err());
        assert!(Gpu::mla_prefill_supported(12, 4, 16, 64).is_err());
        assert!(Gpu::mla_prefill_supported(16, 8, 16, 36).is_err());
    }
}
