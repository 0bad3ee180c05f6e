//! Checkpoint weights kept compressed on the GPU (AWQ int4, FP8 e4m3 with block scales): which
//! sources qualify, and their packing into the layout of `cleave_kernels::quant`.

use cleave_kernels::blaslt::{Fp8BlockGemm, LT_WORKSPACE_BYTES};
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::fp8::{self, BLOCK};
use cleave_kernels::ops::{Fp8Order, QCut, QGemm, QPersist, QWeights};
use cleave_kernels::quant::{awq_slot, pack, pack_awq, QFormat, QPacked, QShape};
use cleave_kernels::{ptr, KernelError};
use rayon::prelude::*;
use safetensors::tensor::Dtype;

use super::{kerr, CudaBackend, CudaTensor, CudaWeight, Precision, QRows, WeightData, QGEMM_MAX_ROWS};
use crate::backend::{check_split, Backend};
use crate::error::{EngineError, Result};
use crate::weights::{awq_shift, AwqSource, LinearSource};

/// The activations of a decode GEMM over compressed weights: an f32 tensor (with its bf16 shadow
/// when it has one), or bf16 rows (`rows` of them, the expert MLP's intermediate).
pub(super) enum QIn<'a> {
    F32(&'a CudaTensor),
    Bf16 { ptr: u64, rows: usize },
}

impl QIn<'_> {
    /// Rows of the input matrix (`rowidx` may read any of them).
    fn rows(&self) -> usize {
        match self {
            QIn::F32(t) => t.rows,
            QIn::Bf16 { rows, .. } => *rows,
        }
    }
}

/// A stack of compressed matrices on the device.
pub struct QuantWeight {
    words: CudaSlice<u32>,
    scales: CudaSlice<u8>,
    zeros: CudaSlice<u32>,
    /// One FP8 matrix's scales per 128 x 128 block in cuBLASLt's layout, when its scales are
    /// uniform over such blocks and its shape suits the block-scaled GEMM (the prefill path).
    block_scales: Option<Box<CudaSlice<f32>>>,
    /// FP8 only: every matrix has, per group and 128-row block, one scale for its even rows and
    /// one for its odd rows (DeepSeek's 128 x 128 blocks, gate/up interleaved or not), which the
    /// FP8 wgmma grouped GEMM's faster kernels take.
    pub paired_scales: bool,
    pub shape: QShape,
}

/// What the block-scaled FP8 GEMM can write on this GPU, found at its first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Out {
    Untried,
    F32,
    Bf16,
    /// cuBLASLt has no such GEMM here: prefill expands FP8 weights to bf16.
    Unavailable,
}

impl QuantWeight {
    pub fn view(&self) -> QWeights {
        QWeights { shape: self.shape, words: ptr(&self.words), scales: ptr(&self.scales), zeros: ptr(&self.zeros) }
    }
    pub fn block_scales(&self) -> Option<u64> {
        self.block_scales.as_deref().map(ptr)
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

/// Whether `a` and `b` are kept compressed alike (format, grouping, input size), so that stacked
/// they are one compressed matrix: one decode GEMM (and for FP8 one activation quantization)
/// instead of two. Others gain nothing (bf16 pairs of a few rows share one GEMV launch already).
pub(super) fn stack_together(a: &LinearSource<'_>, b: &LinearSource<'_>) -> bool {
    plan(a).is_some() && plan(a) == plan(b) && a.dims().1 == b.dims().1
}

/// One source's `[n, k]` values (AWQ nibbles or e4m3 bytes), read where they are stored, with
/// per-(group, column) scales and zero points.
struct Host<'a> {
    n: usize,
    k: usize,
    group: usize,
    values: Values<'a>,
    scales: Vec<f32>,
    zeros: Vec<u8>,
}

/// Where a [`Host`]'s values are read from: no unpacked copy is made (run 100: the load of a
/// rank of R1 was mostly this repacking).
#[derive(Clone, Copy)]
enum Values<'a> {
    /// e4m3 bytes, `[n, k]` row-major.
    Fp8(&'a [u8]),
    /// AutoAWQ's packed words.
    Awq(AwqSource<'a>),
}

impl Host<'_> {
    fn value(&self, row: usize, kk: usize) -> u8 {
        match self.values {
            Values::Fp8(b) => b[row * self.k + kk],
            Values::Awq(a) => a.nibble(kk, row),
        }
    }
}

/// A stored AWQ word's column run feeding one block of the packed layout ([`fill_awq`]).
#[derive(Clone, Copy)]
struct SourceWords<'a> {
    src: AwqSource<'a>,
    /// The first of the 8 outputs its words hold.
    first: usize,
    /// (column in the block, nibble shift) of the outputs this block takes, `n` of them.
    cols: [(usize, usize); 8],
    n: usize,
}

/// Columns `8 nb..8 nb + 8` of an AWQ matrix stacked from `at`, for [`pack_awq`]. Each stored
/// word is read once: it holds 8 outputs of one part, which the stacking puts all in this block
/// (sequential) or half (gate/up interleaved).
fn fill_awq(at: &[(&Host<'_>, usize)], k: usize, nb: usize, block: &mut [u32]) {
    let mut words: [Option<SourceWords<'_>>; 8] = [None; 8];
    let mut count = 0;
    for (g, &(h, row)) in at.iter().skip(8 * nb).take(8).enumerate() {
        let Values::Awq(src) = h.values else { unreachable!("an AWQ stack holds AWQ parts") };
        let first = row - row % 8;
        let same = |w: &Option<SourceWords<'_>>| {
            w.as_ref().is_some_and(|w| std::ptr::eq(w.src.qweight.bytes, src.qweight.bytes) && w.first == first)
        };
        let slot = words[..count].iter().position(same).unwrap_or_else(|| {
            words[count] = Some(SourceWords { src, first, cols: [(0, 0); 8], n: 0 });
            count += 1;
            count - 1
        });
        let w = words[slot].as_mut().expect("filled above");
        w.cols[w.n] = (g, awq_shift(row));
        w.n += 1;
    }
    for (kk, unit) in (0..k).step_by(32).zip(block.chunks_mut(32)) {
        for i in 0..32.min(k - kk) {
            let (t, j) = awq_slot(i);
            for w in words[..count].iter().flatten() {
                let word = w.src.word(kk + i, w.first);
                for &(g, shift) in &w.cols[..w.n] {
                    unit[4 * g + t] |= ((word >> shift) & 0xf) << (4 * j);
                }
            }
        }
    }
}

fn host<'a>(src: &LinearSource<'a>, group: usize) -> Result<Host<'a>> {
    let (n, k) = src.dims();
    let groups = k.div_ceil(group);
    Ok(match src {
        LinearSource::Awq(a) => {
            Host { n, k, group, values: Values::Awq(*a), scales: a.scales.to_f32()?, zeros: a.unpack_zeros() }
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
            Host { n, k, group, values: Values::Fp8(weight.bytes), scales, zeros: Vec::new() }
        }
    })
}

/// The (part, row) each row of the matrix stacked from `parts` comes from.
fn stacked_rows<'h, 'a>(parts: &'h [Host<'a>], stacking: Stacking) -> Vec<(&'h Host<'a>, usize)> {
    let n: usize = parts.iter().map(|p| p.n).sum();
    match stacking {
        Stacking::Interleaved => (0..n).map(|row| (&parts[row % parts.len()], row / parts.len())).collect(),
        Stacking::Sequential => parts.iter().flat_map(|p| (0..p.n).map(move |r| (p, r))).collect(),
    }
}

/// Packs one matrix stacked from `parts` (`None`: an AWQ scale that is not an f16).
fn pack_matrix(format: QFormat, parts: &[Host], stacking: Stacking) -> Option<QPacked> {
    let (k, group) = (parts[0].k, parts[0].group);
    let at = stacked_rows(parts, stacking);
    let n = at.len();
    let shape = QShape { format, experts: 1, n, k, group };
    let scale = |g: usize, c: usize| at[c].0.scales[g * at[c].0.n + at[c].1];
    let zero = |g: usize, c: usize| at[c].0.zeros.get(g * at[c].0.n + at[c].1).copied().unwrap_or(0);
    match format {
        QFormat::AwqInt4 => pack_awq(&shape, |nb, block| fill_awq(&at, k, nb, block), scale, zero),
        QFormat::Fp8E4m3 => pack(&shape, |c, kk| at[c].0.value(at[c].1, kk), scale, zero),
    }
}

/// The scales of an FP8 matrix stacked from `parts` per 128 x 128 block, in cuBLASLt's layout
/// (`[n / 128][fp8::weight_scale_ld(k)]`), when every block has one scale and the shape suits the
/// block-scaled GEMM; else `None` (prefill then expands the weight to bf16).
fn block_scales(parts: &[Host], stacking: Stacking) -> Option<Vec<f32>> {
    let (k, group) = (parts[0].k, parts[0].group);
    let at = stacked_rows(parts, stacking);
    let n = at.len();
    if group != BLOCK || !k.is_multiple_of(BLOCK) || !n.is_multiple_of(16) {
        return None;
    }
    let ld = fp8::weight_scale_ld(k);
    let mut out = vec![0f32; n.div_ceil(BLOCK) * ld];
    for (nb, rows) in at.chunks(BLOCK).enumerate() {
        for g in 0..k / BLOCK {
            let scale = |&(p, r): &(&Host, usize)| p.scales[g * p.n + r];
            let s = scale(&rows[0]);
            if rows.iter().any(|row| scale(row) != s) {
                return None;
            }
            out[nb * ld + g] = s;
        }
    }
    Some(out)
}

/// Whether the FP8 matrix stacked from `parts` has, per group and 128-row block, one scale for
/// its even rows and one for its odd rows.
fn paired_scales(parts: &[Host], stacking: Stacking) -> bool {
    let at = stacked_rows(parts, stacking);
    let groups = parts[0].k.div_ceil(parts[0].group);
    at.chunks(BLOCK).all(|rows| {
        (0..groups).all(|g| {
            let scale = |&(p, r): &(&Host, usize)| p.scales[g * p.n + r];
            rows.iter().enumerate().all(|(i, row)| scale(row) == scale(&rows[i % 2]))
        })
    })
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
    let single_fp8 = format == QFormat::Fp8E4m3 && matrices.len() == 1;
    let mut blocks = None;
    let mut paired = format == QFormat::Fp8E4m3;
    // Packed on the host a few matrices at a time, in parallel; uploaded in order.
    for (c, chunk) in matrices.chunks(16).enumerate() {
        let packed: Vec<(Option<QPacked>, Option<Vec<f32>>, bool)> = chunk
            .par_iter()
            .map(|parts| {
                let hosts = parts.iter().map(|s| host(s, group)).collect::<Result<Vec<_>>>()?;
                let blocks = if single_fp8 { block_scales(&hosts, stacking) } else { None };
                let pairs = paired && paired_scales(&hosts, stacking);
                Ok((pack_matrix(format, &hosts, stacking), blocks, pairs))
            })
            .collect::<Result<_>>()?;
        for (i, (p, b, pairs)) in packed.into_iter().enumerate() {
            let Some(p) = p else { return Ok(None) };
            paired &= pairs;
            if let Some(b) = b {
                let dev = gpu.alloc::<f32>(b.len()).map_err(kerr)?;
                gpu.htod(&b, ptr(&dev)).map_err(kerr)?;
                gpu.sync().map_err(kerr)?;
                blocks = Some(Box::new(dev));
            }
            let stack = QWeights { shape, words: ptr(&words), scales: ptr(&scales), zeros: ptr(&zeros) };
            let dst = stack.matrices(c * 16 + i, 1).expect("a matrix of the stack");
            gpu.htod(&p.words, dst.words).map_err(kerr)?;
            gpu.htod(&p.scales, dst.scales).map_err(kerr)?;
            if !p.zeros.is_empty() {
                gpu.htod(&p.zeros, dst.zeros).map_err(kerr)?;
            }
        }
        // The host buffers above must outlive their asynchronous copies.
        gpu.sync().map_err(kerr)?;
    }
    Ok(Some(QuantWeight { words, scales, zeros, block_scales: blocks, paired_scales: paired, shape }))
}

impl CudaBackend {
    /// `y = x W^T` over a compressed weight: up to [`QGEMM_MAX_ROWS`] rows straight from the
    /// compressed bytes (split over the input channels until the GPU is full); more rows (prefill)
    /// on FP8 tensor cores for FP8 block-scaled weights (bf16 precision), else through a
    /// transient bf16 expansion and cuBLAS.
    pub(super) fn linear_quant(&self, x: &CudaTensor, w: &QuantWeight, y: &CudaTensor) -> Result<()> {
        let q = w.view();
        let (rows, n) = (x.rows, q.shape.n);
        if rows > QGEMM_MAX_ROWS {
            if let Some(bs) = &w.block_scales {
                if self.precision == Precision::Bf16
                    && self.variants().fp8_tensor_cores
                    && self.linear_fp8_block(x, &q, bs, y)?
                {
                    return Ok(());
                }
            }
            let xb = self.bf16_in(x)?;
            let wb = self.buf::<u16>(n * q.shape.k)?;
            self.gpu.qdequant(&q, ptr(&wb)).map_err(kerr)?;
            return self.gpu.linear_bf16(xb.ptr(), ptr(&wb), y.ptr(), rows, n, q.shape.k).map_err(kerr);
        }
        self.qgemm_decode(w, QIn::F32(x), QGemm::dense(rows, y.ptr()), None)
    }

    /// [`crate::backend::Backend::linear_split`]: over a compressed weight at decode sizes, the
    /// cut made by the split-K reduction (or a copy of the one split); otherwise the linear, then
    /// a copy that cuts.
    pub(super) fn linear_cut(&self, x: &CudaTensor, w: &CudaWeight, first: usize) -> Result<(CudaTensor, CudaTensor)> {
        check_split(first, w.out, x.cols, w.inp)?;
        let (rows, n) = (x.rows, w.out);
        let (a, b) = (self.tensor(rows, first)?, self.tensor(rows, n - first)?);
        if rows == 0 {
            return Ok((a, b));
        }
        let cut = QCut { first, rest: b.ptr() };
        match &w.data {
            WeightData::Quant(q) if rows <= QGEMM_MAX_ROWS => {
                self.qgemm_decode(q, QIn::F32(x), QGemm::dense(rows, a.ptr()), Some(cut))?;
            }
            _ => {
                let y = self.linear(x, w)?;
                self.gpu.qgemm_reduce(y.ptr(), a.ptr(), 1, rows, n, Some(cut)).map_err(kerr)?;
            }
        }
        Ok((a, b))
    }

    /// The persistent shape a decode GEMM of `rows` over `w` runs (`None`: the tiled kernel): the
    /// variants' choice, for FP8 only where its activations go to FP8 tensor cores in whole
    /// 128-channel blocks.
    pub(super) fn qgemm_shape(&self, w: &QuantWeight, rows: QRows) -> Option<QPersist> {
        let (s, v) = (w.shape, self.variants());
        v.qgemm.shape(s.format, s.group, rows).filter(|_| match s.format {
            QFormat::AwqInt4 => true,
            QFormat::Fp8E4m3 => v.fp8_tensor_cores && s.k.is_multiple_of(BLOCK),
        })
    }

    /// A decode-sized GEMM over `w` (`g.x` is set here from `x`): the persistent kernel when the
    /// variants give a shape for the weight's format and grouping (FP8 on FP8 tensor cores, the
    /// activations quantized first, unless `CLEAVE_FP8_GEMM=bf16`), else the tiled kernels; a
    /// dense GEMM (`g.tiles == 0`) split over the input channels until the GPU is full, its
    /// result cut in two by `cut` (in the split-K reduction, or a copy when there is one split).
    pub(super) fn qgemm_decode(&self, w: &QuantWeight, x: QIn<'_>, g: QGemm, cut: Option<QCut>) -> Result<()> {
        if cut.is_some() && (g.tiles != 0 || g.silu) {
            return Err(EngineError::Backend("qgemm_decode: only a dense f32 result can be cut".into()));
        }
        let q = w.view();
        let (k, n, format) = (q.shape.k, q.shape.n, q.shape.format);
        let rows = if g.tiles == 0 { QRows::Dense(g.rows) } else { QRows::Tiles(g.bm) };
        let persistent = self.qgemm_shape(w, rows);
        // The activations as the kernel reads them: e4m3 with scales, or bf16 (kept alive here).
        let (mut bf16, mut fp8) = (None, None);
        let g = match (persistent, &x) {
            (Some(_), _) if format == QFormat::Fp8E4m3 => {
                let rows = x.rows();
                let (x8, xs) = (self.buf::<u32>(rows * k / 4)?, self.buf::<f32>(rows * k / BLOCK)?);
                let (src, is_bf16) = match &x {
                    QIn::F32(t) => (t.ptr(), false),
                    QIn::Bf16 { ptr, .. } => (*ptr, true),
                };
                self.gpu.act_quant_fp8_mma(Fp8Order::Mma, src, is_bf16, rows, k, ptr(&x8), ptr(&xs)).map_err(kerr)?;
                let g = QGemm { x: ptr(&x8), x_scales: ptr(&xs), ..g };
                fp8 = Some((x8, xs));
                g
            }
            (_, QIn::F32(t)) => {
                let b = self.bf16_in(t)?;
                let g = QGemm { x: b.ptr(), ..g };
                bf16 = Some(b);
                g
            }
            (_, QIn::Bf16 { ptr, .. }) => QGemm { x: *ptr, ..g },
        };
        let splits = match (g.tiles, persistent) {
            (0, Some(cfg)) => self.gpu.qgp_splits(&q, g.rows, cfg).map_err(kerr)?,
            (0, None) => self.gpu.qgemm_splits(&q, g.rows, g.bm),
            _ => 1,
        };
        let part = if splits > 1 || cut.is_some() { Some(self.alloc_f32(splits * g.rows * n)?) } else { None };
        let run = QGemm { y: part.as_ref().map_or(g.y, |p| ptr(p)), splits, ..g };
        match persistent {
            Some(cfg) => self.gpu.qgemm_persistent(&q, &run, cfg),
            None => self.gpu.qgemm(&q, &run),
        }
        .map_err(kerr)?;
        if let Some(p) = part {
            self.gpu.qgemm_reduce(ptr(&p), g.y, splits, g.rows, n, cut).map_err(kerr)?;
        }
        drop((bf16, fp8));
        Ok(())
    }

    /// DeepSeek's FP8 scheme on FP8 tensor cores: the weight's e4m3 bytes unpacked row-major, the
    /// activations quantized per token per 128 channels, cuBLASLt's block-scaled GEMM. `false`
    /// when this GPU's cuBLASLt has no such GEMM (found once; the caller expands to bf16).
    fn linear_fp8_block(&self, x: &CudaTensor, q: &QWeights, bs: &CudaSlice<f32>, y: &CudaTensor) -> Result<bool> {
        let tries: &[Fp8Out] = match self.fp8_out.get() {
            Fp8Out::Unavailable => return Ok(false),
            Fp8Out::Untried => &[Fp8Out::F32, Fp8Out::Bf16],
            Fp8Out::F32 => &[Fp8Out::F32],
            Fp8Out::Bf16 => &[Fp8Out::Bf16],
        };
        let (rows, n, k) = (x.rows, q.shape.n, q.shape.k);
        let rows_p = fp8::padded_rows(rows);
        let w8 = self.buf::<u32>(n * k / 4)?;
        self.gpu.qbytes_fp8(q, ptr(&w8)).map_err(kerr)?;
        let x8 = self.buf::<u32>(rows_p * k / 4)?;
        let xs = self.buf::<f32>(k / BLOCK * rows_p)?;
        self.gpu.act_quant_fp8(x.ptr(), rows, k, ptr(&x8), ptr(&xs)).map_err(kerr)?;
        let ws = self.buf::<u32>(LT_WORKSPACE_BYTES / 4)?;
        for &out in tries {
            // The GEMM writes rows_p rows: straight into `y` when f32 and unpadded.
            let direct = out == Fp8Out::F32 && rows_p == rows;
            let tmp_f32 = if out == Fp8Out::F32 && !direct { Some(self.buf::<f32>(rows_p * n)?) } else { None };
            let tmp_bf16 = if out == Fp8Out::Bf16 { Some(self.buf::<u16>(rows_p * n)?) } else { None };
            let dst = tmp_f32.as_ref().map(|b| ptr(b)).or(tmp_bf16.as_ref().map(|b| ptr(b))).unwrap_or(y.ptr());
            let g = Fp8BlockGemm {
                w: ptr(&w8),
                w_scales: ptr(bs),
                x: ptr(&x8),
                x_scales: ptr(&xs),
                y: dst,
                y_bf16: out == Fp8Out::Bf16,
                n,
                k,
                rows_p,
                workspace: ptr(&ws),
                workspace_bytes: LT_WORKSPACE_BYTES,
            };
            match self.gpu.gemm_fp8_block(&g) {
                Ok(()) => {}
                Err(KernelError::Unsupported(why)) => {
                    tracing::debug!(%why, "block-scaled FP8 GEMM: output type not supported");
                    continue;
                }
                Err(e) => return Err(kerr(e)),
            }
            if let Some(t) = &tmp_f32 {
                self.gpu.dtod(y.ptr(), ptr(t), rows * n * 4).map_err(kerr)?;
            }
            if let Some(t) = &tmp_bf16 {
                self.gpu.cast_bf16_f32(ptr(t), y.ptr(), rows * n).map_err(kerr)?;
            }
            if self.fp8_out.get() == Fp8Out::Untried {
                tracing::info!(output = ?out, "FP8 prefill linears run on FP8 tensor cores (cuBLASLt block scaling)");
            }
            self.fp8_out.set(out);
            return Ok(true);
        }
        tracing::warn!("this GPU's cuBLASLt has no block-scaled FP8 GEMM: FP8 prefill linears expand to bf16");
        self.fp8_out.set(Fp8Out::Unavailable);
        Ok(false)
    }

    /// How FP8 prefill linears run on this GPU, as far as found yet.
    pub fn fp8_prefill_output(&self) -> Fp8Out {
        self.fp8_out.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(n: usize, k: usize, scale: impl Fn(usize, usize) -> f32) -> Host<'static> {
        let groups = k / BLOCK;
        let scales = (0..groups * n).map(|i| scale(i / n, i % n)).collect();
        Host { n, k, group: BLOCK, values: Values::Fp8(&[]), scales, zeros: Vec::new() }
    }

    /// AWQ stacks packed a stored word at a time equal the per-value packing, gate/up
    /// interleaved and sequential, with inputs short of the layout's 128-channel padding.
    #[test]
    fn awq_stacks_pack_like_the_per_value_reference() {
        use crate::weights::random::{Fill, TensorSpec};
        use crate::weights::RawTensor;
        let (n, k, group) = (24, 160, 32);
        let spec = |name: &str, shape: Vec<usize>, kind| TensorSpec { name: name.into(), shape, kind }.generate(3);
        let (qs, zs, ss) = ([k, n / 8], [k / group, n / 8], [k / group, n]);
        let bytes: Vec<[Vec<u8>; 3]> = ["gate", "up"]
            .iter()
            .map(|p| {
                [
                    spec(&format!("{p}.q"), qs.to_vec(), Fill::AwqQ),
                    spec(&format!("{p}.z"), zs.to_vec(), Fill::AwqZeros),
                    spec(&format!("{p}.s"), ss.to_vec(), Fill::AwqScales(k)),
                ]
            })
            .collect();
        let path = std::path::Path::new("t");
        let raw =
            |name, dtype, shape: &'static [usize], bytes: &'static [u8]| RawTensor { name, path, dtype, shape, bytes };
        let leak = |v: &Vec<u8>| -> &'static [u8] { Box::leak(v.clone().into_boxed_slice()) };
        let (qs, zs, ss): (&'static [usize], &'static [usize], &'static [usize]) =
            (Box::leak(Box::new(qs)), Box::leak(Box::new(zs)), Box::leak(Box::new(ss)));
        let sources: Vec<LinearSource<'static>> = bytes
            .iter()
            .map(|[q, z, s]| {
                LinearSource::Awq(AwqSource {
                    qweight: raw("q", Dtype::I32, qs, leak(q)),
                    qzeros: raw("z", Dtype::I32, zs, leak(z)),
                    scales: raw("s", Dtype::F16, ss, leak(s)),
                })
            })
            .collect();
        let hosts: Vec<Host<'_>> = sources.iter().map(|s| host(s, group).unwrap()).collect();
        for (parts, stacking) in [
            (&hosts[..], Stacking::Interleaved),
            (&hosts[..], Stacking::Sequential),
            (&hosts[..1], Stacking::Sequential),
        ] {
            let at = stacked_rows(parts, stacking);
            let shape = QShape { format: QFormat::AwqInt4, experts: 1, n: at.len(), k, group };
            let want = pack(
                &shape,
                |c, kk| at[c].0.value(at[c].1, kk),
                |g, c| at[c].0.scales[g * at[c].0.n + at[c].1],
                |g, c| at[c].0.zeros[g * at[c].0.n + at[c].1],
            )
            .unwrap();
            let got = pack_matrix(QFormat::AwqInt4, parts, stacking).unwrap();
            assert_eq!((got.words, got.scales, got.zeros), (want.words, want.scales, want.zeros), "{stacking:?}");
        }
    }

    #[test]
    fn block_scales_take_one_scale_per_128_by_128_block_in_cublaslt_layout() {
        // Two stacked parts of 128 and 256 rows, k = 640 (5 blocks, padded to 8 in the layout).
        let a = part(128, 640, |g, _| 1.0 + g as f32);
        let b = part(256, 640, |g, r| 10.0 * (1 + r / 128) as f32 + g as f32);
        let s = block_scales(&[a, b], Stacking::Sequential).expect("uniform blocks");
        let ld = fp8::weight_scale_ld(640);
        assert_eq!((ld, s.len()), (8, 3 * 8));
        assert_eq!(&s[..5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(&s[ld..ld + 2], &[10.0, 11.0]);
        assert_eq!(&s[2 * ld..2 * ld + 2], &[20.0, 21.0]);
        assert_eq!(&s[5..8], &[0.0; 3]);
        // A scale that changes inside a block of rows, or gate/up rows interleaved: no block scales.
        let uneven = part(128, 256, |g, r| (g + r / 64) as f32);
        assert!(block_scales(&[uneven], Stacking::Sequential).is_none());
        let gate = part(128, 256, |_, _| 1.0);
        let up = part(128, 256, |_, _| 2.0);
        assert!(block_scales(&[gate, up], Stacking::Interleaved).is_none());
        // Shapes the GEMM does not take: k not a multiple of 128, n not of 16.
        assert!(block_scales(&[Host { k: 200, ..part(128, 256, |_, _| 1.0) }], Stacking::Sequential).is_none());
        assert!(block_scales(&[part(120, 256, |_, _| 1.0)], Stacking::Sequential).is_none());
    }

    #[test]
    fn paired_scales_hold_one_scale_for_even_and_one_for_odd_rows_per_block() {
        // DeepSeek's 128 x 128 blocks: gate/up interleaved (64 rows of each per 128-row block).
        let blocks = |n| part(n, 256, |g, r| (1 + g + 10 * (r / 128)) as f32);
        assert!(paired_scales(&[blocks(256), blocks(256)], Stacking::Interleaved));
        assert!(paired_scales(&[blocks(384)], Stacking::Sequential));
        // Blocks of 32 rows: gate/up tiles of 128 rows span two gate blocks, down tiles four.
        let rows32 = |n| part(n, 256, |g, r| (1 + g + 10 * (r / 32)) as f32);
        assert!(!paired_scales(&[rows32(256), rows32(256)], Stacking::Interleaved));
        assert!(!paired_scales(&[rows32(256)], Stacking::Sequential));
        // Interleaved parts whose scale blocks end inside a tile's 64 rows of one part.
        let gate = blocks(256);
        let up = part(256, 256, |g, r| (1 + g + 10 * ((r + 32) / 128)) as f32);
        assert!(!paired_scales(&[gate, up], Stacking::Interleaved));
    }
}
