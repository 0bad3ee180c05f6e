//! Dense linears of one to eight rows (`gemv.cu`): memory-bound decode GEMVs over bf16 or f32
//! weights, and MLA's absorbed per-head products, in place of cuBLAS GEMMs at those sizes.

use crate::{Arg, Gpu, KernelError, Result};

use Arg::{Ptr, F32, I32};

/// Every kernel of gemv.cu, by compiled row count (1, 2, 4, 8) within each kind: the GEMV over
/// bf16 weights, over f32 ones, then MLA's `q_nope W_UK` and `o_lat W_UV`.
pub const GEMV_KERNELS: &[&str] = &[
    "gemv_bf16_r1",
    "gemv_bf16_r2",
    "gemv_bf16_r4",
    "gemv_bf16_r8",
    "gemv_f32_r1",
    "gemv_f32_r2",
    "gemv_f32_r4",
    "gemv_f32_r8",
    "mla_uk_r1",
    "mla_uk_r2",
    "mla_uk_r4",
    "mla_uk_r8",
    "mla_uv_r1",
    "mla_uv_r2",
    "mla_uv_r4",
    "mla_uv_r8",
];

/// Where each kind's instances start in [`GEMV_KERNELS`].
const GEMV_BF16: usize = 0;
const GEMV_F32: usize = 4;
const ABSORB_UK: usize = 8;
const ABSORB_UV: usize = 12;

/// The instance of the kind starting at `kind` compiled for `rows` (1 to 8).
fn instance(kind: usize, rows: usize) -> &'static str {
    GEMV_KERNELS[kind + rows.next_power_of_two().trailing_zeros() as usize]
}

/// Latent columns per `mla_uk` block, value columns per `mla_uv` block (gemv.cu).
const UK_COLS: usize = 64;
const UV_OUTS: usize = 16;

/// The most rows one launch takes.
pub const GEMV_MAX_ROWS: usize = 8;

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

    /// Values per 16-byte load: `k` and the activations' row stride must be multiples of it.
    pub fn lanes(self) -> usize {
        match self {
            GemvWeight::Bf16(_) => 8,
            GemvWeight::F32(_) => 4,
        }
    }
}

impl Gpu {
    /// Whether [`Gpu::gemv`] takes `rows` rows of `k` inputs (row stride `ldx`) over `w`.
    pub fn gemv_takes(w: GemvWeight, rows: usize, k: usize, ldx: usize) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&rows) && k > 0 && k.is_multiple_of(w.lanes()) && ldx.is_multiple_of(w.lanes())
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
                "gemv: {rows} rows of {k} (stride {ldx}) over {w:?}: needs 1..={GEMV_MAX_ROWS} rows and k, \
                 stride multiples of {}",
                w.lanes()
            )));
        }
        if ![x, xb, first.w.ptr(), second.w.ptr()].iter().all(|p| p.is_multiple_of(16)) {
            return Err(KernelError::Invalid("gemv: x, xb and the weights must be 16-byte aligned".into()));
        }
        let name = instance(if matches!(w, GemvWeight::F32(_)) { GEMV_F32 } else { GEMV_BF16 }, rows);
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
        self.launch(name, (blocks as u32, 1, 1), 256, 0, &args)
    }
}

/// MLA's absorbed products at a few rows ([`Gpu::mla_uk`], [`Gpu::mla_uv`]) over `kv_b_proj`:
/// bf16 `[heads * (nope + v), kv_lora]`, head h's W_UK its rows from `h * (nope + v)`, `nope` of
/// them, then its W_UV, `v` of them.
#[derive(Debug, Clone, Copy)]
pub struct MlaAbsorb {
    pub rows: usize,
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kv_lora: usize,
    pub kv_b: u64,
}

impl MlaAbsorb {
    /// Whether the kernels take these shapes: 1 to [`GEMV_MAX_ROWS`] rows, a latent of whole
    /// `mla_uk` blocks of at most 512 columns (a lane of `mla_uv` reads two runs of 8).
    pub fn takes(&self) -> bool {
        (1..=GEMV_MAX_ROWS).contains(&self.rows)
            && self.kv_lora.is_multiple_of(UK_COLS)
            && self.kv_lora <= 512
            && self.nope > 0
            && self.v > 0
    }

    fn check(&self, op: &str) -> Result<()> {
        if !self.takes() || !self.kv_b.is_multiple_of(16) {
            return Err(KernelError::Invalid(format!(
                "{op}: {self:?}: needs 1..={GEMV_MAX_ROWS} rows, kv_lora a multiple of {UK_COLS} up to 512 and \
                 16-byte aligned weights"
            )));
        }
        Ok(())
    }

    fn ints(&self) -> [i32; 3] {
        [self.nope as i32, (self.nope + self.v) as i32, self.v as i32]
    }
}

impl Gpu {
    /// `q_lat[r, h, :] = q[r, h, :nope] W_UK[h]` for each head: `q` bf16 `[rows, heads * (nope +
    /// rope)]` (the rotated q's bf16 copy; its nope columns are read), `q_lat` f32 `[rows, heads,
    /// kv_lora]`. The batched GEMM's products over the same operands.
    ///
    /// # Safety
    /// `q`, `q_lat` and `a.kv_b` are device allocations of this context of the sizes above.
    pub unsafe fn mla_uk(&self, a: &MlaAbsorb, q: u64, q_lat: u64) -> Result<()> {
        a.check("mla_uk")?;
        let [nope, hv, _] = a.ints();
        let args = [
            Ptr(q),
            I32((a.nope + a.rope) as i32),
            Ptr(a.kv_b),
            I32(nope),
            I32(hv),
            I32(a.kv_lora as i32),
            Ptr(q_lat),
            I32(a.heads as i32),
            I32(a.rows as i32),
        ];
        let grid = ((a.kv_lora / UK_COLS) as u32, a.heads as u32, 1);
        self.launch(instance(ABSORB_UK, a.rows), grid, 128, 0, &args)
    }

    /// `out[r, h * v + j] = o_lat[r, h, :] . W_UV[h][j, :]` for each head: `o_lat` bf16 `[rows,
    /// heads, kv_lora]` (16-byte aligned), `out` f32 `[rows, heads * v]`.
    ///
    /// # Safety
    /// `o_lat`, `out` and `a.kv_b` are device allocations of this context of the sizes above.
    pub unsafe fn mla_uv(&self, a: &MlaAbsorb, o_lat: u64, out: u64) -> Result<()> {
        a.check("mla_uv")?;
        if !o_lat.is_multiple_of(16) {
            return Err(KernelError::Invalid("mla_uv: o_lat must be 16-byte aligned".into()));
        }
        let [nope, hv, v] = a.ints();
        let args = [
            Ptr(o_lat),
            Ptr(a.kv_b),
            I32(nope),
            I32(hv),
            I32(v),
            I32(a.kv_lora as i32),
            Ptr(out),
            I32(a.heads as i32),
            I32(a.rows as i32),
        ];
        let grid = (a.v.div_ceil(UV_OUTS) as u32, a.heads as u32, 1);
        self.launch(instance(ABSORB_UV, a.rows), grid, 128, 0, &args)
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
        assert!(!Gpu::gemv_takes(b, 9, 2048, 2048));
        assert!(!Gpu::gemv_takes(b, 0, 2048, 2048));
        assert!(!Gpu::gemv_takes(b, 1, 2044, 2044), "k not a multiple of 8 bf16");
        assert!(Gpu::gemv_takes(GemvWeight::F32(0), 3, 2044, 2044));
        assert!(!Gpu::gemv_takes(b, 2, 2048, 2052), "row stride");
    }

    #[test]
    fn rows_pick_the_next_compiled_instance() {
        for (rows, want) in [(1, "r1"), (2, "r2"), (3, "r4"), (4, "r4"), (5, "r8"), (8, "r8")] {
            assert_eq!(instance(GEMV_F32, rows), format!("gemv_f32_{want}"));
            assert_eq!(instance(ABSORB_UK, rows), format!("mla_uk_{want}"));
            assert_eq!(instance(ABSORB_UV, rows), format!("mla_uv_{want}"));
        }
        assert_eq!(instance(GEMV_BF16, 1), "gemv_bf16_r1");
    }

    #[test]
    fn absorb_takes_the_deepseek_latent() {
        let a = MlaAbsorb { rows: 1, heads: 16, nope: 128, rope: 64, v: 128, kv_lora: 512, kv_b: 0 };
        assert!(a.takes());
        assert!(MlaAbsorb { rows: 8, heads: 128, ..a }.takes());
        assert!(!MlaAbsorb { rows: 9, ..a }.takes());
        assert!(!MlaAbsorb { kv_lora: 40, ..a }.takes(), "not whole mla_uk blocks");
        assert!(!MlaAbsorb { kv_lora: 576, ..a }.takes(), "past a lane's two runs");
    }
}
