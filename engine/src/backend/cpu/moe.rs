//! DeepSeek-V3 MoE on the CPU: `noaux_tc` group-limited routing and the routed experts.

use rayon::prelude::*;

use super::{load_stacked, matmul_t, CpuTensor, CpuWeight};
use crate::backend::{ExpertSource, RouterParams};
use crate::error::Result;

/// For each token, `top_k` expert ids and their weights (the routed experts, then any shared
/// experts folded in).
#[derive(Debug, Clone)]
pub struct CpuRouting {
    pub top_k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Routes one token from its f32 router logits: sigmoid, bias for selection only, groups scored
/// by their top-2 sum, experts of the dropped groups masked with -inf (as transformers 5.x and
/// DeepSeek's own inference code do; older transformers filled 0.0), top-k, weights from the
/// unbiased scores.
pub fn route_token(logits: &[f32], bias: &[f32], p: RouterParams) -> (Vec<u32>, Vec<f32>) {
    let scores: Vec<f32> = logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
    let mut choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per_group = p.n_experts / p.n_group;
    let group_scores: Vec<f32> =
        choice.chunks_exact(per_group).map(|g| top_indices(g, 2).iter().map(|&i| g[i]).sum()).collect();
    let keep = top_indices(&group_scores, p.topk_group);
    for (g, chunk) in choice.chunks_exact_mut(per_group).enumerate() {
        if !keep.contains(&g) {
            chunk.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        }
    }
    let ids = top_indices(&choice, p.top_k);
    let mut w: Vec<f32> = ids.iter().map(|&i| scores[i]).collect();
    if p.norm_topk_prob {
        let denom = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| *x /= denom);
    }
    w.iter_mut().for_each(|x| *x *= p.scaling);
    let mut ids: Vec<u32> = ids.into_iter().map(|i| i as u32).collect();
    ids.extend((0..p.shared).map(|s| (p.n_experts + s) as u32));
    w.resize(ids.len(), 1.0);
    (ids, w)
}

impl CpuRouting {
    pub(super) fn route(logits: &CpuTensor, bias: &[f32], p: RouterParams) -> CpuRouting {
        let per_token: Vec<(Vec<u32>, Vec<f32>)> =
            (0..logits.rows).into_par_iter().map(|r| route_token(logits.row(r), bias, p)).collect();
        let k = p.top_k + p.shared;
        let mut ids = Vec::with_capacity(logits.rows * k);
        let mut weights = Vec::with_capacity(logits.rows * k);
        for (i, w) in per_token {
            ids.extend(i);
            weights.extend(w);
        }
        CpuRouting { top_k: k, ids, weights }
    }
}

/// Routed experts: stacked gate/up `[2i, h]` and down `[h, i]` per expert.
pub struct CpuExperts {
    experts: Vec<(CpuWeight, CpuWeight)>,
    /// The layer's id of `experts[0]`.
    first: usize,
}

impl CpuExperts {
    pub(super) fn load(sources: &[ExpertSource<'_>], first: usize) -> Result<Self> {
        let experts = sources
            .iter()
            .map(|e| {
                let gate_up = load_stacked(&[e.gate, e.up])?;
                Ok((gate_up, load_stacked(std::slice::from_ref(&e.down))?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuExperts { experts, first })
    }

    pub(super) fn forward(&self, x: &CpuTensor, routing: &CpuRouting) -> Result<CpuTensor> {
        let mut tokens: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        for (slot, (&e, &w)) in routing.ids.iter().zip(&routing.weights).enumerate() {
            // Another rank of an expert-parallel group computes the experts outside this range.
            let Some(e) = (e as usize).checked_sub(self.first).filter(|&e| e < self.experts.len()) else {
                continue;
            };
            tokens[e].push((slot / routing.top_k, w));
        }
        let partial: Vec<(usize, Vec<f32>)> = tokens
            .par_iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(e, t)| {
                let (gate_up, down) = &self.experts[e];
                let mut xs = Vec::with_capacity(t.len() * x.cols);
                for &(row, _) in t {
                    xs.extend_from_slice(x.row(row));
                }
                let gu = matmul_t(&xs, t.len(), x.cols, &gate_up.data, gate_up.out);
                let i = gate_up.out / 2;
                let act: Vec<f32> = gu
                    .chunks_exact(2 * i)
                    .flat_map(|r| r[..i].iter().zip(&r[i..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u))
                    .collect();
                (e, matmul_t(&act, t.len(), i, &down.data, down.out))
            })
            .collect();
        let mut out = vec![0f32; x.rows * x.cols];
        for (e, y) in partial {
            for (k, &(row, w)) in tokens[e].iter().enumerate() {
                for (o, v) in out[row * x.cols..(row + 1) * x.cols].iter_mut().zip(&y[k * x.cols..(k + 1) * x.cols]) {
                    *o += w * v;
                }
            }
        }
        Ok(CpuTensor::new(out, x.rows, x.cols))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_groups_never_win_even_against_negative_scores() {
        // 4 experts in 2 groups; the bias pushes every choice score below zero and only group 1
        // is kept. A 0.0 fill (old transformers) would pick group 0's experts here.
        let p = RouterParams {
            n_experts: 4,
            n_group: 2,
            topk_group: 1,
            top_k: 2,
            norm_topk_prob: true,
            scaling: 2.5,
            shared: 0,
        };
        let logits = [0.0, 0.0, 0.0, 0.0];
        let bias = [-0.9, -0.9, -0.7, -0.8];
        let (ids, w) = route_token(&logits, &bias, p);
        assert_eq!(ids, vec![2, 3]);
        assert!((w.iter().sum::<f32>() - 2.5).abs() < 1e-6);
    }

    #[test]
    fn group_limit_and_weights() {
        let p = RouterParams {
            n_experts: 8,
            n_group: 4,
            topk_group: 2,
            top_k: 3,
            norm_topk_prob: false,
            scaling: 1.0,
            shared: 0,
        };
        let logits = [3.0, -1.0, 2.5, 2.4, -3.0, -3.0, 0.0, 1.0];
        let (ids, w) = route_token(&logits, &[0.0; 8], p);
        // Group scores (sums of sigmoids): [3,-1] 1.222, [2.5,2.4] 1.841, [-3,-3] 0.095,
        // [0,1] 1.231: groups 1 and 3 are kept, so expert 0 (the best single score) is out.
        assert_eq!(ids, vec![2, 3, 7]);
        assert!((w[0] - 1.0 / (1.0 + (-2.5f32).exp())).abs() < 1e-6);
        // Two shared experts folded in follow the routed ones, at weight 1.
        let (ids, w) = route_token(&logits, &[0.0; 8], RouterParams { shared: 2, ..p });
        assert_eq!(ids, vec![2, 3, 7, 8, 9]);
        assert_eq!(&w[3..], &[1.0, 1.0]);
    }
}
