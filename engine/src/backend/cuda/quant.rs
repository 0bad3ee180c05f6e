//! Checkpoint weights kept compressed on the GPU (AWQ int4, FP8 e4m3 with block scales): which
//! sources qualify, and their packing into the layout of `cleave_kernels::quant`.

use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::{QGemm, QWeights};
use cleave_kernels::ptr;
use cleave_kernels::quant::{pack, QFormat, QPacked, QShape};
use rayon::prelude::*;
use safetensors::tensor::Dtype;

use super::{kerr, CudaBackend, CudaTensor, QGEMM_MAX_ROWS};
use crate::error::Result;
use crate::weights::LinearSource;

/// A stack of compressed matrices on the device.
pub struct QuantWeight {
    words: CudaSlice<u32>,
    scales: CudaSlice<u8>,
    zeros: CudaSlice<u32>,
    pub shape: QShape,
}

impl QuantWeight {
    pub fn view(&self) -> QWeights {
        QWeights { shape: self.shape, words: ptr(&self.words), scales: ptr(&self.scales), zeros: ptr(&self.zeros) }
    }
}

/// How a matrix is stacked from its parts: one after another along the output dimension, or
/// row-interleaved (row `2j + p` is row `j` of part `p`: the experts' gate/up layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stacking {
    Sequential,
    Interleaved,
}

/// The compressed format and group size `src` keeps on the GPU, if the kernels take it.
fn plan(src: &LinearSource<'_>) -> Option<(QFormat, usize)> {
    let (_, k) = src.dims();
    match src {
        LinearSource::Awq(a) if QShape::supported(k, a.group()) => Some((QFormat::AwqInt4, a.group())),
        LinearSource::Dense { weight, scale_inv: Some((_, [_, b1])) }
            if weight.dtype == Dtype::F8_E4M3 && QShape::supported(k, *b1) =>
        {
            Some((QFormat::Fp8E4m3, *b1))
        }
        _ => None,
    }
}

/// One source as `[n, k]` values (AWQ nibbles or e4m3 bytes) with per-(group, column) scales and
/// zero points.
struct Host {
    n: usize,
    k: usize,
    group: usize,
    values: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<u8>,
}

fn host(src: &LinearSource<'_>, group: usize) -> Result<Host> {
    let (n, k) = src.dims();
    let groups = k.div_ceil(group);
    Ok(match src {
        LinearSource::Awq(a) => {
            // Straight from the packed words into `[n, k]`, rows in parallel.
            let mut values = vec![0u8; n * k];
            values.par_chunks_mut(k).enumerate().for_each(|(c, row)| {
                for (kk, v) in row.iter_mut().enumerate() {
                    *v = a.nibble(kk, c);
                }
            });
            Host { n, k, group, values, scales: a.scales.to_f32()?, zeros: a.unpack_zeros() }
        }
        LinearSource::Dense { weight, scale_inv } => {
            let (s, [b0, b1]) = scale_inv.as_ref().expect("planned as fp8");
            let s = s.to_f32()?;
            let sc = k.div_ceil(*b1);
            let mut scales = vec![0f32; groups * n];
            for g in 0..groups {
                for c in 0..n {
                    scales[g * n + c] = s[(c / b0) * sc + g];
                }
            }
            Host { n, k, group, values: weight.bytes.to_vec(), scales, zeros: Vec::new() }
        }
    })
}

/// Packs one matrix stacked from `parts` (`None`: an AWQ scale that is not an f16).
fn pack_matrix(format: QFormat, parts: &[Host], stacking: Stacking) -> Option<QPacked> {
    let (k, group) = (parts[0].k, parts[0].group);
    let n: usize = parts.iter().map(|p| p.n).sum();
    // The (part, row) each stacked row comes from, resolved once rather than per element.
    let at: Vec<(&Host, usize)> = match stacking {
        Stacking::Interleaved => (0..n).map(|row| (&parts[row % parts.len()], row / parts.len())).collect(),
        Stacking::Sequential => parts.iter().flat_map(|p| (0..p.n).map(move |r| (p, r))).collect(),
    };
    pack(
        &QShape { format, experts: 1, n, k, group },
        |c, kk| at[c].0.values[at[c].1 * k + kk],
        |g, c| at[c].0.scales[g * at[c].0.n + at[c].1],
        |g, c| at[c].0.zeros.get(g * at[c].0.n + at[c].1).copied().unwrap_or(0),
    )
}

/// Uploads `matrices` (each stacked from its parts) as one compressed stack, or `None` when any
/// part is in a format, grouping or scale precision the kernels do not take (the caller then
/// expands the weights to bf16).
pub(super) fn upload(
    be: &CudaBackend,
    matrices: &[Vec<LinearSource<'_>>],
    stacking: Stacking,
) -> Result<Option<QuantWeight>> {
    let Some(first) = matrices.first().and_then(|m| m.first()) else { return Ok(None) };
    let Some((format, group)) = plan(first) else { return Ok(None) };
    let k = first.dims().1;
    let uniform = matrices.iter().flatten().all(|s| plan(s) == Some((format, group)) && s.dims().1 == k);
    let rows = |m: &Vec<LinearSource<'_>>| m.iter().map(|s| s.dims().0).sum::<usize>();
    let n = rows(&matrices[0]);
    if !uniform || matrices.iter().any(|m| rows(m) != n || (stacking == Stacking::Interleaved && m.len() != 2)) {
        return Ok(None);
    }
    let shape = QShape { format, experts: matrices.len(), n, k, group };
    let gpu = be.gpu();
    let words = gpu.alloc::<u32>(shape.experts * shape.words_per_matrix()).map_err(kerr)?;
    let scales = gpu.alloc::<u8>(shape.experts * shape.scales_per_matrix() * format.scale_bytes()).map_err(kerr)?;
    let zeros = gpu.alloc::<u32>((shape.experts * shape.zero_words_per_matrix()).max(1)).map_err(kerr)?;
    // Packed on the host a few matrices at a time, in parallel; uploaded in order.
    for (c, chunk) in matrices.chunks(16).enumerate() {
        let packed: Vec<Option<QPacked>> = chunk
            .par_iter()
            .map(|parts| {
                let hosts = parts.iter().map(|s| host(s, group)).collect::<Result<Vec<_>>>()?;
                Ok(pack_matrix(format, &hosts, stacking))
            })
            .collect::<Result<_>>()?;
        for (i, p) in packed.into_iter().enumerate() {
            let Some(p) = p else { return Ok(None) };
            let e = c * 16 + i;
            gpu.htod(&p.words, ptr(&words) + (e * shape.words_per_matrix() * 4) as u64).map_err(kerr)?;
            gpu.htod(&p.scales, ptr(&scales) + (e * p.scales.len()) as u64).map_err(kerr)?;
            if !p.zeros.is_empty() {
                gpu.htod(&p.zeros, ptr(&zeros) + (e * shape.zero_words_per_matrix() * 4) as u64).map_err(kerr)?;
            }
        }
        // The host buffers above must outlive their asynchronous copies.
        gpu.sync().map_err(kerr)?;
    }
    Ok(Some(QuantWeight { words, scales, zeros, shape }))
}

impl CudaBackend {
    /// `y = x W^T` over a compressed weight: up to [`QGEMM_MAX_ROWS`] rows straight from the
    /// compressed bytes (split over the input channels until the GPU is full), more rows (prefill)
    /// through a transient bf16 expansion and cuBLAS.
    pub(super) fn linear_quant(&self, x: &CudaTensor, q: &QWeights, y: &CudaTensor) -> Result<()> {
        let xb = self.bf16_in(x)?;
        let (rows, n) = (x.rows, q.shape.n);
        if rows > QGEMM_MAX_ROWS {
            let wb = self.buf::<u16>(n * q.shape.k)?;
            self.gpu.qdequant(q, ptr(&wb)).map_err(kerr)?;
            return self.gpu.linear_bf16(xb.ptr(), ptr(&wb), y.ptr(), rows, n, q.shape.k).map_err(kerr);
        }
        // Up to 16 rows one deep-pipelined row tile; more rows 64-row tiles, so that weights larger
        // than L2 (V3's dense MLP: 132 MB in int4) are not streamed from HBM once per 16 rows.
        let bm = if rows <= 16 { 16 } else { 64 };
        let splits = self.gpu.qgemm_splits(q, rows, bm);
        let part = if splits > 1 { Some(self.alloc_f32(splits * rows * n)?) } else { None };
        let g = QGemm {
            silu: false,
            x: xb.ptr(),
            rowidx: 0,
            y: part.as_ref().map_or(y.ptr(), |p| ptr(p)),
            tiles: 0,
            meta: 0,
            max_tiles: 0,
            rows,
            bm,
            splits,
        };
        self.gpu.qgemm(q, &g).map_err(kerr)?;
        if let Some(p) = part {
            self.gpu.qgemm_reduce(ptr(&p), y.ptr(), splits, rows * n).map_err(kerr)?;
        }
        Ok(())
    }
}
