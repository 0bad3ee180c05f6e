//! FP8 e4m3 on the host: the format's decoding and encoding, and the references of the FP8
//! tensor-core prefill path (DeepSeek's scheme: activations quantized per token per 128 input
//! channels, weights in 128 x 128 blocks), in the layouts cuBLASLt's block-scaled GEMM reads.
//!
//! Layouts (cuBLASLt `VEC128_32F` for the activations, `BLK128x128_32F` for the weights):
//! - activations `[rows, k]` become e4m3 bytes `[rows_p, k]` (rows padded with zeros to a
//!   multiple of 4, [`padded_rows`]) and f32 scales `s[kb * rows_p + row]` (token-major);
//! - a weight `[n, k]` has f32 scales `s[nb * kb_p + kb]`, `kb_p` = the 128-channel blocks of `k`
//!   padded to a multiple of 4 ([`weight_scale_ld`]).

use std::sync::OnceLock;

/// Input channels per activation scale, and rows/columns per weight scale block.
pub const BLOCK: usize = 128;
/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Floor of a block's absolute maximum before its scale is taken (an all-zero block gets a tiny
/// scale instead of a division by zero), as vLLM's per-token-group quantization does.
pub const AMAX_FLOOR: f32 = 1e-10;

/// Decodes one OCP float8 e4m3fn value (bias 7, no infinities, S.1111.111 is NaN).
pub fn e4m3_to_f32(x: u8) -> f32 {
    let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((x >> 3) & 0x0f) as i32;
    let man = (x & 0x07) as f32;
    if exp == 0x0f && (x & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// Encodes `x` as e4m3fn, rounding to nearest with ties to even and saturating to +-448 (PTX's
/// `cvt.rn.satfinite.e4m3x2.f32`); NaN becomes the NaN code.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Codes 0x00..=0x7e are the finite magnitudes in increasing order: the nearest of the two
    // codes around `a`, the even one on a tie (every value and midpoint is exact in f64).
    static MAGNITUDES: OnceLock<Vec<f32>> = OnceLock::new();
    let m = MAGNITUDES.get_or_init(|| (0u8..=0x7e).map(e4m3_to_f32).collect());
    let hi = m.partition_point(|&v| v < a).min(0x7e);
    if hi == 0 {
        return sign;
    }
    let (vl, vh) = (m[hi - 1] as f64, m[hi] as f64);
    let hi = hi as u8;
    let d = (a as f64 - vl) - (vh - a as f64);
    let code = if d < 0.0 || (d == 0.0 && (hi - 1).is_multiple_of(2)) { hi - 1 } else { hi };
    sign | code
}

/// Activation rows padded for the block-scaled GEMM (cuBLASLt wants a multiple of 4 tokens).
pub fn padded_rows(rows: usize) -> usize {
    rows.next_multiple_of(4)
}

/// The leading dimension of a weight's block-scale tensor: its 128-channel blocks of `k`,
/// padded to a multiple of 4.
pub fn weight_scale_ld(k: usize) -> usize {
    k.div_ceil(BLOCK).next_multiple_of(4)
}

/// Activations quantized for the FP8 GEMM: e4m3 bytes `[rows_p, k]` and token-major scales.
#[derive(Debug, Clone, PartialEq)]
pub struct ActQuant {
    pub rows_p: usize,
    pub q: Vec<u8>,
    pub scales: Vec<f32>,
}

impl ActQuant {
    /// The values the GEMM multiplies: `q * s`, `[rows, k]` (padding rows dropped).
    pub fn dequantized(&self, rows: usize, k: usize) -> Vec<f32> {
        (0..rows * k)
            .map(|i| {
                let (r, c) = (i / k, i % k);
                e4m3_to_f32(self.q[r * k + c]) * self.scales[(c / BLOCK) * self.rows_p + r]
            })
            .collect()
    }
}

/// The reference of the device's `act_quant_fp8`: per row and block of 128 channels,
/// `s = max(amax, AMAX_FLOOR) / 448` and `q = e4m3(x / s)` (an IEEE division, as on the device).
/// `k` must be a multiple of 128.
pub fn act_quant(x: &[f32], rows: usize, k: usize) -> ActQuant {
    assert!(k.is_multiple_of(BLOCK) && x.len() == rows * k, "act_quant takes [rows, k] with k % 128 == 0");
    let rows_p = padded_rows(rows);
    let kb = k / BLOCK;
    let mut q = vec![0u8; rows_p * k];
    let mut scales = vec![0f32; kb * rows_p];
    for r in 0..rows_p {
        for b in 0..kb {
            let block = |c: usize| if r < rows { x[r * k + b * BLOCK + c] } else { 0.0 };
            let amax = (0..BLOCK).map(|c| block(c).abs()).fold(0f32, f32::max);
            let s = amax.max(AMAX_FLOOR) / E4M3_MAX;
            scales[b * rows_p + r] = s;
            for c in 0..BLOCK {
                q[r * k + b * BLOCK + c] = f32_to_e4m3(block(c) / s);
            }
        }
    }
    ActQuant { rows_p, q, scales }
}

/// Where channel `c` of a row lies in the activations of the persistent decode GEMM
/// (`act_quant_fp8_mma`): permuted within its 32-channel unit to the k-slot order of the FP8
/// weights' fragment layout (cu/qdecode.cu).
pub fn mma_position(c: usize) -> usize {
    let k = c % 32;
    c - k + 16 * (k >> 4) + 4 * ((k & 7) >> 1) + 2 * ((k >> 3) & 1) + (k & 1)
}

/// Where channel `c` of a row lies in the activations of the FP8 wgmma grouped GEMM
/// (`act_quant_fp8_mma` with `Fp8Order::Wgmma`): permuted within its 32-channel unit to the byte
/// order in which the weights' fragment layout keeps a column's 32 bytes of the unit
/// ([`crate::quant::pack`]).
pub fn wgmma_position(c: usize) -> usize {
    let k = c % 32;
    c - k + 8 * ((k >> 1) & 3) + 2 * (k >> 3) + (k & 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn wgmma_positions_follow_the_weights_bytes() {
        use crate::quant::{pack, QFormat, QShape};
        // One column of one unit: byte b of the column's 32 holds the channel numbered b.
        let shape = QShape { format: QFormat::Fp8E4m3, experts: 1, n: 1, k: 32, group: 32 };
        let p = pack(&shape, |_, k| super::wgmma_position(k) as u8, |_, _| 1.0, |_, _| 0).unwrap();
        let bytes: Vec<u8> = p.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(&bytes[..32], &(0..32u8).collect::<Vec<_>>()[..]);
        let mut seen = [false; 64];
        (0..64).for_each(|c| seen[super::wgmma_position(c)] = true);
        assert!(seen.iter().all(|&s| s), "a permutation of each unit");
    }

    #[test]
    fn mma_positions_permute_each_unit_to_the_weights_k_slots() {
        // Slot s of a unit holds channel 16 (s >> 4) + 2 ((s >> 2) & 3) + 8 ((s >> 1) & 1) + (s & 1):
        // the channel the fragment layout's byte (s % 16 / 4, s % 4) of lane t = s % 16 / 4 holds.
        for s in 0..64 {
            let u = s % 32;
            let c = s - u + 16 * (u >> 4) + 2 * ((u >> 2) & 3) + 8 * ((u >> 1) & 1) + (u & 1);
            assert_eq!(super::mma_position(c), s);
        }
    }

    use super::*;

    #[test]
    fn decoding_matches_the_format() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // the largest finite value
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert!(e4m3_to_f32(0x7f).is_nan());
    }

    #[test]
    fn encoding_round_trips_and_rounds_to_nearest_even() {
        for c in (0u8..=0xff).filter(|c| c & 0x7f != 0x7f) {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(c)) & 0x7f, c & 0x7f, "code {c:#x}");
        }
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1000.0), 0xfe);
        // 1.0625 lies halfway between 1.0 (0x38, even) and 1.125 (0x39): ties go to even.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.1875 lies halfway between 1.125 (0x39) and 1.25 (0x3a, even).
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        // Below half the smallest subnormal: zero; just above: the subnormal.
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00);
        assert_eq!(f32_to_e4m3(2f32.powi(-10) * 1.01), 0x01);
    }

    #[test]
    fn act_quant_scales_each_block_to_the_format_range() {
        let (rows, k) = (3, 256);
        let x: Vec<f32> =
            (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 * (1 + i / 128) as f32).collect();
        let a = act_quant(&x, rows, k);
        assert_eq!((a.rows_p, a.q.len(), a.scales.len()), (4, 4 * 256, 2 * 4));
        let back = a.dequantized(rows, k);
        for (r, chunk) in x.chunks(BLOCK).enumerate() {
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (row, b) = (r / 2, r % 2);
            assert_eq!(a.scales[b * 4 + row], amax / E4M3_MAX);
            for (c, v) in chunk.iter().enumerate() {
                // e4m3 keeps 3 mantissa bits: within 1/16 relative, or the subnormal step.
                let got = back[row * k + b * BLOCK + c];
                assert!((got - v).abs() <= v.abs() / 16.0 + a.scales[b * 4 + row] * 2f32.powi(-9));
            }
        }
        // The padding row is zeros with the floor's scale.
        assert!(a.q[3 * k..].iter().all(|&b| b == 0));
        assert_eq!(a.scales[3], AMAX_FLOOR / E4M3_MAX);
    }
}
