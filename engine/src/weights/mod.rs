//! Memory-mapped safetensors checkpoints in the Hugging Face layout: one `model.safetensors` or
//! shards listed by `model.safetensors.index.json`, or random weights of the same names made on
//! demand ([`LoadFormat::Dummy`]). Tensors are read lazily by name; every error names the file
//! and the tensor.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cleave_kernels::fp8::e4m3_to_f32;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;

use crate::error::{EngineError, Result};
use crate::model::Quantization;

pub mod random;
mod shard;
mod source;

pub use shard::OwnedLinear;
pub use source::{LoadFormat, Weights, DUMMY_SEED};

use random::TensorSpec;

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    meta: Metadata,
}

/// Where a [`Checkpoint`]'s tensors live.
enum Store {
    Files {
        shards: Vec<Shard>,
        by_name: HashMap<String, usize>,
    },
    /// Made on first read, kept until the checkpoint is dropped; `path` names them in messages.
    Random {
        path: PathBuf,
        seed: u64,
        tensors: HashMap<String, (TensorSpec, OnceLock<Vec<u8>>)>,
    },
}

/// An opened checkpoint directory, or a set of random tensors.
pub struct Checkpoint {
    dir: PathBuf,
    store: Store,
    read: Mutex<HashSet<String>>,
}

/// A tensor as stored: dtype, shape and little-endian bytes borrowed from the mapping.
#[derive(Clone, Copy)]
pub struct RawTensor<'a> {
    pub name: &'a str,
    pub path: &'a Path,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// A linear layer's weight `[out, in]` as stored: plain (bf16/f16/f32), FP8 with block scales,
/// or AWQ int4.
#[derive(Clone, Copy)]
pub enum LinearSource<'a> {
    /// `weight` `[out, in]`, with `weight_scale_inv` `[ceil(out/b0), ceil(in/b1)]` and the block
    /// size `[b0, b1]` when it is float8.
    Dense {
        weight: RawTensor<'a>,
        scale_inv: Option<(RawTensor<'a>, [usize; 2])>,
    },
    Awq(AwqSource<'a>),
}

/// How a linear layer's stored values share their scales ([`LinearSource::grouping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Floats, no scales.
    Plain,
    /// FP8 with a scale per `[rows, columns]` block.
    Fp8Blocks([usize; 2]),
    /// AWQ int4 with a scale and zero point per this many input channels.
    AwqGroups(usize),
}

/// An AutoAWQ "gemm" linear layer (REFERENCE.md section 4): `qweight` i32 `[in, out/8]`,
/// `qzeros` i32 `[in/group, out/8]`, `scales` f16 `[in/group, out]`; nibble `i` of a packed
/// word holds column `8 * word + AWQ_ORDER[i]`, and `W[n, k] = (q[k, n] - z[k/g, n]) * s[k/g, n]`.
#[derive(Clone, Copy)]
pub struct AwqSource<'a> {
    pub qweight: RawTensor<'a>,
    pub qzeros: RawTensor<'a>,
    pub scales: RawTensor<'a>,
}

/// Column offset (within a group of 8) held by nibble `i` of an AWQ packed word.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Bit offset of output `n`'s nibble in its AWQ packed word.
pub const fn awq_shift(n: usize) -> usize {
    const SLOT: [usize; 8] = {
        let mut s = [0; 8];
        let mut i = 0;
        while i < 8 {
            s[AWQ_ORDER[i]] = i;
            i += 1;
        }
        s
    };
    4 * SLOT[n % 8]
}

impl Checkpoint {
    /// Opens `dir`, mapping every shard and indexing tensor names.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            shard_files(&index_path)?.into_iter().map(|f| dir.join(f)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if single.exists() {
                vec![single]
            } else {
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .map_err(|e| EngineError::io(dir, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect();
                found.sort();
                if found.is_empty() {
                    return Err(EngineError::checkpoint(
                        dir,
                        "no model.safetensors, model.safetensors.index.json or *.safetensors file (load_format dummy makes random weights of config.json's shapes instead)",
                    ));
                }
                found
            }
        };
        let mut shards = Vec::with_capacity(files.len());
        let mut by_name = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| EngineError::io(&path, e))?;
            // SAFETY: the mapping is read-only; checkpoints are not modified while being served.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::io(&path, e))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| EngineError::checkpoint(&path, format!("not a valid safetensors file: {e}")))?;
            for name in meta.tensors().keys() {
                by_name.insert(name.clone(), shards.len());
            }
            shards.push(Shard { path, mmap, data_start: 8 + header_len, meta });
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), store: Store::Files { shards, by_name }, read: Mutex::default() })
    }

    /// The tensors `specs` of the model in `dir`, random ([`random`]), each made when first read.
    pub fn random(dir: &Path, specs: Vec<TensorSpec>, seed: u64) -> Self {
        let tensors = specs.into_iter().map(|s| (s.name.clone(), (s, OnceLock::new()))).collect();
        let path = dir.join("<random weights>");
        Checkpoint { dir: dir.to_path_buf(), store: Store::Random { path, seed, tensors }, read: Mutex::default() }
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        match &self.store {
            Store::Files { by_name, .. } => by_name.contains_key(name),
            Store::Random { tensors, .. } => tensors.contains_key(name),
        }
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = match &self.store {
            Store::Files { by_name, .. } => by_name.keys().map(String::as_str).collect(),
            Store::Random { tensors, .. } => tensors.keys().map(String::as_str).collect(),
        };
        v.sort_unstable();
        v
    }

    /// Names of tensors never read so far, sorted.
    pub fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        self.names().into_iter().filter(|k| !read.contains(*k)).map(str::to_string).collect()
    }

    /// The stored tensor `name`.
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let missing = || EngineError::MissingTensor { dir: self.dir.clone(), name: name.to_string() };
        let t = match &self.store {
            Store::Files { shards, by_name } => {
                let (key, &i) = by_name.get_key_value(name).ok_or_else(missing)?;
                let shard = &shards[i];
                let info: &TensorInfo = shard.meta.info(name).expect("indexed tensor has info");
                let (a, b) = info.data_offsets;
                let bytes = shard.mmap.get(shard.data_start + a..shard.data_start + b).ok_or_else(|| {
                    EngineError::checkpoint(&shard.path, format!("tensor `{name}` lies outside the file"))
                })?;
                RawTensor { name: key, path: &shard.path, dtype: info.dtype, shape: &info.shape, bytes }
            }
            Store::Random { path, seed, tensors } => {
                let (key, (spec, bytes)) = tensors.get_key_value(name).ok_or_else(missing)?;
                let bytes = bytes.get_or_init(|| spec.generate(*seed));
                RawTensor { name: key, path, dtype: spec.kind.dtype().0, shape: &spec.shape, bytes }
            }
        };
        self.read.lock().unwrap_or_else(|p| p.into_inner()).insert(t.name.to_string());
        Ok(t)
    }

    /// The stored tensor `name`, checked to have `shape`.
    pub fn raw_shaped(&self, name: &str, shape: &[usize]) -> Result<RawTensor<'_>> {
        let t = self.raw(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// `name` converted to f32 after checking its shape.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.raw_shaped(name, shape)?.to_f32()
    }

    /// The linear layer `prefix` of shape `[out, inp]` in whatever format it is stored:
    /// `<prefix>.qweight` (+ `qzeros`, `scales`) for AWQ, else `<prefix>.weight` (+
    /// `weight_scale_inv` when float8). Shapes and dtypes are checked against `quant`.
    pub fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        quant: Option<&Quantization>,
    ) -> Result<LinearSource<'_>> {
        let qname = format!("{prefix}.qweight");
        if self.contains(&qname) {
            return self.awq_linear(prefix, out, inp, quant).map(LinearSource::Awq);
        }
        let weight = self.raw_shaped(&format!("{prefix}.weight"), &[out, inp])?;
        let scale_inv = if weight.dtype == Dtype::F8_E4M3 {
            let block = match quant {
                Some(Quantization::Fp8 { block }) => *block,
                _ => [128, 128],
            };
            let sname = format!("{prefix}.weight_scale_inv");
            let s = self.raw_shaped(&sname, &[out.div_ceil(block[0]), inp.div_ceil(block[1])])?;
            s.expect_dtype(&[Dtype::F32, Dtype::BF16, Dtype::F16])?;
            Some((s, block))
        } else {
            None
        };
        Ok(LinearSource::Dense { weight, scale_inv })
    }

    fn awq_linear(&self, prefix: &str, out: usize, inp: usize, quant: Option<&Quantization>) -> Result<AwqSource<'_>> {
        let qweight = self.raw(&format!("{prefix}.qweight"))?;
        let bad = |msg: String| Err(EngineError::checkpoint(qweight.path, format!("tensor `{}`: {msg}", qweight.name)));
        let Some(Quantization::Awq(cfg)) = quant else {
            return bad("is AWQ-packed but config.json declares no `quantization_config` with quant_method awq".into());
        };
        if cfg.skips(prefix) {
            return bad(format!(
                "is AWQ-packed but `{prefix}` is listed in `quantization_config.modules_to_not_convert`"
            ));
        }
        let group = cfg.group_size;
        if !out.is_multiple_of(8) {
            return bad(format!("{out} output features are not a multiple of 8 (AWQ packs 8 per int32)"));
        }
        if !inp.is_multiple_of(group) {
            return bad(format!("`quantization_config.group_size` {group} does not divide the {inp} input features"));
        }
        qweight.expect_shape(&[inp, out / 8])?;
        qweight.expect_dtype(&[Dtype::I32, Dtype::U32])?;
        let qzeros = self.raw_shaped(&format!("{prefix}.qzeros"), &[inp / group, out / 8])?;
        qzeros.expect_dtype(&[Dtype::I32, Dtype::U32])?;
        let scales = self.raw_shaped(&format!("{prefix}.scales"), &[inp / group, out])?;
        scales.expect_dtype(&[Dtype::F16, Dtype::BF16, Dtype::F32])?;
        Ok(AwqSource { qweight, qzeros, scales })
    }
}

fn shard_files(index_path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index_path).map_err(|e| EngineError::io(index_path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| EngineError::checkpoint(index_path, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| EngineError::checkpoint(index_path, "missing object `weight_map`"))?;
    let mut files: Vec<String> = Vec::new();
    for (name, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| EngineError::checkpoint(index_path, format!("`weight_map.{name}` is not a file name")))?;
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    files.sort();
    Ok(files)
}

impl RawTensor<'_> {
    /// Fails with a message naming the file and tensor unless the shape is `shape`.
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape != shape {
            return Err(EngineError::TensorShape {
                path: self.path.to_path_buf(),
                name: self.name.to_string(),
                expected: shape.to_vec(),
                actual: self.shape.to_vec(),
            });
        }
        Ok(())
    }

    /// Fails with a message naming the file and tensor unless the dtype is one of `allowed`.
    pub fn expect_dtype(&self, allowed: &[Dtype]) -> Result<()> {
        if !allowed.contains(&self.dtype) {
            return Err(EngineError::TensorDtype {
                path: self.path.to_path_buf(),
                name: self.name.to_string(),
                dtype: format!("{:?} (expected one of {allowed:?})", self.dtype),
            });
        }
        Ok(())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts F32 / BF16 / F16 / F8_E4M3 to f32 (FP8 without scales: the raw values).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes;
        let v: Vec<f32> = match self.dtype {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => {
                b.chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            Dtype::F16 => {
                b.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            Dtype::F8_E4M3 => b.iter().map(|&x| e4m3_to_f32(x)).collect(),
            other => {
                return Err(EngineError::TensorDtype {
                    path: self.path.to_path_buf(),
                    name: self.name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        if v.len() != self.numel() {
            return Err(EngineError::checkpoint(
                self.path,
                format!(
                    "tensor `{}` holds {} values, its shape {:?} needs {}",
                    self.name,
                    v.len(),
                    self.shape,
                    self.numel()
                ),
            ));
        }
        Ok(v)
    }
}

impl<'a> LinearSource<'a> {
    /// `[out, in]` row-major f32, exactly: FP8 blockwise `W[i,j] = q[i,j] * s[i/b0, j/b1]`, AWQ
    /// `W[n,k] = (q - z) * s`.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self {
            LinearSource::Dense { weight, scale_inv } => {
                let mut w = weight.to_f32()?;
                if let Some((s, [b0, b1])) = scale_inv {
                    let s = s.to_f32()?;
                    let (out, inp) = (weight.shape[0], weight.shape[1]);
                    let sc = inp.div_ceil(*b1);
                    for i in 0..out {
                        let srow = &s[(i / b0) * sc..(i / b0 + 1) * sc];
                        for (j, x) in w[i * inp..(i + 1) * inp].iter_mut().enumerate() {
                            *x *= srow[j / b1];
                        }
                    }
                }
                Ok(w)
            }
            LinearSource::Awq(a) => a.to_f32(),
        }
    }

    /// `[out, in]` of the weight.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            LinearSource::Dense { weight, .. } => (weight.shape[0], weight.shape[1]),
            LinearSource::Awq(a) => (a.out(), a.inp()),
        }
    }

    /// How the stored values are grouped under their scales: weights stack into one matrix of
    /// a compressed format only when this is equal.
    pub fn grouping(&self) -> Grouping {
        match self {
            LinearSource::Dense { scale_inv: Some((_, block)), .. } => Grouping::Fp8Blocks(*block),
            LinearSource::Dense { scale_inv: None, .. } => Grouping::Plain,
            LinearSource::Awq(a) => Grouping::AwqGroups(a.group()),
        }
    }

    /// The stored tensor holding the weight values (`weight` or `qweight`), for messages.
    pub fn main(&self) -> &RawTensor<'a> {
        match self {
            LinearSource::Dense { weight, .. } => weight,
            LinearSource::Awq(a) => &a.qweight,
        }
    }
}

impl AwqSource<'_> {
    /// Output features (`qweight` is `[in, out/8]`).
    pub fn out(&self) -> usize {
        self.qweight.shape[1] * 8
    }

    /// Input features.
    pub fn inp(&self) -> usize {
        self.qweight.shape[0]
    }

    /// Input channels per scale and zero point (`scales` is `[in/group, out]`).
    pub fn group(&self) -> usize {
        self.inp() / self.scales.shape[0].max(1)
    }

    /// The 4-bit values `[in, out]` (0..16) and the zero points `[in/group, out]`, unpacked.
    pub fn unpack(&self) -> (Vec<u8>, Vec<u8>) {
        (unpack_int4(self.qweight.bytes, self.out()), self.unpack_zeros())
    }

    /// The zero points `[in/group, out]`, unpacked.
    pub fn unpack_zeros(&self) -> Vec<u8> {
        unpack_int4(self.qzeros.bytes, self.out())
    }

    /// The packed word holding input channel `k`'s outputs `8 (n / 8)..8 (n / 8) + 8` (output
    /// `n` at bit [`awq_shift`]`(n)`).
    pub fn word(&self, k: usize, n: usize) -> u32 {
        let at = (k * (self.out() / 8) + n / 8) * 4;
        let b = &self.qweight.bytes[at..at + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The 4-bit value of input channel `k`, output `n` (0..16), read from its packed word.
    pub fn nibble(&self, k: usize, n: usize) -> u8 {
        ((self.word(k, n) >> awq_shift(n)) & 0xf) as u8
    }

    /// `[out, in]` row-major f32: `W[n, k] = (q[k, n] - z[k/g, n]) * s[k/g, n]`.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let (q, z) = self.unpack();
        let s = self.scales.to_f32()?;
        let (out, inp, g) = (self.out(), self.inp(), self.group());
        let mut w = vec![0f32; out * inp];
        for k in 0..inp {
            let (qr, gr) = (&q[k * out..(k + 1) * out], (k / g) * out);
            for n in 0..out {
                w[n * inp + k] = (qr[n] as f32 - z[gr + n] as f32) * s[gr + n];
            }
        }
        Ok(w)
    }
}

/// Unpacks AWQ int32 words (little-endian) of rows `cols / 8` wide into `[rows, cols]` nibbles.
fn unpack_int4(bytes: &[u8], cols: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes.len() * 2];
    for (w, c) in bytes.chunks_exact(4).enumerate() {
        let word = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let (row, base) = (w / (cols / 8), (w % (cols / 8)) * 8);
        for (i, &o) in AWQ_ORDER.iter().enumerate() {
            v[row * cols + base + o] = ((word >> (4 * i)) & 0xf) as u8;
        }
    }
    v
}

/// Packs `[rows, cols]` nibbles (0..16, `cols % 8 == 0`) into AWQ int32 words `[rows, cols / 8]`
/// (tests, tools).
pub fn pack_int4(values: &[u8]) -> Vec<u32> {
    values
        .chunks_exact(8)
        .map(|chunk| AWQ_ORDER.iter().enumerate().fold(0u32, |acc, (i, &o)| acc | ((chunk[o] as u32 & 0xf) << (4 * i))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awq_packing_round_trips_in_autoawq_order() {
        // Column c of a row holds c % 16: word 0 must read 0x75316420 (nibble i = column ORDER[i]).
        let v: Vec<u8> = (0..32).map(|c| (c % 16) as u8).collect();
        let words = pack_int4(&v);
        assert_eq!(words[0], 0x7531_6420);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(unpack_int4(&bytes, 16), v);
        // One nibble at a time reads what the whole unpack reads: [in 2, out 16].
        let raw = |shape: &'static [usize], bytes: &'static [u8]| RawTensor {
            name: "t",
            path: Path::new("t"),
            dtype: Dtype::I32,
            shape,
            bytes,
        };
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let a =
            AwqSource { qweight: raw(&[2, 2], bytes), qzeros: raw(&[1, 2], &bytes[..8]), scales: raw(&[1, 16], &[]) };
        let (q, _) = a.unpack();
        assert!((0..2).all(|k| (0..16).all(|n| a.nibble(k, n) == q[k * 16 + n])));
    }
}
