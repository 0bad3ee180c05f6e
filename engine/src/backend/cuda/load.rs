//! Weights to the device, converted to bf16 by a kernel (fp8 dequantized with its block scales):
//! the host only copies the stored bytes.

use cleave_kernels::ops::SrcDtype;
use cleave_kernels::ptr;
use safetensors::tensor::Dtype;

use super::{kerr, CudaBackend, CudaExperts, CudaWeight};
use crate::backend::ExpertSource;
use crate::error::{EngineError, Result};
use crate::weights::LinearSource;

fn src_dtype(src: &LinearSource<'_>) -> Result<SrcDtype> {
    Ok(match src.weight.dtype {
        Dtype::BF16 => SrcDtype::Bf16,
        Dtype::F16 => SrcDtype::F16,
        Dtype::F32 => SrcDtype::F32,
        Dtype::F8_E4M3 => SrcDtype::Fp8E4m3,
        other => {
            return Err(EngineError::TensorDtype {
                path: src.weight.path.to_path_buf(),
                name: src.weight.name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    })
}

/// Writes `src` as bf16 into rows `row_base + r * row_mul + row_off` of the `[*, cols]` matrix at `dst`.
fn convert_into(be: &CudaBackend, src: &LinearSource<'_>, dst: u64, cols: usize, row_base: usize, row_mul: usize, row_off: usize) -> Result<()> {
    let (rows, c) = src.dims();
    if c != cols {
        return Err(EngineError::Backend(format!("{}: {c} input columns, expected {cols}", src.weight.name)));
    }
    let dtype = src_dtype(src)?;
    let gpu = be.gpu();
    if dtype == SrcDtype::Bf16 && row_mul == 1 {
        let at = dst + ((row_base + row_off) * cols * 2) as u64;
        return gpu.htod(src.weight.bytes, at).map_err(kerr);
    }
    let raw = gpu.alloc::<u8>(src.weight.bytes.len()).map_err(kerr)?;
    gpu.htod(src.weight.bytes, ptr(&raw)).map_err(kerr)?;
    let (scale, block) = match &src.scale_inv {
        Some((s, block)) => {
            let host = s.to_f32()?;
            let buf = gpu.alloc::<f32>(host.len()).map_err(kerr)?;
            gpu.htod(&host, ptr(&buf)).map_err(kerr)?;
            (Some(buf), *block)
        }
        None => (None, [1, 1]),
    };
    let sp = scale.as_ref().map_or(0, ptr);
    gpu.convert_weight(ptr(&raw), dtype, rows, cols, sp, block, dst, row_base, row_mul, row_off).map_err(kerr)
}

pub(super) fn linear(be: &CudaBackend, parts: &[LinearSource<'_>]) -> Result<CudaWeight> {
    let inp = parts.first().map(|p| p.dims().1).unwrap_or(0);
    let out: usize = parts.iter().map(|p| p.dims().0).sum();
    let buf = be.gpu().alloc::<u16>(out * inp).map_err(kerr)?;
    let mut row = 0;
    for p in parts {
        convert_into(be, p, ptr(&buf), inp, row, 1, 0)?;
        row += p.dims().0;
    }
    Ok(CudaWeight { buf, out, inp })
}

pub(super) fn experts(be: &CudaBackend, sources: &[ExpertSource<'_>]) -> Result<CudaExperts> {
    let Some(first) = sources.first() else {
        return Err(EngineError::Backend("a MoE layer without experts".into()));
    };
    let (inter, hidden) = first.gate.dims();
    let e = sources.len();
    let gate_up = be.gpu().alloc::<u16>(e * 2 * inter * hidden).map_err(kerr)?;
    let down = be.gpu().alloc::<u16>(e * hidden * inter).map_err(kerr)?;
    for (i, s) in sources.iter().enumerate() {
        if s.gate.dims() != (inter, hidden) || s.up.dims() != (inter, hidden) || s.down.dims() != (hidden, inter) {
            return Err(EngineError::Backend(format!("expert {i}: projection shapes differ from expert 0")));
        }
        convert_into(be, &s.gate, ptr(&gate_up), hidden, i * 2 * inter, 2, 0)?;
        convert_into(be, &s.up, ptr(&gate_up), hidden, i * 2 * inter, 2, 1)?;
        convert_into(be, &s.down, ptr(&down), inter, i * hidden, 1, 0)?;
    }
    Ok(CudaExperts { gate_up, down, experts: e, hidden, inter })
}
