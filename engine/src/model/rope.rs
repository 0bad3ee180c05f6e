//! Rotary embedding tables, with YaRN's frequency blend (transformers' `_compute_yarn_parameters`).

use std::f64::consts::PI;

use super::config::{yarn_mscale, ModelConfig};

/// Per-pair inverse frequencies and the factor cos/sin are multiplied by.
pub fn inv_freq(cfg: &ModelConfig) -> (Vec<f32>, f32) {
    let dim = cfg.qk_rope_head_dim;
    let base = cfg.rope_theta;
    let half = dim / 2;
    let pos_freqs: Vec<f64> = (0..half).map(|i| base.powf((2 * i) as f64 / dim as f64)).collect();
    let Some(y) = &cfg.yarn else {
        return (pos_freqs.iter().map(|p| (1.0 / p) as f32).collect(), 1.0);
    };
    let attention_factor = match y.attention_factor {
        Some(a) => a,
        None if y.mscale != 0.0 && y.mscale_all_dim != 0.0 => {
            yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)
        }
        None => yarn_mscale(y.factor, 1.0),
    };
    let orig = y.original_max_position_embeddings as f64;
    let correction_dim = |rot: f64| dim as f64 * (orig / (rot * 2.0 * PI)).ln() / (2.0 * base.ln());
    let (low, high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
    let (low, high) = if y.truncate { (low.floor(), high.ceil()) } else { (low, high) };
    let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    let inv: Vec<f32> = pos_freqs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            let interp = 1.0 / (y.factor * p);
            let extra = 1.0 / p;
            (interp * (1.0 - extrapolation) + extra * extrapolation) as f32
        })
        .collect();
    (inv, attention_factor as f32)
}

/// `[positions, dim]`: for each position, `dim/2` cosines then `dim/2` sines.
pub fn cos_sin_table(cfg: &ModelConfig, positions: usize) -> Vec<f32> {
    let (inv, factor) = inv_freq(cfg);
    let mut t = Vec::with_capacity(positions * inv.len() * 2);
    for p in 0..positions {
        // The angle in f32, as transformers computes it.
        let angles: Vec<f32> = inv.iter().map(|f| p as f32 * f).collect();
        t.extend(angles.iter().map(|a| (*a as f64).cos() as f32 * factor));
        t.extend(angles.iter().map(|a| (*a as f64).sin() as f32 * factor));
    }
    t
}
