//! Sampling on the GPU against the reference (`cleave_engine::sampler::pick`) on the same logits
//! and the same uniform draws: greedy, temperature, top-k, top-p, min-p and their mixes, a third
//! of the rows under a structured-output mask (an eighth of the vocabulary allowed, or one token).

use anyhow::Result;
use cleave_engine::backend::{Backend, SampleRow};

use super::ops::Ctx;
use super::Ceiling;

/// (temperature, top_k, top_p, min_p) cycled over the rows.
const SETTINGS: &[(f32, u32, f32, f32)] = &[
    (0.0, 0, 1.0, 0.0),
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 0.9, 0.0),
    (1.0, 50, 1.0, 0.0),
    (1.3, 0, 1.0, 0.05),
    (0.8, 20, 0.8, 0.02),
    (0.6, 1, 1.0, 0.0),
    (1.0, 0, 0.05, 0.0),
];

impl Ctx<'_> {
    pub fn sample(&mut self) -> Result<()> {
        let vocab = if self.quick { 1000 } else { 129280 };
        let batches: &[usize] = if self.quick { &[16] } else { &[1, 64, 256] };
        for &n in batches {
            let logits = self.rng.vec(n * vocab, 8.0);
            let (lc, lg) = self.up(&logits, n, vocab)?;
            let words = vocab.div_ceil(32);
            let mut masks = Vec::new();
            let rows: Vec<SampleRow> = (0..n)
                .map(|i| {
                    let (temperature, top_k, top_p, min_p) = SETTINGS[i % SETTINGS.len()];
                    let mut mask = SampleRow::NO_MASK;
                    if i % 3 == 1 {
                        mask = (masks.len() / words) as u32;
                        let mut bits = vec![0u32; words];
                        for t in 0..vocab {
                            if (i / 3) % 4 == 3 && t != (i * 7919) % vocab {
                                continue;
                            }
                            if (i / 3) % 4 == 3 || self.rng.unit() < 0.125 {
                                bits[t / 32] |= 1 << (t % 32);
                            }
                        }
                        masks.extend(bits);
                    }
                    SampleRow { row: i as u32, temperature, top_k, top_p, min_p, u: self.rng.unit(), mask }
                })
                .collect();
            let want = self.cpu.sample(&lc, &rows, &masks)?;
            let got = self.cu.sample(&lg, &rows, &masks)?;
            let outside = got
                .iter()
                .zip(&rows)
                .filter(|(g, r)| {
                    let m = r.mask as usize * words;
                    r.mask != SampleRow::NO_MASK && masks[m + g.0 as usize / 32] >> (g.0 % 32) & 1 == 0
                })
                .count();
            let differ = want.iter().zip(&got).filter(|(a, b)| a.0 != b.0).count();
            let greedy_differ =
                want.iter().zip(&got).zip(&rows).filter(|((a, b), r)| r.temperature == 0.0 && a.0 != b.0).count();
            let dlp = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.0 == b.0)
                .map(|(a, b)| (a.1 - b.1).abs() as f64)
                .fold(0.0, f64::max);
            let us = self.time(|| self.cu.sample(&lg, &rows, &masks).map(drop))?;
            let us_copy = self.time(|| self.cu.download(&lg).map(drop))?;
            let bytes = (n * vocab * 4) as f64;
            // A token may differ only where u lands within f32 rounding of a boundary.
            let frac = if greedy_differ + outside > 0 { f64::INFINITY } else { differ as f64 / n as f64 };
            self.push(
                "sample tokens",
                format!(
                    "{n} rows of {vocab}, {} masked (differing: {differ}; logits copy {us_copy:.0} us)",
                    masks.len() / words
                ),
                frac,
                0.02,
                us,
                bytes,
                0.0,
                Ceiling::Mem,
            );
            self.push(
                "sample logprob",
                format!("{n} rows of {vocab}, max |dlogprob|"),
                dlp,
                1e-4,
                us,
                bytes,
                0.0,
                Ceiling::Mem,
            );
        }
        Ok(())
    }
}
