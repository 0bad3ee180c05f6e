//! cuBLAS GEMMs with bf16 operands, f32 accumulation and f32 output, on the GPU's stream.

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys};

use crate::{Gpu, KernelError, Result};

/// One column-major GEMM (cuBLAS convention) `C = op(A) op(B)`, optionally strided-batched.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: u64,
    pub lda: usize,
    pub stride_a: usize,
    pub b: u64,
    pub ldb: usize,
    pub stride_b: usize,
    pub c: u64,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
    /// `C = op(A) op(B) + beta C`.
    pub beta: f32,
    /// C (and D) in bf16 instead of f32.
    pub c_bf16: bool,
}

fn op(t: bool) -> sys::cublasOperation_t {
    if t {
        sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        sys::cublasOperation_t::CUBLAS_OP_N
    }
}

impl Gpu {
    /// bf16 A and B, f32 C, f32 compute.
    ///
    /// # Safety
    /// `g.a`, `g.b` (bf16) and `g.c` (f32) are device addresses of this context holding the
    /// (batched, strided) matrices `g`'s sizes and leading dimensions describe.
    pub unsafe fn gemm(&self, g: &Gemm) -> Result<()> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, g.beta);
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let f = if g.c_bf16 { bf } else { sys::cudaDataType_t::CUDA_R_32F };
        let compute = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        self.ctx.bind_to_thread()?;
        let t = self.prof_mark()?;
        let r = unsafe {
            if g.batch == 1 {
                blas::gemm_ex(
                    *self.blas.handle(),
                    op(g.trans_a),
                    op(g.trans_b),
                    g.m as i32,
                    g.n as i32,
                    g.k as i32,
                    &alpha as *const f32 as *const c_void,
                    g.a as *const c_void,
                    bf,
                    g.lda as i32,
                    g.b as *const c_void,
                    bf,
                    g.ldb as i32,
                    &beta as *const f32 as *const c_void,
                    g.c as *mut c_void,
                    f,
                    g.ldc as i32,
                    compute,
                    algo,
                )
            } else {
                blas::gemm_strided_batched_ex(
                    *self.blas.handle(),
                    op(g.trans_a),
                    op(g.trans_b),
                    g.m as i32,
                    g.n as i32,
                    g.k as i32,
                    &alpha as *const f32 as *const c_void,
                    g.a as *const c_void,
                    bf,
                    g.lda as i32,
                    g.stride_a as i64,
                    g.b as *const c_void,
                    bf,
                    g.ldb as i32,
                    g.stride_b as i64,
                    &beta as *const f32 as *const c_void,
                    g.c as *mut c_void,
                    f,
                    g.ldc as i32,
                    g.stride_c as i64,
                    g.batch as i32,
                    compute,
                    algo,
                )
            }
        };
        r.map_err(|e| KernelError::Blas(format!("{e:?} in {g:?}")))?;
        self.prof_end(if g.batch == 1 { "cublas gemm" } else { "cublas batched gemm" }, t)
    }

    /// Row-major `Y[n, m] = X[n, k] W[m, k]^T` all in f32 with f32 compute (no TF32): the MoE
    /// router, whose logits decide discrete expert choices.
    ///
    /// # Safety
    /// `x` holds `n * k`, `w` `m * k` and `y` `n * m` f32: device addresses of this context.
    pub unsafe fn linear_f32(&self, x: u64, w: u64, y: u64, n: usize, m: usize, k: usize) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let f = sys::cudaDataType_t::CUDA_R_32F;
        self.ctx.bind_to_thread()?;
        let t = self.prof_mark()?;
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                op(true),
                op(false),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                f,
                k as i32,
                x as *const c_void,
                f,
                k as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                f,
                m as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| KernelError::Blas(format!("{e:?} in f32 GEMM {n}x{k} by {m}x{k}")))?;
        self.prof_end("cublas f32 gemm", t)
    }

    /// Row-major `Y[n, m] = X[n, k] W[m, k]^T` (X, W bf16; Y f32): the linear layer.
    ///
    /// # Safety
    /// `x` holds `n * k` and `w` `m * k` bf16, `y` `n * m` f32: device addresses of this context.
    pub unsafe fn linear_bf16(&self, x: u64, w: u64, y: u64, n: usize, m: usize, k: usize) -> Result<()> {
        self.linear_bf16_strided(x, k, w, y, n, m, k, 0.0)
    }

    /// Row-major `Y[n, m] += X[n, k] W[m, k]^T` (X, W bf16; Y f32) where X's rows lie `ldx`
    /// values apart (a column block of a wider matrix).
    ///
    /// # Safety
    /// `x` holds `n` rows `ldx` apart of at least `k` bf16, `w` `m * k` bf16 and `y` `n * m` f32:
    /// device addresses of this context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn linear_bf16_acc(
        &self,
        x: u64,
        ldx: usize,
        w: u64,
        y: u64,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<()> {
        self.linear_bf16_strided(x, ldx, w, y, n, m, k, 1.0)
    }

    /// # Safety
    /// As [`Gpu::linear_bf16_acc`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn linear_bf16_strided(
        &self,
        x: u64,
        ldx: usize,
        w: u64,
        y: u64,
        n: usize,
        m: usize,
        k: usize,
        beta: f32,
    ) -> Result<()> {
        self.gemm(&Gemm {
            trans_a: true,
            trans_b: false,
            m,
            n,
            k,
            a: w,
            lda: k,
            stride_a: 0,
            b: x,
            ldb: ldx,
            stride_b: 0,
            c: y,
            ldc: m,
            stride_c: 0,
            batch: 1,
            beta,
            c_bf16: false,
        })
    }
}
