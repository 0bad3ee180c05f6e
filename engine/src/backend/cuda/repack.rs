//! Checkpoint weights repacked on the host into the compressed layout the GPU kernels read: which
//! sources stay compressed (`plan`), how parts stack into one matrix, and the packing itself.
//! AWQ words are read where they are stored, each once; FP8 bytes are borrowed.

use cleave_kernels::fp8::{self, BLOCK};
use cleave_kernels::quant::{awq_slot, pack, pack_awq, QFormat, QPacked, QShape};
use safetensors::tensor::Dtype;

use crate::error::Result;
use crate::weights::{awq_shift, AwqSource, LinearSource};

/// How a matrix is stacked from its parts: one after another along the output dimension, or
/// row-interleaved (row `2j + p` is row `j` of part `p`: the experts' gate/up layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stacking {
    Sequential,
    Interleaved,
}

/// The compressed format and group size `src` keeps on the GPU, if the kernels take it.
pub(super) fn plan(src: &LinearSource<'_>) -> Option<(QFormat, usize)> {
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
pub(super) struct Host<'a> {
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

pub(super) fn host<'a>(src: &LinearSource<'a>, group: usize) -> Result<Host<'a>> {
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
pub(super) fn pack_matrix(format: QFormat, parts: &[Host], stacking: Stacking) -> Option<QPacked> {
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
pub(super) fn block_scales(parts: &[Host], stacking: Stacking) -> Option<Vec<f32>> {
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
pub(super) fn paired_scales(parts: &[Host], stacking: Stacking) -> bool {
    let at = stacked_rows(parts, stacking);
    let groups = parts[0].k.div_ceil(parts[0].group);
    at.chunks(BLOCK).all(|rows| {
        (0..groups).all(|g| {
            let scale = |&(p, r): &(&Host, usize)| p.scales[g * p.n + r];
            rows.iter().enumerate().all(|(i, row)| scale(row) == scale(&rows[i % 2]))
        })
    })
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
