//! Dense linears on the CUDA backend: the GEMV kernel for few rows (one launch for two
//! projections of one input), cuBLAS over f32 and bf16 weights, and the compressed GEMMs
//! ([`super::quant`]) over AWQ and FP8 weights.

use cleave_kernels::ops::{gemv_weight_reads, GemvOut, GemvWeight};
use cleave_kernels::{ptr, Gpu};

use super::weights::WeightData;
use super::{kerr, CudaBackend, CudaTensor, CudaWeight, ROUTER_GEMV_MAX_READS};
use crate::error::{EngineError, Result};

impl CudaBackend {
    /// [`crate::backend::Backend::linear`]: the GEMV where the variants pick it for these rows,
    /// else cuBLAS over f32 or bf16 weights, else the compressed GEMMs.
    pub(super) fn linear_any(&self, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
        if x.cols != w.inp {
            return Err(EngineError::Backend(format!(
                "linear: input has {} columns, weight expects {}",
                x.cols, w.inp
            )));
        }
        let y = self.tensor(x.rows, w.out)?;
        if x.rows == 0 {
            return Ok(y);
        }
        if self.gemv(x, &[(w, &y)])? {
            return Ok(y);
        }
        match &w.data {
            WeightData::F32(w32) => {
                // SAFETY: input, weight and output are live buffers of this GPU of the GEMM's sizes.
                unsafe { self.gpu.linear_f32(x.ptr(), ptr(w32), y.ptr(), x.rows, w.out, w.inp) }.map_err(kerr)?
            }
            WeightData::Bf16(b) => {
                let xb = self.bf16_in(x)?;
                // SAFETY: input, weight and output are live buffers of this GPU of the GEMM's sizes.
                unsafe { self.gpu.linear_bf16(xb.ptr(), ptr(b), y.ptr(), x.rows, w.out, w.inp) }.map_err(kerr)?;
            }
            WeightData::Quant(q) => self.linear_quant(x, q, &y)?,
        }
        Ok(y)
    }

    /// [`crate::backend::Backend::linear_pair`]: both in one GEMV launch where it takes them,
    /// else two linears.
    pub(super) fn linear_two(
        &self,
        x: &CudaTensor,
        a: &CudaWeight,
        b: &CudaWeight,
    ) -> Result<(CudaTensor, CudaTensor)> {
        // Outputs are allocated only where the GEMV may take the pair (not at batch sizes above it).
        if x.cols == a.inp && x.cols == b.inp && (1..=self.variants().gemv_rows).contains(&x.rows) {
            let (ya, yb) = (self.tensor(x.rows, a.out)?, self.tensor(x.rows, b.out)?);
            if self.gemv(x, &[(a, &ya), (b, &yb)])? {
                return Ok((ya, yb));
            }
        }
        Ok((self.linear_any(x, a)?, self.linear_any(x, b)?))
    }

    /// `y = linear(x, w)` for each `(w, y)` as one GEMV launch, when the variants pick the GEMV
    /// for `x`'s rows (`gemv_rows`; over f32 weights also up to `router_gemv_rows` within
    /// [`ROUTER_GEMV_MAX_READS`]) and it takes them (one weight type, uncompressed, aligned):
    /// false, with nothing launched, otherwise.
    fn gemv(&self, x: &CudaTensor, outs: &[(&CudaWeight, &CudaTensor)]) -> Result<bool> {
        let xb = x.bf16_ptr().unwrap_or(0);
        let mut parts = Vec::with_capacity(outs.len());
        for (w, y) in outs {
            let g = match &w.data {
                WeightData::F32(w32) => GemvWeight::F32(ptr(w32)),
                WeightData::Bf16(b) => GemvWeight::Bf16(ptr(b)),
                WeightData::Quant(_) => return Ok(false),
            };
            let aligned = [x.ptr(), xb, g.ptr()].iter().all(|p| p.is_multiple_of(16));
            if !aligned || w.inp != x.cols || !Gpu::gemv_takes(g, x.rows, x.cols, x.cols) {
                return Ok(false);
            }
            parts.push(GemvOut { w: g, y: y.ptr(), n: w.out });
        }
        let one_type = parts.windows(2).all(|p| std::mem::discriminant(&p[0].w) == std::mem::discriminant(&p[1].w));
        let v = self.variants();
        let takes = match parts.first().map(|p| p.w) {
            Some(GemvWeight::F32(_)) => {
                let bytes: usize = parts.iter().map(|p| p.n * x.cols * p.w.bytes()).sum();
                let reads = bytes * gemv_weight_reads(x.rows);
                x.rows <= v.gemv_rows || (x.rows <= v.router_gemv_rows && reads <= ROUTER_GEMV_MAX_READS)
            }
            _ => x.rows <= v.gemv_rows,
        };
        if !takes || !one_type {
            return Ok(false);
        }
        // SAFETY: x holds rows x cols f32 (its shadow, when non-zero, the same in bf16), each
        // weight out x cols values and each y rows x out f32: all allocations of this backend.
        unsafe { self.gpu.gemv(x.ptr(), xb, x.cols, x.rows, x.cols, &parts, 0.0) }.map_err(kerr)?;
        Ok(true)
    }
}
