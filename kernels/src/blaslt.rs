//! cuBLASLt's block-scaled FP8 GEMM: DeepSeek's FP8 scheme on FP8 tensor cores (Hopper, cuBLAS
//! 12.9 or newer). The weight carries f32 scales per 128 x 128 block, the activations per token
//! per 128 input channels, in the layouts of [`crate::fp8`].

use std::ffi::c_void;

use cudarc::cublas::sys::cublasOperation_t as Op;
use cudarc::cublaslt::{result as lt, sys};

use crate::{Gpu, KernelError, Result};

/// A cuBLASLt handle, created on the GPU's thread at first use.
pub(crate) struct LtHandle(sys::cublasLtHandle_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasLtCreate` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

struct Desc(sys::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulDescCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

struct Layout(sys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatrixLayoutCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

struct Pref(sys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulPreferenceCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

fn lerr(what: &str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> KernelError + '_ {
    move |e| KernelError::Blas(format!("cuBLASLt {what}: {e:?}"))
}

/// Row-major `Y[rows_p, n] = (Xq * xs)[rows_p, k] (W * ws)[n, k]^T`, f32 accumulation: `w` e4m3
/// `[n, k]` with block scales `w_scales` (`[n/128][weight_scale_ld(k)]`), `x` e4m3
/// `[rows_p, k]` with token-major scales `x_scales` (`[k/128][rows_p]`), `rows_p` a multiple of 4
/// and `k` of 128. `y` is f32, or bf16 with `y_bf16`.
#[derive(Debug, Clone, Copy)]
pub struct Fp8BlockGemm {
    pub w: u64,
    pub w_scales: u64,
    pub x: u64,
    pub x_scales: u64,
    pub y: u64,
    pub y_bf16: bool,
    pub n: usize,
    pub k: usize,
    pub rows_p: usize,
    pub workspace: u64,
    pub workspace_bytes: usize,
}

/// Workspace cuBLASLt may use (NVIDIA's recommendation for Hopper).
pub const LT_WORKSPACE_BYTES: usize = 32 << 20;

impl Gpu {
    fn lt(&self) -> Result<sys::cublasLtHandle_t> {
        if let Some(h) = self.lt.get() {
            return Ok(h.0);
        }
        self.ctx.bind_to_thread()?;
        let h = lt::create_handle().map_err(lerr("create"))?;
        Ok(self.lt.get_or_init(|| LtHandle(h)).0)
    }

    /// Runs [`Fp8BlockGemm`] on the stream. [`KernelError::Unsupported`] when this cuBLASLt has no
    /// kernel for it (before 12.9, or not a Hopper GPU, or this output type).
    ///
    /// # Safety
    /// Every address in `g` is a device address of this context holding the operand or scales its
    /// sizes describe.
    pub unsafe fn gemm_fp8_block(&self, g: &Fp8BlockGemm) -> Result<()> {
        if !g.k.is_multiple_of(crate::fp8::BLOCK) || !g.rows_p.is_multiple_of(4) || !g.n.is_multiple_of(16) {
            return Err(KernelError::Invalid(format!(
                "block-scaled FP8 GEMM needs K % 128 == 0, rows % 4 == 0 and N % 16 == 0 (got K {}, rows {}, N {})",
                g.k, g.rows_p, g.n
            )));
        }
        if g.rows_p == 0 || g.n == 0 {
            return Ok(());
        }
        let handle = self.lt()?;
        let fp8 = sys::cudaDataType_t::CUDA_R_8F_E4M3;
        let out = if g.y_bf16 { sys::cudaDataType_t::CUDA_R_16BF } else { sys::cudaDataType_t::CUDA_R_32F };
        // Column-major: D (n x rows_p) = op(A = W, stored k x n, transposed) op(B = X, k x rows_p).
        let desc = Desc(
            lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F)
                .map_err(lerr("matmul descriptor"))?,
        );
        let set = |attr: sys::cublasLtMatmulDescAttributes_t, v: *const c_void, size: usize| {
            // SAFETY: `v` points at a live value of `size` bytes of the type the attribute takes.
            unsafe { lt::set_matmul_desc_attribute(desc.0, attr, v, size) }.map_err(lerr("matmul attribute"))
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        let (t, n) = (Op::CUBLAS_OP_T, Op::CUBLAS_OP_N);
        let blk = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        let vec = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        let (ws, xs) = (g.w_scales, g.x_scales);
        set(A::CUBLASLT_MATMUL_DESC_TRANSA, &t as *const _ as *const c_void, std::mem::size_of_val(&t))?;
        set(A::CUBLASLT_MATMUL_DESC_TRANSB, &n as *const _ as *const c_void, std::mem::size_of_val(&n))?;
        set(A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blk as *const _ as *const c_void, std::mem::size_of_val(&blk))?;
        set(A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec as *const _ as *const c_void, std::mem::size_of_val(&vec))?;
        set(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws as *const u64 as *const c_void, 8)?;
        set(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs as *const u64 as *const c_void, 8)?;
        let layout = |ty, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map(Layout).map_err(lerr("layout"))
        };
        let a = layout(fp8, g.k, g.n, g.k)?;
        let b = layout(fp8, g.k, g.rows_p, g.k)?;
        let d = layout(out, g.n, g.rows_p, g.n)?;
        let pref = Pref(lt::create_matmul_pref().map_err(lerr("preference"))?);
        let wsb = g.workspace_bytes;
        // SAFETY: `wsb` is a live usize, the size the attribute takes.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &wsb as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
        }
        .map_err(lerr("preference attribute"))?;
        // SAFETY: every descriptor is live for the call.
        let heur =
            unsafe { lt::get_matmul_algo_heuristic(handle, desc.0, a.0, b.0, d.0, d.0, pref.0) }.map_err(|e| {
                KernelError::Unsupported(format!(
                    "cuBLASLt has no block-scaled FP8 GEMM for {} x {} by {} x {} with {} output: {e:?}",
                    g.rows_p,
                    g.k,
                    g.n,
                    g.k,
                    if g.y_bf16 { "bf16" } else { "f32" }
                ))
            })?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.ctx.bind_to_thread()?;
        let t0 = self.prof_mark()?;
        // SAFETY: the caller's addresses hold the operands, scales, output and workspace of the
        // sizes `g` states (the engine's buffers; checked against the reference by kernels-check);
        // the work is ordered on this GPU's stream.
        unsafe {
            lt::matmul(
                handle,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                g.w as *const c_void,
                a.0,
                g.x as *const c_void,
                b.0,
                g.y as *const c_void,
                d.0,
                g.y as *mut c_void,
                d.0,
                &heur.algo,
                g.workspace as *mut c_void,
                g.workspace_bytes,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(lerr("matmul"))?;
        self.prof_end("cublaslt fp8 block gemm", t0)
    }
}
