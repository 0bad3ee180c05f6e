//! Weights to the device: AWQ and FP8 checkpoints kept compressed where the kernels take their
//! grouping (`quant`), everything else converted to bf16 by a kernel (fp8 dequantized with its
//! block scales; the host only copies the stored bytes), or to f32 at reference precision.

use std::borrow::Cow;

use cleave_kernels::ops::SrcDtype;
use cleave_kernels::ptr;
use safetensors::tensor::Dtype;

use super::quant;
use super::repack::Stacking;
use super::{kerr, CudaBackend, CudaExperts, CudaWeight, ExpertData, Precision, WeightData};
use crate::backend::ExpertSource;
use crate::error::{EngineError, Result};
use crate::weights::{LinearSource, RawTensor};

fn src_dtype(weight: &RawTensor<'_>) -> Result<SrcDtype> {
    Ok(match weight.dtype {
        Dtype::BF16 => SrcDtype::Bf16,
        Dtype::F16 => SrcDtype::F16,
        Dtype::F32 => SrcDtype::F32,
        Dtype::F8_E4M3 => SrcDtype::Fp8E4m3,
        other => {
            return Err(EngineError::TensorDtype {
                path: weight.path.to_path_buf(),
                name: weight.name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    })
}

/// Writes `src` as bf16 into rows `row_base + r * row_mul + row_off` of the `[*, cols]` matrix at `dst`.
fn convert_into(
    be: &CudaBackend,
    src: &LinearSource<'_>,
    dst: u64,
    cols: usize,
    row_base: usize,
    row_mul: usize,
    row_off: usize,
) -> Result<()> {
    let (rows, c) = src.dims();
    if c != cols {
        return Err(EngineError::Backend(format!("{}: {c} input columns, expected {cols}", src.main().name)));
    }
    let gpu = be.gpu();
    // Stored bytes, their dtype and FP8 block scales; AWQ sources the compressed kernels do not
    // take (see `quant`) arrive here and are dequantized on the host to bf16 first.
    let (bytes, dtype, scale_inv): (Cow<'_, [u8]>, _, _) = match src {
        LinearSource::Dense { weight, scale_inv } => {
            (Cow::Borrowed(weight.bytes), src_dtype(weight)?, scale_inv.as_ref())
        }
        LinearSource::Awq(_) => {
            let bf16 = src.to_f32()?.iter().flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes()).collect();
            (Cow::Owned(bf16), SrcDtype::Bf16, None)
        }
    };
    if dtype == SrcDtype::Bf16 && row_mul == 1 {
        let at = dst + ((row_base + row_off) * cols * 2) as u64;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        return unsafe { gpu.htod(&bytes, at) }.map_err(kerr);
    }
    let raw = gpu.alloc::<u8>(bytes.len()).map_err(kerr)?;
    // SAFETY: the destination is a live allocation of this GPU holding as many values as the
    // source.
    unsafe { gpu.htod(&bytes, ptr(&raw)) }.map_err(kerr)?;
    let (scale, block) = match scale_inv {
        Some((s, block)) => {
            let host = s.to_f32()?;
            let buf = gpu.alloc::<f32>(host.len()).map_err(kerr)?;
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { gpu.htod(&host, ptr(&buf)) }.map_err(kerr)?;
            (Some(buf), *block)
        }
        None => (None, [1, 1]),
    };
    let sp = scale.as_ref().map_or(0, ptr);
    // SAFETY: the stored weight (and its scales) and the destination rows are live buffers of this
    // GPU of the sizes convert_weight reads and writes.
    unsafe { gpu.convert_weight(ptr(&raw), dtype, rows, cols, sp, block, dst, row_base, row_mul, row_off) }
        .map_err(kerr)
}

/// The MoE router's gate (`model.layers.N.mlp.gate.weight`): kept in f32.
pub(super) fn is_router_gate(parts: &[LinearSource<'_>]) -> bool {
    parts.len() == 1 && parts[0].main().name.ends_with(".mlp.gate.weight")
}

/// MLA's `kv_b_proj`: the attention kernels read it as bf16 (absorbed into the query and output
/// projections), so a compressed checkpoint's copy is expanded at load.
fn is_kv_b(parts: &[LinearSource<'_>]) -> bool {
    parts.iter().any(|p| p.main().name.contains(".self_attn.kv_b_proj."))
}

pub(super) fn linear(be: &CudaBackend, parts: &[LinearSource<'_>]) -> Result<CudaWeight> {
    let inp = parts.first().map(|p| p.dims().1).unwrap_or(0);
    let out: usize = parts.iter().map(|p| p.dims().0).sum();
    if is_router_gate(parts) || be.precision() == Precision::F32 {
        let mut host = Vec::with_capacity(out * inp);
        for p in parts {
            host.extend(p.to_f32()?);
        }
        let w32 = be.gpu().alloc::<f32>(host.len()).map_err(kerr)?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { be.gpu().htod(&host, ptr(&w32)) }.map_err(kerr)?;
        return Ok(CudaWeight { data: WeightData::F32(w32), out, inp });
    }
    if !is_kv_b(parts) {
        if let Some(q) = quant::upload(be, &[parts.to_vec()], Stacking::Sequential)? {
            return Ok(CudaWeight { data: WeightData::Quant(q), out, inp });
        }
    }
    let buf = be.gpu().alloc::<u16>(out * inp).map_err(kerr)?;
    let mut row = 0;
    for p in parts {
        convert_into(be, p, ptr(&buf), inp, row, 1, 0)?;
        row += p.dims().0;
    }
    Ok(CudaWeight { data: WeightData::Bf16(buf), out, inp })
}

pub(super) fn experts(
    be: &CudaBackend,
    sources: &[ExpertSource<'_>],
    first: usize,
    shared: usize,
) -> Result<CudaExperts> {
    let Some(e0) = sources.first() else {
        return Err(EngineError::Backend("a MoE layer without experts".into()));
    };
    let (inter, hidden) = e0.gate.dims();
    let e = sources.len();
    if shared >= e {
        return Err(EngineError::Backend(format!("{shared} shared experts of {e}: no routed expert left")));
    }
    for (i, s) in sources.iter().enumerate() {
        if s.gate.dims() != (inter, hidden) || s.up.dims() != (inter, hidden) || s.down.dims() != (hidden, inter) {
            return Err(EngineError::Backend(format!("expert {i}: projection shapes differ from expert 0")));
        }
    }
    let done = |data| Ok(CudaExperts { data, experts: e, shared, first, hidden, inter });
    if be.precision() == Precision::F32 {
        let (mut gu, mut dn) = (Vec::with_capacity(e * 2 * inter * hidden), Vec::with_capacity(e * hidden * inter));
        for s in sources {
            let (g, u) = (s.gate.to_f32()?, s.up.to_f32()?);
            for j in 0..inter {
                gu.extend_from_slice(&g[j * hidden..(j + 1) * hidden]);
                gu.extend_from_slice(&u[j * hidden..(j + 1) * hidden]);
            }
            dn.extend(s.down.to_f32()?);
        }
        let g = be.gpu();
        let (a, b) = (g.alloc::<f32>(gu.len()).map_err(kerr)?, g.alloc::<f32>(dn.len()).map_err(kerr)?);
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { g.htod(&gu, ptr(&a)) }.map_err(kerr)?;
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { g.htod(&dn, ptr(&b)) }.map_err(kerr)?;
        return done(ExpertData::F32 { gate_up: a, down: b });
    }
    let gate_ups: Vec<Vec<LinearSource<'_>>> = sources.iter().map(|s| vec![s.gate, s.up]).collect();
    let downs: Vec<Vec<LinearSource<'_>>> = sources.iter().map(|s| vec![s.down]).collect();
    if let Some(gate_up) = quant::upload(be, &gate_ups, Stacking::Interleaved)? {
        if let Some(down) = quant::upload(be, &downs, Stacking::Sequential)? {
            return done(ExpertData::Quant { gate_up, down });
        }
    }
    let gate_up = be.gpu().alloc::<u16>(e * 2 * inter * hidden).map_err(kerr)?;
    let down = be.gpu().alloc::<u16>(e * hidden * inter).map_err(kerr)?;
    for (i, s) in sources.iter().enumerate() {
        convert_into(be, &s.gate, ptr(&gate_up), hidden, i * 2 * inter, 2, 0)?;
        convert_into(be, &s.up, ptr(&gate_up), hidden, i * 2 * inter, 2, 1)?;
        convert_into(be, &s.down, ptr(&down), inter, i * hidden, 1, 0)?;
    }
    done(ExpertData::Bf16 { gate_up, down })
}
