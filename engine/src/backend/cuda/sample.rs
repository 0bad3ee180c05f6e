//! Sampling on the device: only the chosen token and its logprob per row come back to the host.

use super::{kerr, CudaBackend, CudaTensor};
use crate::backend::SampleRow;
use crate::error::{EngineError, Result};
use cleave_kernels::ops::{SampleLaunch, SAMPLE_PARAM_WORDS};

pub(super) fn sample(
    be: &CudaBackend,
    logits: &CudaTensor,
    rows: &[SampleRow],
    masks: &[u32],
) -> Result<Vec<(u32, f32)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(r) = rows.iter().find(|r| r.row as usize >= logits.rows) {
        return Err(EngineError::Backend(format!("sample: row {} of {}", r.row, logits.rows)));
    }
    let n = rows.len();
    let launch = SampleLaunch { rows: n, vocab: logits.cols };
    let words = launch.mask_words();
    if let Some(r) = rows.iter().find(|r| r.mask != SampleRow::NO_MASK && (r.mask as usize + 1) * words > masks.len()) {
        return Err(EngineError::Backend(format!("sample: mask {} of {}", r.mask, masks.len() / words)));
    }
    let mut params = Vec::with_capacity(n * SAMPLE_PARAM_WORDS);
    for r in rows {
        let p = [r.row, r.temperature.to_bits(), r.top_k, r.top_p.to_bits(), r.min_p.to_bits(), r.u.to_bits(), r.mask];
        params.extend(p);
    }
    let pp = be.upload_u32("sample", &params)?;
    let mp = if masks.is_empty() { 0 } else { be.upload_u32("sample masks", masks)? };
    let out = be.buf::<u32>(2 * n)?;
    // SAFETY: the logits, the uploaded per-row parameters and masks and the output are live
    // buffers of this GPU of the sizes sample_rows reads and writes.
    unsafe { be.gpu.sample_rows(logits.ptr(), pp, mp, cleave_kernels::ptr(&out), launch) }.map_err(kerr)?;
    let mut host = vec![0u32; 2 * n];
    // SAFETY: the source is a live allocation of this GPU holding as many values of the
    // destination's plain numeric type.
    unsafe { be.gpu.dtoh(cleave_kernels::ptr(&out), &mut host) }.map_err(kerr)?;
    Ok(host.chunks(2).map(|c| (c[0], f32::from_bits(c[1]))).collect())
}
