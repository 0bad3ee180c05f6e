//! A rank's slice of a stored linear weight: rows of the output and columns of the input, cut
//! from the memory-mapped tensors into owned buffers (so host memory holds one slice at a time,
//! never the whole tensor converted). Quantized formats are cut along their blocks and groups.

use std::ops::Range;
use std::path::PathBuf;

use safetensors::tensor::Dtype;

use super::{AwqSource, LinearSource, RawTensor};
use crate::error::{EngineError, Result};

/// An owned 2-D sub-block of a stored tensor.
pub struct OwnedTensor {
    name: String,
    path: PathBuf,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl OwnedTensor {
    fn view(&self) -> RawTensor<'_> {
        RawTensor { name: &self.name, path: &self.path, dtype: self.dtype, shape: &self.shape, bytes: &self.bytes }
    }
}

/// A linear weight's slice, owned; [`OwnedLinear::view`] lends it as a [`LinearSource`].
pub enum OwnedLinear {
    Dense { weight: OwnedTensor, scale_inv: Option<(OwnedTensor, [usize; 2])> },
    Awq { qweight: OwnedTensor, qzeros: OwnedTensor, scales: OwnedTensor },
}

impl OwnedLinear {
    pub fn view(&self) -> LinearSource<'_> {
        match self {
            OwnedLinear::Dense { weight, scale_inv } => LinearSource::Dense {
                weight: weight.view(),
                scale_inv: scale_inv.as_ref().map(|(s, b)| (s.view(), *b)),
            },
            OwnedLinear::Awq { qweight, qzeros, scales } => {
                LinearSource::Awq(AwqSource { qweight: qweight.view(), qzeros: qzeros.view(), scales: scales.view() })
            }
        }
    }
}

/// Rows `rows` and columns `cols` of a 2-D tensor.
fn cut(t: &RawTensor<'_>, rows: Range<usize>, cols: Range<usize>) -> Result<OwnedTensor> {
    let (r, c) = (t.shape[0], t.shape[1]);
    if rows.end > r || cols.end > c || t.numel() == 0 {
        return Err(EngineError::checkpoint(
            t.path,
            format!("tensor `{}` of shape {:?} has no rows {rows:?}, columns {cols:?}", t.name, t.shape),
        ));
    }
    let elem = t.bytes.len() / t.numel();
    let mut bytes = Vec::with_capacity(rows.len() * cols.len() * elem);
    for row in rows.clone() {
        let start = (row * c + cols.start) * elem;
        bytes.extend_from_slice(&t.bytes[start..start + cols.len() * elem]);
    }
    Ok(OwnedTensor {
        name: t.name.to_string(),
        path: t.path.to_path_buf(),
        dtype: t.dtype,
        shape: vec![rows.len(), cols.len()],
        bytes,
    })
}

/// `range / unit`, failing unless both ends are multiples of `unit` (or the end is `full`).
fn in_units(t: &RawTensor<'_>, range: &Range<usize>, full: usize, unit: usize, what: &str) -> Result<Range<usize>> {
    let aligned = |x: usize| x.is_multiple_of(unit) || x == full;
    if !aligned(range.start) || !aligned(range.end) {
        return Err(EngineError::checkpoint(
            t.path,
            format!(
                "tensor `{}`: this rank's slice {range:?} of {full} does not fall on the {unit}-wide {what}; \
                 choose a tensor_parallel_size / data_parallel_size that splits it on them",
                t.name
            ),
        ));
    }
    Ok(range.start / unit..range.end.div_ceil(unit))
}

impl LinearSource<'_> {
    /// The units (output rows, input columns) [`LinearSource::shard`] can cut this weight on:
    /// FP8 scale blocks, AWQ packed words and groups, single values of plain weights.
    pub fn cut_units(&self) -> (usize, usize) {
        match self {
            LinearSource::Dense { scale_inv: Some((_, [b0, b1])), .. } => (*b0, *b1),
            LinearSource::Dense { scale_inv: None, .. } => (1, 1),
            LinearSource::Awq(a) => (8, a.group()),
        }
    }

    /// Output features `out` and input features `inp` of this `[out, in]` weight, in its stored
    /// format.
    pub fn shard(&self, out: Range<usize>, inp: Range<usize>) -> Result<OwnedLinear> {
        let (o, i) = self.dims();
        match self {
            LinearSource::Dense { weight, scale_inv } => {
                let (b0, b1) = self.cut_units();
                let scale_inv = match scale_inv {
                    Some((s, block)) => {
                        let rows = in_units(weight, &out, o, b0, "FP8 scale blocks")?;
                        let cols = in_units(weight, &inp, i, b1, "FP8 scale blocks")?;
                        Some((cut(s, rows, cols)?, *block))
                    }
                    None => None,
                };
                Ok(OwnedLinear::Dense { weight: cut(weight, out, inp)?, scale_inv })
            }
            LinearSource::Awq(a) => {
                let (word, group) = self.cut_units();
                let words = in_units(&a.qweight, &out, o, word, "AWQ packed words")?;
                let groups = in_units(&a.qweight, &inp, i, group, "AWQ groups")?;
                Ok(OwnedLinear::Awq {
                    qweight: cut(&a.qweight, inp, words.clone())?,
                    qzeros: cut(&a.qzeros, groups.clone(), words)?,
                    scales: cut(&a.scales, groups, out)?,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::weights::pack_int4;

    fn raw<'a>(name: &'a str, dtype: Dtype, shape: &'a [usize], bytes: &'a [u8]) -> RawTensor<'a> {
        RawTensor { name, path: Path::new("t.safetensors"), dtype, shape, bytes }
    }

    fn sub(full: &[f32], cols: usize, rows: Range<usize>, c: Range<usize>) -> Vec<f32> {
        rows.flat_map(|r| full[r * cols + c.start..r * cols + c.end].to_vec()).collect()
    }

    #[test]
    fn dense_and_fp8_slices_dequantize_to_the_same_values() {
        let (o, i) = (8, 6);
        let w: Vec<u8> = (0..o * i).map(|x| (x * 7 % 120) as u8).collect();
        let s: Vec<u8> = [0.5f32, 2.0, 1.5, 4.0, 0.25, 3.0, 1.25, 0.75].iter().flat_map(|v| v.to_le_bytes()).collect();
        let (ws, ss) = ([o, i], [4, 2]);
        let src = LinearSource::Dense {
            weight: raw("w", Dtype::F8_E4M3, &ws, &w),
            scale_inv: Some((raw("s", Dtype::F32, &ss, &s), [2, 3])),
        };
        let full = src.to_f32().unwrap();
        let part = src.shard(2..6, 3..6).unwrap();
        assert_eq!(part.view().to_f32().unwrap(), sub(&full, i, 2..6, 3..6));
        let err = src.shard(1..5, 0..6).err().unwrap().to_string();
        assert!(err.contains("FP8 scale blocks"), "{err}");
    }

    #[test]
    fn awq_slices_dequantize_to_the_same_values() {
        let (inp, out, g) = (8, 16, 4);
        let q: Vec<u8> = (0..inp * out).map(|x| (x * 5 % 16) as u8).collect();
        let z: Vec<u8> = (0..inp / g * out).map(|x| (x * 3 % 16) as u8).collect();
        let bytes = |v: Vec<u32>| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let (qb, zb) = (bytes(pack_int4(&q)), bytes(pack_int4(&z)));
        let sb: Vec<u8> =
            (0..inp / g * out).flat_map(|x| half::f16::from_f32(0.5 + x as f32 / 8.0).to_le_bytes()).collect();
        let (qs, zs, ss) = ([inp, out / 8], [inp / g, out / 8], [inp / g, out]);
        let src = LinearSource::Awq(AwqSource {
            qweight: raw("q", Dtype::I32, &qs, &qb),
            qzeros: raw("z", Dtype::I32, &zs, &zb),
            scales: raw("s", Dtype::F16, &ss, &sb),
        });
        let full = src.to_f32().unwrap();
        for (o, i) in [(8..16, 0..8), (0..16, 4..8), (0..8, 0..4)] {
            let part = src.shard(o.clone(), i.clone()).unwrap();
            assert_eq!(part.view().dims(), (o.len(), i.len()));
            assert_eq!(part.view().to_f32().unwrap(), sub(&full, inp, o, i));
        }
        assert!(src.shard(4..12, 0..8).is_err());
        assert!(src.shard(0..16, 2..6).is_err());
    }
}
