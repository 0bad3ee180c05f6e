//! Row-wise and element-wise launchers: embedding, RMSNorm, SiLU, RoPE, casts, weight conversion.

use super::SrcDtype;
use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32, U64};

impl Gpu {
    /// # Safety
    /// `table` holds the `[vocab, cols]` f32 rows, `ids` `n` u32 ids below vocab and `out` `n * cols`
    /// f32: device addresses of this context.
    pub unsafe fn embedding(&self, table: u64, ids: u64, out: u64, n: usize, cols: usize) -> Result<()> {
        self.launch_rows("embedding_f32", n, 256, &[Ptr(table), Ptr(ids), Ptr(out), I32(n as i32), I32(cols as i32)])
    }

    /// `y = rmsnorm(x)` over the first `wc` columns, or with `res != 0`: `res += x; y = rmsnorm(res)`.
    /// With `yb != 0`, also writes `y` as bf16 there (a GEMM operand, no separate cast). Under PDL
    /// the weights `w` are read (into registers, or into L2 past 8,192 columns) before the kernel
    /// waits for the one before it.
    ///
    /// # Safety
    /// `x` and `y` (and `res`, `yb` when non-zero: f32 and bf16) hold `rows * cols` values, `w` `wc`
    /// f32: device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rms_norm(
        &self,
        x: u64,
        res: u64,
        w: u64,
        y: u64,
        yb: u64,
        rows: usize,
        cols: usize,
        wc: usize,
        eps: f32,
    ) -> Result<()> {
        // The kernel keeps a row in registers, RMS_PER_THREAD (16) values per thread, and the
        // weights of the first NORM_W (8): eight values a thread up to 8,192 columns.
        if cols > 16 * 1024 || wc > cols || wc == 0 {
            return Err(KernelError::Invalid(format!("rms_norm: {cols} columns, {wc} normalized (at most 16384)")));
        }
        let block = (cols.div_ceil(8).div_ceil(32) * 32).clamp(256, 1024) as u32;
        self.launch_rows(
            "rms_norm_f32",
            rows,
            block,
            &[Ptr(x), Ptr(res), Ptr(w), Ptr(y), Ptr(yb), I32(cols as i32), I32(wc as i32), F32(eps)],
        )
    }

    /// A MoE layer's end, one pass per token: `res += sum_j wts[t, j] y[inv[t, j]]` over its
    /// `top_k` expert rows of `ys` (as [`Gpu::moe_combine`]), then [`Gpu::rms_norm`] of `res` by
    /// `w` into `y` (and `yb`, bf16, when non-zero). `cols` must be a multiple of 4. As
    /// [`Gpu::rms_norm`] does, it reads `w` before the PDL wait.
    ///
    /// # Safety
    /// `ys` holds the expert rows `inv` (`rows * top_k` u32) indexes, `wts` `rows * top_k` f32; `res` and
    /// `y` (and `yb` when non-zero, bf16) `rows * cols` f32, `w` `cols` f32: device addresses of this
    /// context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn moe_combine_norm(
        &self,
        ys: u64,
        inv: u64,
        wts: u64,
        top_k: usize,
        res: u64,
        w: u64,
        y: u64,
        yb: u64,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        if top_k > 32 || !cols.is_multiple_of(4) || cols == 0 || cols > 16 * 1024 {
            return Err(KernelError::Invalid(format!(
                "moe_combine_norm: {top_k} experts per token (at most 32), {cols} columns (a multiple of 4 up to 16384)"
            )));
        }
        let args = [
            Ptr(ys),
            Ptr(inv),
            Ptr(wts),
            I32(top_k as i32),
            Ptr(res),
            Ptr(w),
            Ptr(y),
            Ptr(yb),
            I32(cols as i32),
            F32(eps),
        ];
        // A float4 of the row per thread, up to 4 (CN_CHUNKS) per thread at 1024 threads.
        let block = ((cols / 4).div_ceil(32) * 32).min(1024) as u32;
        self.launch_rows("moe_combine_norm", rows, block, &args)
    }

    /// `silu(gate) * up` over f32 rows of `2 * half`: `[gate | up]`, or with `pairs` gate and up
    /// interleaved column by column (the experts' gate/up layout). Written as f32 to `y` and as
    /// bf16 to `yb`, each when non-zero.
    ///
    /// # Safety
    /// `x` holds `rows * 2 * half` f32, `y` (f32) and `yb` (bf16) when non-zero `rows * half`: device
    /// addresses of this context.
    pub unsafe fn silu_mul(&self, x: u64, y: u64, yb: u64, rows: usize, half: usize, pairs: bool) -> Result<()> {
        let args = [Ptr(x), Ptr(y), Ptr(yb), I32(rows as i32), I32(half as i32), I32(pairs as i32)];
        self.launch_flat("silu_mul_f32", rows * half, &args)
    }

    /// # Safety
    /// `a` and `b` hold `n` f32 (`a += b` in place): device addresses of this context.
    pub unsafe fn add(&self, a: u64, b: u64, n: usize) -> Result<()> {
        self.launch_flat("add_f32", n, &[Ptr(a), Ptr(b), U64(n as u64)])
    }

    /// # Safety
    /// `rows` holds `n` u32 row indices of `x` (`cols` f32 a row), `y` `n * cols` f32: device addresses
    /// of this context.
    pub unsafe fn gather_rows(&self, x: u64, rows: u64, y: u64, n: usize, cols: usize) -> Result<()> {
        self.launch_rows("gather_rows_f32", n, 256, &[Ptr(x), Ptr(rows), Ptr(y), I32(n as i32), I32(cols as i32)])
    }

    /// # Safety
    /// `x` holds `n` rows of `cols` f32 (the `heads` rotated parts at `offset + h * stride`), `cos_sin`
    /// a row of `rope` values for every position in `pos` (`n` u32): device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rope(
        &self,
        x: u64,
        cos_sin: u64,
        pos: u64,
        n: usize,
        cols: usize,
        heads: usize,
        offset: usize,
        stride: usize,
        rope: usize,
        interleaved: bool,
    ) -> Result<()> {
        self.launch_flat(
            "rope_f32",
            n * heads * rope / 2,
            &[
                Ptr(x),
                Ptr(cos_sin),
                Ptr(pos),
                I32(n as i32),
                I32(cols as i32),
                I32(heads as i32),
                I32(offset as i32),
                I32(stride as i32),
                I32(rope as i32),
                I32(interleaved as i32),
            ],
        )
    }

    /// # Safety
    /// `x` holds `n` f32 and `y` `n` bf16: device addresses of this context.
    pub unsafe fn cast_f32_bf16(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.launch_flat("cast_f32_bf16", n, &[Ptr(x), Ptr(y), U64(n as u64)])
    }

    /// # Safety
    /// `x` holds `n` bf16 and `y` `n` f32: device addresses of this context.
    pub unsafe fn cast_bf16_f32(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.launch_flat("cast_bf16_f32", n, &[Ptr(x), Ptr(y), U64(n as u64)])
    }

    /// Converts a stored `[rows, cols]` weight into bf16 rows `row_base + r * row_mul + row_off`
    /// of `dst` (`cols` wide). `scale`: fp8 block scales (0 for none) with block `[sb0, sb1]`.
    ///
    /// # Safety
    /// `src` holds `rows * cols` values of `dtype` (and `scale` its block scales when non-zero); `dst`
    /// every row `row_base + r * row_mul + row_off` (r < rows) of `cols` bf16: device addresses of this
    /// context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn convert_weight(
        &self,
        src: u64,
        dtype: SrcDtype,
        rows: usize,
        cols: usize,
        scale: u64,
        block: [usize; 2],
        dst: u64,
        row_base: usize,
        row_mul: usize,
        row_off: usize,
    ) -> Result<()> {
        self.launch_flat(
            "convert_weight",
            rows * cols,
            &[
                Ptr(src),
                I32(dtype as i32),
                I32(rows as i32),
                I32(cols as i32),
                Ptr(scale),
                I32(block[0] as i32),
                I32(block[1] as i32),
                Ptr(dst),
                I32(row_base as i32),
                I32(row_mul as i32),
                I32(row_off as i32),
            ],
        )
    }

    /// # Safety
    /// `dst` holds `n` bf16: a device address of this context.
    pub unsafe fn fill_uniform_bf16(&self, dst: u64, n: usize, seed: u64, lo: f32, hi: f32) -> Result<()> {
        self.launch_flat("fill_uniform_bf16", n, &[Ptr(dst), U64(n as u64), U64(seed), F32(lo), F32(hi)])
    }
}
