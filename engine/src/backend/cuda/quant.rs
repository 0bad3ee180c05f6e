//! Checkpoint weights kept compressed on the GPU (AWQ int4, FP8 e4m3 with block scales): their
//! upload (packed by [`super::repack`]) and the GEMMs over them.

use cleave_kernels::blaslt::{Fp8BlockGemm, LT_WORKSPACE_BYTES};
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::fp8::{self, BLOCK};
use cleave_kernels::ops::{Fp8Order, QCut, QGemm, QPersist, QWeights};
use cleave_kernels::quant::{QFormat, QPacked, QShape};
use cleave_kernels::{ptr, KernelError};
use rayon::prelude::*;

use super::repack::{block_scales, host, pack_matrix, paired_scales, plan, Stacking};
use super::{kerr, CudaBackend, CudaTensor, CudaWeight, Precision, QRows, WeightData, QGEMM_MAX_ROWS};
use crate::backend::{check_split, Backend};
use crate::error::{EngineError, Result};
use crate::weights::LinearSource;

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
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { gpu.htod(&b, ptr(&dev)) }.map_err(kerr)?;
                gpu.sync().map_err(kerr)?;
                blocks = Some(Box::new(dev));
            }
            let stack = QWeights { shape, words: ptr(&words), scales: ptr(&scales), zeros: ptr(&zeros) };
            let dst = stack.matrices(c * 16 + i, 1).expect("a matrix of the stack");
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { gpu.htod(&p.words, dst.words) }.map_err(kerr)?;
            // SAFETY: the destination is a live allocation of this GPU holding as many values as the
            // source.
            unsafe { gpu.htod(&p.scales, dst.scales) }.map_err(kerr)?;
            if !p.zeros.is_empty() {
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { gpu.htod(&p.zeros, dst.zeros) }.map_err(kerr)?;
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
            // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
            // GPU.
            unsafe { self.gpu.qdequant(&q, ptr(&wb)) }.map_err(kerr)?;
            // SAFETY: input, weight and output are live buffers of this GPU of the GEMM's sizes.
            return unsafe { self.gpu.linear_bf16(xb.ptr(), ptr(&wb), y.ptr(), rows, n, q.shape.k) }.map_err(kerr);
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
                // SAFETY: the split partials and the outputs are live buffers of this GPU of these rows and
                // columns.
                unsafe { self.gpu.qgemm_reduce(y.ptr(), a.ptr(), 1, rows, n, Some(cut)) }.map_err(kerr)?;
            }
        }
        Ok((a, b))
    }

    /// The persistent shape a decode GEMM of `rows` over `w` runs (`None`: the tiled kernel): the
    /// variants' choice, for FP8 only where its activations go to FP8 tensor cores in whole
    /// 128-channel blocks.
    pub(super) fn qgemm_shape(&self, w: &QuantWeight, rows: QRows) -> Option<QPersist> {
        let (s, v) = (w.shape, self.variants());
        v.qgemm.shape(s.format, s.group, rows, self.gpu.has_wgmma()).filter(|_| match s.format {
            QFormat::AwqInt4 => true,
            QFormat::Fp8E4m3 => v.fp8_tensor_cores && s.k.is_multiple_of(BLOCK),
        })
    }

    /// A decode-sized GEMM over `w` (`g.x` is set here from `x`): the persistent kernel when the
    /// variants give a shape for the weight's format and grouping (FP8 on FP8 tensor cores, the
    /// activations quantized first, unless `CLEAVE_FP8_GEMM=bf16`), else the tiled kernels; a
    /// dense GEMM (`g.tiles == 0`) split over the input channels until the GPU is full, its
    /// result cut in two by `cut` (by the persistent kernel itself at one split, else in the
    /// split-K reduction). AWQ expert tiles on the persistent kernel run stream-K
    /// (`Variants::qgemm_streamk`); `g.streamk` is set here.
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
                // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
                // for these rows and channels.
                unsafe { self.gpu.act_quant_fp8_mma(Fp8Order::Mma, src, is_bf16, rows, k, ptr(&x8), ptr(&xs)) }
                    .map_err(kerr)?;
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
        // Stream-K where it measured faster (runs 111-117, NOTES): AWQ expert tiles, whose rows
        // moe_align places in a fixed order, so that each row's summation order is fixed too.
        // Dense GEMMs keep split-K, FP8 whole items.
        let streamk =
            persistent.is_some() && self.variants().qgemm_streamk && format == QFormat::AwqInt4 && g.tiles != 0;
        let splits = match (g.tiles, persistent) {
            _ if streamk => 1,
            (0, Some(cfg)) => self.gpu.qgp_splits(&q, g.rows, cfg).map_err(kerr)?,
            (0, None) => self.gpu.qgemm_splits(&q, g.rows, g.bm),
            _ => 1,
        };
        // A persistent GEMM of one split cuts its result as it stores it; otherwise the reduction does.
        let kernel_cut = if persistent.is_some() && splits == 1 { cut } else { None };
        let part = if splits > 1 || (cut.is_some() && kernel_cut.is_none()) {
            Some(self.alloc_f32(splits * g.rows * n)?)
        } else {
            None
        };
        let run = QGemm { y: part.as_ref().map_or(g.y, |p| ptr(p)), splits, streamk, ..g };
        match persistent {
            // SAFETY: the weights, the input rows (and FP8 scales), the tile lists and the outputs named
            // in the launch are live buffers of this GPU sized for these rows and this weight.
            Some(cfg) => unsafe { self.gpu.qgemm_persistent(&q, &run, cfg, kernel_cut) },
            // SAFETY: the weights, the input rows, the tile lists and the outputs named in the launch are
            // live buffers of this GPU sized for these rows and this weight.
            None => unsafe { self.gpu.qgemm(&q, &run) },
        }
        .map_err(kerr)?;
        if let Some(p) = part {
            // SAFETY: the split partials and the outputs are live buffers of this GPU of these rows and
            // columns.
            unsafe { self.gpu.qgemm_reduce(ptr(&p), g.y, splits, g.rows, n, cut) }.map_err(kerr)?;
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
        // SAFETY: the FP8 weight and the output of all its bytes are live buffers of this GPU.
        unsafe { self.gpu.qbytes_fp8(q, ptr(&w8)) }.map_err(kerr)?;
        let x8 = self.buf::<u32>(rows_p * k / 4)?;
        let xs = self.buf::<f32>(k / BLOCK * rows_p)?;
        // SAFETY: the activations and the (padded) e4m3 and scale outputs are live buffers of this GPU
        // sized for these rows and channels.
        unsafe { self.gpu.act_quant_fp8(x.ptr(), rows, k, ptr(&x8), ptr(&xs)) }.map_err(kerr)?;
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
            // SAFETY: the FP8 operands, their block scales and the output are live buffers of this GPU of
            // the GEMM's sizes.
            match unsafe { self.gpu.gemm_fp8_block(&g) } {
                Ok(()) => {}
                Err(KernelError::Unsupported(why)) => {
                    tracing::debug!(%why, "block-scaled FP8 GEMM: output type not supported");
                    continue;
                }
                Err(e) => return Err(kerr(e)),
            }
            if let Some(t) = &tmp_f32 {
                // SAFETY: source and destination are distinct live allocations of this GPU of at least the
                // bytes copied.
                unsafe { self.gpu.dtod(y.ptr(), ptr(t), rows * n * 4) }.map_err(kerr)?;
            }
            if let Some(t) = &tmp_bf16 {
                // SAFETY: source and destination are live buffers of this GPU of n values.
                unsafe { self.gpu.cast_bf16_f32(ptr(t), y.ptr(), rows * n) }.map_err(kerr)?;
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
