//! Quantized weights in the layout of `cu/quant.cu`: the host packing, its geometry and a CPU
//! reader of the packed bytes (the layout's reference; kernels-check compares the device kernels
//! with the dequantized weights themselves).
//!
//! For each matrix `[n, k]` of a stack, per column block of 8 and unit of 32 input channels, 32
//! lanes hold, lane `4 g + t`, column `8 nb + g` at the k offsets of that lane's m16n8k16 B
//! fragments (see quant.cu). Scales are per (group of `group` input channels, column): f16 for
//! AWQ, f32 for FP8; AWQ zero points are nibbles per (group, column).

use half::f16;
use rayon::prelude::*;

/// A compressed weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QFormat {
    /// AutoAWQ int4 with f16 scales and 4-bit zero points: `W = (q - z) * s`.
    AwqInt4,
    /// FP8 e4m3 with f32 block scales: `W = q * s`.
    Fp8E4m3,
}

impl QFormat {
    /// u32 words per lane per 32-channel unit.
    pub fn words_per_lane(self) -> usize {
        match self {
            QFormat::AwqInt4 => 1,
            QFormat::Fp8E4m3 => 2,
        }
    }
    pub fn scale_bytes(self) -> usize {
        match self {
            QFormat::AwqInt4 => 2,
            QFormat::Fp8E4m3 => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            QFormat::AwqInt4 => "awq",
            QFormat::Fp8E4m3 => "fp8",
        }
    }
}

/// Geometry of a stack of `experts` quantized `[n, k]` matrices with scales per `group` input
/// channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QShape {
    pub format: QFormat,
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    pub group: usize,
}

impl QShape {
    /// Whether the kernels take this grouping: groups of a power of two of at least 32 input
    /// channels (whole 32-channel units, found by a shift), `k % 8 == 0`.
    pub fn supported(k: usize, group: usize) -> bool {
        group >= 32 && group.is_power_of_two() && k.is_multiple_of(8)
    }
    /// Columns padded to a multiple of 8.
    pub fn np(&self) -> usize {
        self.n.next_multiple_of(8)
    }
    /// Input channels padded to a multiple of 128 (the widest pipeline stage).
    pub fn kp(&self) -> usize {
        self.k.next_multiple_of(128)
    }
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }
    pub fn words_per_matrix(&self) -> usize {
        self.np() / 8 * (self.kp() / 32) * 32 * self.format.words_per_lane()
    }
    pub fn scales_per_matrix(&self) -> usize {
        self.groups() * self.np()
    }
    pub fn zero_words_per_matrix(&self) -> usize {
        match self.format {
            QFormat::AwqInt4 => self.groups() * self.np() / 8,
            QFormat::Fp8E4m3 => 0,
        }
    }
    /// Device bytes of the whole stack.
    pub fn bytes(&self) -> usize {
        self.experts
            * (self.words_per_matrix() * 4
                + self.scales_per_matrix() * self.format.scale_bytes()
                + self.zero_words_per_matrix() * 4)
    }
}

/// One matrix of a [`QShape`] packed: weight words, scales (little-endian f16 or f32 bytes) and
/// AWQ zero-point words.
#[derive(Debug, Clone, Default)]
pub struct QPacked {
    pub words: Vec<u32>,
    pub scales: Vec<u8>,
    pub zeros: Vec<u32>,
}

/// The k offset (within its 32-channel unit) of slot `j` (int4 nibble or fp8 byte) of lane `t`'s
/// word(s).
fn slot_k(format: QFormat, t: usize, j: usize) -> usize {
    match format {
        QFormat::AwqInt4 => 2 * t + 8 * (j & 3) + (j >> 2),
        QFormat::Fp8E4m3 => 2 * t + 8 * (j >> 1) + (j & 1),
    }
}

/// Packs one `[n, k]` matrix: `value(n, k)` is the AWQ nibble (0..16) or the e4m3 byte,
/// `scale(group, n)` the scale, `zero(group, n)` the AWQ zero point (ignored for FP8). Returns
/// `None` when an AWQ scale is not exactly an f16 (the layout stores f16).
pub fn pack(
    shape: &QShape,
    value: impl Fn(usize, usize) -> u8 + Sync,
    scale: impl Fn(usize, usize) -> f32,
    zero: impl Fn(usize, usize) -> u8,
) -> Option<QPacked> {
    let (f, n, k) = (shape.format, shape.n, shape.k);
    let wpl = f.words_per_lane();
    let mut words = vec![0u32; shape.words_per_matrix()];
    // Each block of 8 output columns owns a contiguous run of words: packed in parallel.
    words.par_chunks_mut((shape.kp() / 32) * 32 * wpl).enumerate().for_each(|(nb, block)| {
        for (ku, unit) in block.chunks_mut(32 * wpl).enumerate() {
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                let col = 8 * nb + g;
                for j in 0..8 {
                    let kk = 32 * ku + slot_k(f, t, j);
                    let v = if col < n && kk < k { value(col, kk) as u32 } else { 0 };
                    match f {
                        QFormat::AwqInt4 => unit[lane] |= (v & 0xf) << (4 * j),
                        QFormat::Fp8E4m3 => unit[lane * 2 + j / 4] |= v << (8 * (j % 4)),
                    }
                }
            }
        }
    });
    pack_scales(shape, words, scale, zero)
}

/// [`pack`] for AWQ int4, 8 columns at a time: `fill(block, words)` ORs the values of columns
/// `8 block..8 block + 8` into their words, the value of column `8 block + g`, input channel
/// `32 u + i` as `words[32 u + 4 g + t] |= v << (4 j)` with `(t, j) = awq_slot(i)`. A source then
/// reads each stored word once (`pack`'s call per value made the load of a rank of R1 mostly
/// repacking: run 100).
pub fn pack_awq(
    shape: &QShape,
    fill: impl Fn(usize, &mut [u32]) + Sync,
    scale: impl Fn(usize, usize) -> f32,
    zero: impl Fn(usize, usize) -> u8,
) -> Option<QPacked> {
    assert_eq!(shape.format, QFormat::AwqInt4, "pack_awq packs AWQ int4");
    let mut words = vec![0u32; shape.words_per_matrix()];
    words.par_chunks_mut((shape.kp() / 32) * 32).enumerate().for_each(|(nb, block)| fill(nb, block));
    pack_scales(shape, words, scale, zero)
}

/// Where channel `i` (0..32) of a unit goes in an AWQ column's four words: word `t`, nibble `j`
/// ([`pack_awq`]).
pub const fn awq_slot(i: usize) -> (usize, usize) {
    // The inverse of slot_k: i = 2 t + 8 (j & 3) + (j >> 2).
    ((i % 8) / 2, (i / 8) | ((i % 2) << 2))
}

/// `words` with the matrix's scales and AWQ zero points.
fn pack_scales(
    shape: &QShape,
    words: Vec<u32>,
    scale: impl Fn(usize, usize) -> f32,
    zero: impl Fn(usize, usize) -> u8,
) -> Option<QPacked> {
    let (f, n, np) = (shape.format, shape.n, shape.np());
    let mut scales = Vec::with_capacity(shape.scales_per_matrix() * f.scale_bytes());
    let mut zeros = vec![0u32; shape.zero_words_per_matrix()];
    for grp in 0..shape.groups() {
        for col in 0..np {
            let s = if col < n { scale(grp, col) } else { 0.0 };
            match f {
                QFormat::AwqInt4 => {
                    let h = f16::from_f32(s);
                    if h.to_f32() != s {
                        return None;
                    }
                    scales.extend(h.to_bits().to_le_bytes());
                    let z = if col < n { zero(grp, col) as u32 & 0xf } else { 0 };
                    zeros[grp * np / 8 + col / 8] |= z << (4 * (col % 8));
                }
                QFormat::Fp8E4m3 => scales.extend(s.to_le_bytes()),
            }
        }
    }
    Some(QPacked { words, scales, zeros })
}

/// Reads `[n, k]` f32 weights back from a packed matrix, the way `qdequant` in quant.cu does.
pub fn unpack_f32(shape: &QShape, p: &QPacked, fp8_to_f32: impl Fn(u8) -> f32) -> Vec<f32> {
    let (f, n, k, np, kp) = (shape.format, shape.n, shape.k, shape.np(), shape.kp());
    let wpl = f.words_per_lane();
    let mut out = vec![0f32; n * k];
    for col in 0..n {
        for kk in 0..k {
            let (u, t) = (kk % 32, (kk % 8) / 2);
            let lane = (col % 8) * 4 + t;
            let base = (((col / 8) * (kp / 32) + kk / 32) * 32 + lane) * wpl;
            let grp = kk / shape.group;
            let si = grp * np + col;
            out[col * k + kk] = match f {
                QFormat::AwqInt4 => {
                    let j = u / 8 + 4 * (u % 2);
                    let q = (p.words[base] >> (4 * j)) & 0xf;
                    let z = (p.zeros[grp * np / 8 + col / 8] >> (4 * (col % 8))) & 0xf;
                    let s = f16::from_bits(u16::from_le_bytes([p.scales[2 * si], p.scales[2 * si + 1]])).to_f32();
                    (q as f32 - z as f32) * s
                }
                QFormat::Fp8E4m3 => {
                    let b = 2 * (u / 8) + u % 2;
                    let byte = (p.words[base + b / 4] >> (8 * (b % 4))) as u8;
                    let s = f32::from_le_bytes(p.scales[4 * si..4 * si + 4].try_into().expect("4 bytes"));
                    fp8_to_f32(byte) * s
                }
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    #[test]
    fn packing_round_trips_with_padding_in_both_formats() {
        // n and k not multiples of 8/64: padding columns and channels must not leak into real ones.
        for (format, n, k, group) in
            [(QFormat::AwqInt4, 20, 96, 32), (QFormat::AwqInt4, 16, 128, 64), (QFormat::Fp8E4m3, 13, 72, 32)]
        {
            let shape = QShape { format, experts: 1, n, k, group };
            let mut seed = 7u64;
            let vals: Vec<u8> = (0..n * k).map(|_| lcg(&mut seed) as u8).collect();
            let groups = shape.groups();
            let zs: Vec<u8> = (0..groups * n).map(|_| (lcg(&mut seed) % 16) as u8).collect();
            let ss: Vec<f32> = (0..groups * n)
                .map(|_| f16::from_f32((lcg(&mut seed) % 1000) as f32 / 997.0 + 0.01).to_f32())
                .collect();
            let value = |c: usize, kk: usize| {
                if format == QFormat::AwqInt4 {
                    vals[c * k + kk] & 0xf
                } else {
                    vals[c * k + kk]
                }
            };
            let p = pack(&shape, value, |g, c| ss[g * n + c], |g, c| zs[g * n + c]).expect("f16 scales");
            assert_eq!(p.words.len(), shape.words_per_matrix());
            let fake_fp8 = |b: u8| b as f32 - 100.0; // any injective map shows placement errors
            let got = unpack_f32(&shape, &p, fake_fp8);
            for c in 0..n {
                for kk in 0..k {
                    let (g, v) = (kk / group, value(c, kk));
                    let want = match format {
                        QFormat::AwqInt4 => (v as f32 - zs[g * n + c] as f32) * ss[g * n + c],
                        QFormat::Fp8E4m3 => fake_fp8(v) * ss[g * n + c],
                    };
                    assert_eq!(got[c * k + kk], want, "{format:?} n {c} k {kk}");
                }
            }
        }
    }

    #[test]
    fn awq_by_units_packs_what_awq_by_values_packs() {
        // Columns past n (padding to 8) and inputs past k (padding to 128) included.
        let (n, k, group) = (20, 100, 32);
        let shape = QShape { format: QFormat::AwqInt4, experts: 1, n, k, group };
        let value = |c: usize, kk: usize| ((c * 7 + kk * 13 + (c * kk) % 5) % 16) as u8;
        let scale = |g: usize, c: usize| 0.25 * (1 + (g + c) % 3) as f32;
        let zero = |g: usize, c: usize| ((g * 3 + c) % 16) as u8;
        assert!((0..4).all(|t| (0..8).all(|j| awq_slot(slot_k(QFormat::AwqInt4, t, j)) == (t, j))));
        let fill = |nb: usize, words: &mut [u32]| {
            for g in (0..8).filter(|g| 8 * nb + g < n) {
                for kk in 0..k {
                    let (t, j) = awq_slot(kk % 32);
                    words[kk / 32 * 32 + 4 * g + t] |= (value(8 * nb + g, kk) as u32) << (4 * j);
                }
            }
        };
        let (a, b) = (pack(&shape, value, scale, zero).unwrap(), pack_awq(&shape, fill, scale, zero).unwrap());
        assert_eq!((a.words, a.scales, a.zeros), (b.words, b.scales, b.zeros));
    }

    #[test]
    fn awq_scales_that_are_not_f16_are_refused() {
        let shape = QShape { format: QFormat::AwqInt4, experts: 1, n: 8, k: 32, group: 32 };
        assert!(pack(&shape, |_, _| 1, |_, _| 0.1f32, |_, _| 0).is_none());
        assert!(QShape::supported(128, 64) && !QShape::supported(96, 48) && !QShape::supported(100, 32));
        assert!(!QShape::supported(192, 96) && !QShape::supported(64, 16));
    }

    #[test]
    fn awq_v3_expert_bytes_stay_near_the_checkpoint_size() {
        // int4 + f16 scale + 4-bit zero per 64 channels: 0.539 bytes per weight, as AutoAWQ stores.
        let s = QShape { format: QFormat::AwqInt4, experts: 256, n: 4096, k: 7168, group: 64 };
        let per_weight = s.bytes() as f64 / (256.0 * 4096.0 * 7168.0);
        assert!((per_weight - 0.5390625).abs() < 1e-9, "{per_weight}");
    }
}
