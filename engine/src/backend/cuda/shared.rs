//! Shared experts folded into the last slots of a MoE layer's expert stacks, run apart from the
//! routed ones: as dense GEMMs at prefill sizes ([`dense`]), and at decode sizes on the side
//! stream while the compute stream routes and runs the routed experts ([`beside`]).

use cleave_kernels::ops::{GemvOut, GemvWeight, QGemm, QWeights};
use cleave_kernels::{ptr, Gpu};

use super::quant::{QIn, QuantWeight};
use super::{kerr, CudaBackend, CudaExperts, CudaTensor, ExpertData};
use crate::backend::AddNorm;
use crate::error::{EngineError, Result};

/// `out += shared(x)` for the shared experts folded into the last slots of `ex`, as dense GEMMs
/// over those slots (compressed ones expanded to bf16 first): one GEMM for every slot's
/// interleaved gate/up rows, SiLU-mul over the pairs, then each slot's down projection
/// accumulated into `out` (f32 `[x.rows, hidden]`, an allocation of `be`).
pub(super) fn dense(be: &CudaBackend, x: &CudaTensor, ex: &CudaExperts, out: u64) -> Result<()> {
    let (n, h, i, s, gpu) = (x.rows, ex.hidden, ex.inter, ex.shared, be.gpu());
    let expanded;
    let (wgu, wdn) = match &ex.data {
        ExpertData::Bf16 { gate_up, down } => bf16_slots(ex, ptr(gate_up), ptr(down)),
        ExpertData::Quant { gate_up, down } => {
            let (gu, dn) = (slots(ex, gate_up, 0, s)?, slots(ex, down, 0, s)?);
            let (bgu, bdn) = (be.buf::<u16>(s * 2 * i * h)?, be.buf::<u16>(s * h * i)?);
            gpu.qdequant(&gu, ptr(&bgu)).map_err(kerr)?;
            gpu.qdequant(&dn, ptr(&bdn)).map_err(kerr)?;
            expanded = (bgu, bdn);
            (ptr(&expanded.0), ptr(&expanded.1))
        }
        ExpertData::F32 { .. } => unreachable!("reference precision folds shared experts at every size"),
    };
    let xb = be.bf16_in(x)?;
    let gu = be.alloc_f32(n * s * 2 * i)?;
    let act = be.alloc_u16(n * s * i)?;
    gpu.linear_bf16(xb.ptr(), wgu, ptr(&gu), n, s * 2 * i, h).map_err(kerr)?;
    gpu.silu_mul(ptr(&gu), 0, ptr(&act), n, s * i, true).map_err(kerr)?;
    for j in 0..s {
        let (a, w) = (ptr(&act) + (j * i * 2) as u64, wdn + (j * h * i * 2) as u64);
        gpu.linear_bf16_acc(a, s * i, w, out, n, h, i).map_err(kerr)?;
    }
    Ok(())
}

/// Whether [`beside`] takes the shared experts of `ex` for the MoE input `x` with the layer's
/// end `e`: decode sizes up to `Variants::shared_beside` rows, folded shared experts in bf16
/// (on the GEMV) or compressed, the residual of the input's shape.
pub(super) fn beside_takes(be: &CudaBackend, x: &CudaTensor, ex: &CudaExperts, e: &AddNorm<'_, CudaTensor>) -> bool {
    let (n, h, i) = (x.rows, ex.hidden, ex.inter);
    let fits = ex.shared > 0
        && (1..=be.variants().shared_beside).contains(&n)
        && x.cols == h
        && (e.residual.rows, e.residual.cols) == (n, h);
    fits && match &ex.data {
        ExpertData::Bf16 { .. } => {
            let w = GemvWeight::Bf16(0);
            Gpu::gemv_takes(w, n, h, h) && Gpu::gemv_takes(w, n, i, ex.shared * i)
        }
        ExpertData::Quant { .. } => true,
        ExpertData::F32 { .. } => false,
    }
}

/// `res += shared(x)` at decode sizes, launched on the side stream by the caller
/// ([`CudaBackend::fork`]): bf16 slots on the GEMV (every slot's gate/up in one launch, the SiLU
/// product, each slot's down accumulated into `res`), compressed ones slot by slot on the
/// decode GEMM (gate/up, SiLU product, down, added to `res`).
pub(super) fn beside(be: &CudaBackend, x: &CudaTensor, ex: &CudaExperts, res: u64) -> Result<()> {
    let (n, h, i, s, gpu) = (x.rows, ex.hidden, ex.inter, ex.shared, be.gpu());
    match &ex.data {
        ExpertData::Bf16 { gate_up, down } => {
            let (wgu, wdn) = bf16_slots(ex, ptr(gate_up), ptr(down));
            let gu = be.alloc_f32(n * s * 2 * i)?;
            let out = GemvOut { w: GemvWeight::Bf16(wgu), y: ptr(&gu), n: s * 2 * i };
            // SAFETY: x holds n rows of h f32 (its shadow, when there is one, the same in bf16);
            // the slots hold s x 2i rows of h bf16 weights; gu n x s 2i f32.
            unsafe { gpu.gemv(x.ptr(), x.bf16_ptr().unwrap_or(0), h, n, h, &[out], 0.0) }.map_err(kerr)?;
            let act = be.alloc_u16(n * s * i)?;
            gpu.silu_mul(ptr(&gu), 0, ptr(&act), n, s * i, true).map_err(kerr)?;
            for j in 0..s {
                let (a, w) = (ptr(&act) + (j * i * 2) as u64, wdn + (j * h * i * 2) as u64);
                let out = GemvOut { w: GemvWeight::Bf16(w), y: res, n: h };
                // SAFETY: a holds n rows of i bf16 values s i apart (read as the bf16 copy, so
                // no f32 input); w h x i bf16 weights; res n x h f32 (checked by beside_takes).
                unsafe { gpu.gemv(0, a, s * i, n, i, &[out], 1.0) }.map_err(kerr)?;
            }
        }
        ExpertData::Quant { gate_up, down } => {
            for j in 0..s {
                let gu = be.alloc_f32(n * 2 * i)?;
                be.qgemm_decode(slots(ex, gate_up, j, 1)?, QIn::F32(x), QGemm::dense(n, ptr(&gu)), None)?;
                let act = be.alloc_u16(n * i)?;
                gpu.silu_mul(ptr(&gu), 0, ptr(&act), n, i, true).map_err(kerr)?;
                let y = be.alloc_f32(n * h)?;
                let a = QIn::Bf16 { ptr: ptr(&act), rows: n };
                be.qgemm_decode(slots(ex, down, j, 1)?, a, QGemm::dense(n, ptr(&y)), None)?;
                gpu.add(res, ptr(&y), n * h).map_err(kerr)?;
            }
        }
        ExpertData::F32 { .. } => {
            return Err(EngineError::Backend("shared experts beside: reference precision folds them".into()))
        }
    }
    Ok(())
}

/// The bf16 shared slots' gate/up and down weights (each stack's slots are consecutive).
fn bf16_slots(ex: &CudaExperts, gate_up: u64, down: u64) -> (u64, u64) {
    let (h, i, first) = (ex.hidden, ex.inter, ex.experts - ex.shared);
    (gate_up + (first * 2 * i * h * 2) as u64, down + (first * h * i * 2) as u64)
}

/// `count` of the shared slots of a compressed stack, from shared expert `from`.
fn slots(ex: &CudaExperts, q: &QuantWeight, from: usize, count: usize) -> Result<QWeights> {
    let first = ex.experts - ex.shared + from;
    q.view().matrices(first, count).ok_or_else(|| {
        EngineError::Backend(format!("{count} shared experts from slot {first}: not in the stack of {}", ex.experts))
    })
}
