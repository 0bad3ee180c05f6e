//! The reference backend: f32 on the CPU, multithreaded with rayon. Weights in any stored format
//! are dequantized to f32 at load.

mod attention;
mod matmul;
mod moe;

use rayon::prelude::*;

use super::{
    check_split, AttnBatch, Backend, ExpertSource, KvLayout, MlaDims, NoGraph, RouterParams, SampleRow, NO_SLOT,
};
use crate::error::{EngineError, Result};
use crate::weights::LinearSource;

pub use matmul::{dot, matmul_t};
pub use moe::{route_token, CpuExperts, CpuRouting};

/// A row-major f32 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "tensor data does not match its shape");
        CpuTensor { rows, cols, data }
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

/// A dequantized linear weight `[out, in]`.
#[derive(Debug, Clone)]
pub struct CpuWeight {
    pub out: usize,
    pub inp: usize,
    pub data: Vec<f32>,
}

impl CpuWeight {
    fn apply(&self, x: &CpuTensor) -> Result<CpuTensor> {
        if x.cols != self.inp {
            return Err(EngineError::Backend(format!(
                "linear: input has {} columns, weight expects {}",
                x.cols, self.inp
            )));
        }
        Ok(CpuTensor::new(matmul_t(&x.data, x.rows, x.cols, &self.data, self.out), x.rows, self.out))
    }
}

/// The latent cache: one f32 buffer per layer, `[num_blocks * block_size, width]`.
pub struct CpuKvCache {
    pub layout: KvLayout,
    pub layers: Vec<Vec<f32>>,
}

/// The CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

fn rms_norm_row(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    let ms = x[..n].iter().map(|v| v * v).sum::<f32>() / n as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for (v, g) in x[..n].iter_mut().zip(w) {
        *v = *v * r * g;
    }
}

fn check_same(a: &CpuTensor, b: &CpuTensor, op: &str) -> Result<()> {
    if (a.rows, a.cols) != (b.rows, b.cols) {
        return Err(EngineError::Backend(format!(
            "{op}: shapes {}x{} and {}x{} differ",
            a.rows, a.cols, b.rows, b.cols
        )));
    }
    Ok(())
}

/// Loads and stacks linear parts along the output dimension, dequantized to f32.
pub fn load_stacked(parts: &[LinearSource<'_>]) -> Result<CpuWeight> {
    let inp = parts.first().map(|p| p.dims().1).unwrap_or(0);
    let mut data = Vec::new();
    let mut out = 0;
    for p in parts {
        let (o, i) = p.dims();
        if i != inp {
            return Err(EngineError::Backend(format!("stacked linear parts have input sizes {inp} and {i}")));
        }
        data.extend(p.to_f32()?);
        out += o;
    }
    Ok(CpuWeight { out, inp, data })
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Experts = CpuExperts;
    type Routing = CpuRouting;
    type KvCache = CpuKvCache;
    type Graph = NoGraph;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        if data.len() != rows * cols {
            return Err(EngineError::Backend(format!("upload: {} values for shape {rows}x{cols}", data.len())));
        }
        Ok(CpuTensor::new(data.to_vec(), rows, cols))
    }

    fn download(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn load_linear(&self, parts: &[LinearSource<'_>]) -> Result<CpuWeight> {
        load_stacked(parts)
    }

    fn load_experts(&self, experts: &[ExpertSource<'_>], first: usize, _shared: usize) -> Result<CpuExperts> {
        // Shared experts folded in are experts like the others here; routing lists them.
        CpuExperts::load(experts, first)
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<CpuKvCache> {
        let per_layer = layout.num_blocks * layout.block_size * layout.width;
        Ok(CpuKvCache { layout, layers: (0..layout.layers).map(|_| vec![0f32; per_layer]).collect() })
    }

    fn embedding(&self, table: &CpuTensor, ids: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(ids.len() * table.cols);
        for &id in ids {
            if id as usize >= table.rows {
                return Err(EngineError::InvalidRequest(format!(
                    "token id {id} is outside the vocabulary of {}",
                    table.rows
                )));
            }
            data.extend_from_slice(table.row(id as usize));
        }
        Ok(CpuTensor::new(data, ids.len(), table.cols))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        let mut y = x.clone();
        y.data.par_chunks_mut(x.cols).for_each(|r| rms_norm_row(r, &w.data, eps));
        Ok(y)
    }

    fn add_rms_norm(&self, residual: &mut CpuTensor, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        self.add_assign(residual, x)?;
        self.rms_norm(residual, w, eps)
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
        w.apply(x)
    }

    fn linear_split(&self, x: &CpuTensor, w: &CpuWeight, first: usize) -> Result<(CpuTensor, CpuTensor)> {
        check_split(first, w.out, x.cols, w.inp)?;
        let y = w.apply(x)?;
        let (mut a, mut b) = (Vec::with_capacity(x.rows * first), Vec::with_capacity(x.rows * (w.out - first)));
        for r in 0..y.rows {
            let (ya, yb) = y.row(r).split_at(first);
            a.extend_from_slice(ya);
            b.extend_from_slice(yb);
        }
        Ok((CpuTensor::new(a, y.rows, first), CpuTensor::new(b, y.rows, w.out - first)))
    }

    fn silu_mul(&self, x: &CpuTensor) -> Result<CpuTensor> {
        let h = x.cols / 2;
        let mut data = Vec::with_capacity(x.rows * h);
        for r in 0..x.rows {
            let row = x.row(r);
            data.extend(row[..h].iter().zip(&row[h..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u));
        }
        Ok(CpuTensor::new(data, x.rows, h))
    }

    fn add_assign(&self, a: &mut CpuTensor, b: &CpuTensor) -> Result<()> {
        check_same(a, b, "add")?;
        a.data.iter_mut().zip(&b.data).for_each(|(x, y)| *x += y);
        Ok(())
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            data.extend_from_slice(x.row(r as usize));
        }
        Ok(CpuTensor::new(data, rows.len(), x.cols))
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        cos_sin: &CpuTensor,
        positions: &[u32],
        heads: usize,
        offset: usize,
        stride: usize,
        rope: usize,
        interleaved: bool,
    ) -> Result<()> {
        let half = rope / 2;
        let cols = x.cols;
        for (r, &pos) in positions.iter().enumerate() {
            let cs = cos_sin.row(pos as usize);
            let (cos, sin) = cs.split_at(half);
            let row = &mut x.data[r * cols..(r + 1) * cols];
            for h in 0..heads {
                let v = &mut row[offset + h * stride..offset + h * stride + rope];
                for i in 0..half {
                    let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (x0, x1) = (v[a], v[b]);
                    v[a] = x0 * cos[i] - x1 * sin[i];
                    v[b] = x1 * cos[i] + x0 * sin[i];
                }
            }
        }
        Ok(())
    }

    fn write_kv(&self, cache: &mut CpuKvCache, layer: usize, latent: &CpuTensor, slots: &[u32]) -> Result<()> {
        let l = cache.layout;
        let slots_held = l.num_blocks * l.block_size;
        if latent.cols != l.width || slots.len() != latent.rows || layer >= l.layers {
            return Err(EngineError::Backend("write_kv: latent shape, slots or layer disagree with the cache".into()));
        }
        if let Some(&s) = slots.iter().find(|&&s| s != NO_SLOT && s as usize >= slots_held) {
            return Err(EngineError::Backend(format!("write_kv: slot {s} outside the cache")));
        }
        let (w, buf) = (l.width, &mut cache.layers[layer]);
        for (r, &slot) in slots.iter().enumerate().filter(|(_, &s)| s != NO_SLOT) {
            buf[slot as usize * w..(slot as usize + 1) * w].copy_from_slice(latent.row(r));
        }
        Ok(())
    }

    fn mla_attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        kv_b: &CpuWeight,
        batch: &AttnBatch,
        dims: MlaDims,
    ) -> Result<CpuTensor> {
        attention::mla_attention(q, cache, layer, kv_b, batch, dims)
    }

    fn moe_route(&self, logits: &CpuTensor, bias: &CpuTensor, params: RouterParams) -> Result<CpuRouting> {
        Ok(CpuRouting::route(logits, &bias.data, params))
    }

    fn moe_experts(&self, x: &CpuTensor, routing: &CpuRouting, experts: &CpuExperts) -> Result<CpuTensor> {
        experts.forward(x, routing)
    }

    fn sample(&self, logits: &CpuTensor, rows: &[SampleRow], masks: &[u32]) -> Result<Vec<(u32, f32)>> {
        let words = logits.cols.div_ceil(32);
        rows.iter()
            .map(|r| {
                if r.row as usize >= logits.rows {
                    return Err(EngineError::Backend(format!("sample: row {} of {}", r.row, logits.rows)));
                }
                let mask = match r.mask {
                    SampleRow::NO_MASK => None,
                    m => Some(masks.get(m as usize * words..(m as usize + 1) * words).ok_or_else(|| {
                        EngineError::Backend(format!("sample: mask {m} of {}", masks.len() / words.max(1)))
                    })?),
                };
                Ok(crate::sampler::pick(logits.row(r.row as usize), r, mask))
            })
            .collect()
    }

    fn export_blocks(&self, cache: &CpuKvCache, blocks: &[u32]) -> Result<Vec<f32>> {
        let n = cache.layout.block_size * cache.layout.width;
        let mut out = Vec::with_capacity(blocks.len() * cache.layout.block_values());
        for &b in blocks {
            for layer in &cache.layers {
                out.extend_from_slice(&layer[b as usize * n..(b as usize + 1) * n]);
            }
        }
        Ok(out)
    }

    fn import_blocks(&self, cache: &mut CpuKvCache, blocks: &[u32], data: &[f32]) -> Result<()> {
        let n = cache.layout.block_size * cache.layout.width;
        if data.len() != blocks.len() * cache.layout.block_values() {
            return Err(EngineError::Backend(format!(
                "import_blocks: {} values for {} blocks of {}",
                data.len(),
                blocks.len(),
                cache.layout.block_values()
            )));
        }
        let mut chunks = data.chunks_exact(n);
        for &b in blocks {
            for layer in cache.layers.iter_mut() {
                layer[b as usize * n..(b as usize + 1) * n].copy_from_slice(chunks.next().expect("length checked"));
            }
        }
        Ok(())
    }
}
