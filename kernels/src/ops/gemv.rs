//! Dense linears of a few rows (`gemv.cu`): memory-bound decode GEMVs over bf16 or f32 weights,
//! in place of cuBLAS GEMMs at those sizes; more rows run in groups of four (the f32 router,
//! whose weights stay in L2). MLA's absorbed projections at one row (per head over kv_b_proj)
//! in place of cuBLAS's batched GEMM.

use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32};

/// Every kernel of gemv.cu, by compiled row count (1, 2, 4, 8) within each kind: the GEMV over
/// bf16 weights, then over f32 ones; then MLA's absorbed projections at one row.
pub const GEMV_KERNELS: &[&str] = &[
    "gemv_bf16_r1",
    "gemv_bf16_r2",
    "gemv_bf16_r4",
    "gemv_bf16_r8",
    "gemv_f32_r1",
    "gemv_f32_r2",
    "gemv_f32_r4",
    "gemv_f32_r8",
    "mla_absorb_uk_r1",
    "mla_absorb_uv_r1",
];

/// Threads of their blocks and q_lat columns a block of `mla_absorb_uk` computes (gemv.cu).
const ABSORB_THREADS: u32 = 128;
const ABSORB_UK_COLS: usize = 256;

/// Where each kind's instances start in [`GEMV_KERNELS`].
const GEMV_BF16: usize = 0;
const GEMV_F32: usize = 4;

/// The instance of the kind starting at `kind` for `rows` rows, and the rows of each group (a row
/// of blocks): up to [`GEMV_MAX_ROWS`] the instance compiled for them in one group, beyond, the
/// 4-row instance over groups of 4 (the 8-row one, with every group's inputs loaded at once,
/// needs 230 registers and gets one block per SM).
fn instance(kind: usize, rows: usize) -> (&'static str, usize) {
    if rows > GEMV_MAX_ROWS {
        return (GEMV_KERNELS[kind + 2], GEMV_GROUP_ROWS);
    }
    (GEMV_KERNELS[kind + rows.next_power_of_two().trailing_zeros() as usize], rows.max(1))
}

/// The most rows one group of blocks computes; more rows run in groups of `GEMV_GROUP_ROWS`,
/// every group reading the weights again (for weights that stay in L2: the router's gate).
pub const GEMV_MAX_ROWS: usize = 8;
const GEMV_GROUP_ROWS: usize = 4;

/// Output columns per block (`GEMV_COLS` in gemv.cu).
const GEMV_COLS: usize = 8;

/// One output of a [`Gpu::gemv`]: `y[rows, n]` f32 from weights `[n, k]`.
#[derive(Debug, Clone, Copy)]
pub struct GemvOut {
    pub w: GemvWeight,
    pub y: u64,
    pub n: usize,
}

/// The weights of a [`Gpu::gemv`]: `[n, k]` row-major.
#[derive(Debug, Clone, Copy)]
pub enum GemvWeight {
    Bf16(u64),
    F32(u64),
}

impl GemvWeight {
    /// The weights' device address.
    pub fn ptr(self) -> u64 {
        match self {
            GemvWeight::Bf16(p) | GemvWeight::F32(p) => p,
        }
    }

    /// Bytes per weight.
    pub fn bytes(self) -> usize {
        16 / self.lanes()
    }

    /// Values per 16-byte load: `k` and the activations' row stride must be multiples of it.
    pub fn lanes(self) -> usize {
        match self {
            GemvWeight::Bf16(_) => 8,
            GemvWeight::F32(_) => 4,
        }
    }
}

/// How many times [`Gpu::gemv`] over `rows` rows reads its weights: once per group of rows
/// (from L2 after the first).
pub fn gemv_weight_reads(rows: usize) -> usize {
    rows.div_ceil(instance(GEMV_BF16, rows).1)
}

impl Gpu {
    /// Whether [`Gpu::mla_absorb_q`] and [`Gpu::mla_absorb_out`] take one row of `heads` heads
    /// with these MLA dimensions (`nope` 128, `v` a multiple of 32, a latent of 512:
    /// DeepSeek-V2-Lite's and V3's). One row only: run 177's 4-row instances were 1-2% slower
    /// than cuBLAS's batched GEMM in V2-Lite's batch-4 step.
    pub fn mla_absorb_takes(heads: usize, nope: usize, v: usize, kv_lora: usize) -> bool {
        (1..=u16::MAX as usize).contains(&heads) && nope == 128 && v.is_multiple_of(32) && v > 0 && kv_lora == 512
    }

    fn absorb_check(heads: usize, nope: usize, v: usize, kv_lora: usize, kv_b: u64) -> Result<()> {
        if !Self::mla_absorb_takes(heads, nope, v, kv_lora) || !kv_b.is_multiple_of(16) {
            return Err(KernelError::Invalid(format!(
                "mla_absorb: {heads} heads, nope {nope}, v {v}, latent {kv_lora}: needs nope 128, v a multiple \
                 of 32, a latent of 512, kv_b 16-byte aligned"
            )));
        }
        Ok(())
    }

    /// MLA's absorbed query at one row: `q_lat[h, :] = q[h qk .. h qk + nope] W_UK[h]` (f32
    /// `[heads, kv_lora]`), `W_UK[h]` the first `nope` rows of head h's `nope + v` rows of `kv_b`
    /// (bf16 `[heads (nope + v), kv_lora]`); `q` bf16.
    ///
    /// # Safety
    /// `q` holds `heads * qk` bf16, `kv_b` the whole projection and `q_lat` `heads * kv_lora` f32:
    /// device addresses of this context.
    pub unsafe fn mla_absorb_q(
        &self,
        q: u64,
        qk: usize,
        kv_b: u64,
        [heads, nope, v, kv_lora]: [usize; 4],
        q_lat: u64,
    ) -> Result<()> {
        Self::absorb_check(heads, nope, v, kv_lora, kv_b)?;
        if qk < nope {
            return Err(KernelError::Invalid(format!("mla_absorb_q: heads of {qk} for nope {nope}")));
        }
        let args = [Ptr(q), I32(qk as i32), Ptr(kv_b), I32(v as i32), I32(kv_lora as i32), Ptr(q_lat)];
        let grid = (heads as u32, (kv_lora / ABSORB_UK_COLS) as u32, 1);
        self.launch("mla_absorb_uk_r1", grid, ABSORB_THREADS, 0, &args)
    }

    /// MLA's absorbed output at one row: `y[h v .. (h + 1) v] = o_lat[h, :] W_UV[h]^T` (f32
    /// `[heads v]`), and rounded to bf16 into `y_bf16` unless it is 0 (the next linear's
    /// operand), `W_UV[h]` the last `v` rows of head h's in `kv_b`; `o_lat` bf16 `[heads,
    /// kv_lora]`.
    ///
    /// # Safety
    /// `o_lat` holds `heads * kv_lora` bf16, `kv_b` the whole projection, `y` `heads * v` f32 and
    /// `y_bf16` (unless 0) `heads * v` bf16: device addresses of this context.
    pub unsafe fn mla_absorb_out(
        &self,
        o_lat: u64,
        kv_b: u64,
        [heads, nope, v, kv_lora]: [usize; 4],
        y: u64,
        y_bf16: u64,
    ) -> Result<()> {
        Self::absorb_check(heads, nope, v, kv_lora, kv_b)?;
        if !o_lat.is_multiple_of(16) {
            return Err(KernelError::Invalid("mla_absorb_out: o_lat must be 16-byte aligned".into()));
        }
        let args = [Ptr(o_lat), Ptr(kv_b), I32(v as i32), Ptr(y), Ptr(y_bf16)];
        self.launch("mla_absorb_uv_r1", (heads as u32, (v / 32) as u32, 1), ABSORB_THREADS, 0, &args)
    }

    /// Whether [`Gpu::gemv`] takes `rows` rows of `k` inputs (row stride `ldx`) over `w`.
    pub fn gemv_takes(w: GemvWeight, rows: usize, k: usize, ldx: usize) -> bool {
        rows > 0 && rows <= i32::MAX as usize && k > 0 && k.is_multiple_of(w.lanes()) && ldx.is_multiple_of(w.lanes())
    }

    /// Row-major `y[rows, n] = x[rows, k] w[n, k]^T + beta y` for each of `outs` (one or two
    /// weights of one type over the same `x`, one launch), f32 out. `x` is f32 with rows `ldx`
    /// apart; over bf16 weights it is rounded to bf16 (as the GEMM operand would be), read from
    /// `xb` (its bf16 copy, same layout) when non-zero.
    ///
    /// # Safety
    /// `x` (and `xb` when non-zero) hold `rows` rows of `ldx >= k` values; each output's `w`
    /// holds `n * k` weights and its `y` `rows * n` f32: device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv(
        &self,
        x: u64,
        xb: u64,
        ldx: usize,
        rows: usize,
        k: usize,
        outs: &[GemvOut],
        beta: f32,
    ) -> Result<()> {
        let (first, second) = match outs {
            [a] => (*a, GemvOut { w: a.w, y: 0, n: 0 }),
            [a, b] if std::mem::discriminant(&a.w) == std::mem::discriminant(&b.w) => (*a, *b),
            _ => return Err(KernelError::Invalid("gemv: one or two outputs over weights of one type".into())),
        };
        let w = first.w;
        if !Self::gemv_takes(w, rows, k, ldx) || ldx < k {
            return Err(KernelError::Invalid(format!(
                "gemv: {rows} rows of {k} (stride {ldx}) over {w:?}: needs rows and k, stride multiples of {}",
                w.lanes()
            )));
        }
        if ![x, xb, first.w.ptr(), second.w.ptr()].iter().all(|p| p.is_multiple_of(16)) {
            return Err(KernelError::Invalid("gemv: x, xb and the weights must be 16-byte aligned".into()));
        }
        let (name, group) = instance(if matches!(w, GemvWeight::F32(_)) { GEMV_F32 } else { GEMV_BF16 }, rows);
        let args = [
            Ptr(x),
            Ptr(xb),
            I32(ldx as i32),
            Ptr(first.w.ptr()),
            Ptr(first.y),
            I32(first.n as i32),
            Ptr(second.w.ptr()),
            Ptr(second.y),
            I32(second.n as i32),
            I32(rows as i32),
            I32(k as i32),
            F32(beta),
        ];
        let blocks = first.n.div_ceil(GEMV_COLS) + second.n.div_ceil(GEMV_COLS);
        let groups = rows.div_ceil(group);
        if groups > u16::MAX as usize {
            return Err(KernelError::Invalid(format!("gemv: {rows} rows need {groups} row groups, at most 65535")));
        }
        self.launch(name, (blocks as u32, groups as u32, 1), 256, 0, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_what_the_kernel_can_read() {
        let b = GemvWeight::Bf16(0);
        assert!(Gpu::gemv_takes(b, 1, 2048, 2048));
        assert!(Gpu::gemv_takes(b, 8, 72, 72));
        assert!(Gpu::gemv_takes(b, 9, 2048, 2048), "groups of 8 rows");
        assert!(!Gpu::gemv_takes(b, 0, 2048, 2048));
        assert!(!Gpu::gemv_takes(b, 1, 2044, 2044), "k not a multiple of 8 bf16");
        assert!(Gpu::gemv_takes(GemvWeight::F32(0), 3, 2044, 2044));
        assert!(!Gpu::gemv_takes(b, 2, 2048, 2052), "row stride");
        assert_eq!((b.bytes(), GemvWeight::F32(0).bytes()), (2, 4));
    }

    #[test]
    fn rows_pick_the_next_compiled_instance() {
        for (rows, want, group) in [
            (1, "r1", 1),
            (2, "r2", 2),
            (3, "r4", 3),
            (4, "r4", 4),
            (5, "r8", 5),
            (8, "r8", 8),
            (9, "r4", 4),
            (256, "r4", 4),
        ] {
            assert_eq!(instance(GEMV_F32, rows), (format!("gemv_f32_{want}").as_str(), group));
        }
        assert_eq!(instance(GEMV_BF16, 1).0, "gemv_bf16_r1");
        assert!(Gpu::mla_absorb_takes(128, 128, 128, 512) && Gpu::mla_absorb_takes(16, 128, 128, 512));
        assert!(!Gpu::mla_absorb_takes(8, 32, 32, 64) && !Gpu::mla_absorb_takes(16, 128, 48, 512));
        assert_eq!((gemv_weight_reads(8), gemv_weight_reads(9), gemv_weight_reads(64)), (1, 3, 16));
    }
}
