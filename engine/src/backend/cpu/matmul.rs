//! Multithreaded f32 `x @ W^T` for the CPU backend.

use rayon::prelude::*;

/// Dot product with eight independent accumulators so the compiler vectorizes it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    acc.iter().sum::<f32>() + s
}

/// `y[n, m] = x[n, k] @ w[m, k]^T`, parallel over blocks of `w`'s rows.
pub fn matmul_t(x: &[f32], n: usize, k: usize, w: &[f32], m: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * k);
    debug_assert_eq!(w.len(), m * k);
    let mut y = vec![0f32; n * m];
    if n == 0 || m == 0 {
        return y;
    }
    // Enough rows per task to amortize scheduling, few enough to use every core.
    let rows_per_task = (m / (rayon::current_num_threads() * 4)).clamp(8, 256);
    let parts: Vec<(usize, Vec<f32>)> = w
        .par_chunks(rows_per_task * k)
        .enumerate()
        .map(|(t, wb)| {
            let mb = wb.len() / k;
            let mut part = vec![0f32; n * mb];
            for i in 0..n {
                let xi = &x[i * k..(i + 1) * k];
                for (j, wj) in wb.chunks_exact(k).enumerate() {
                    part[i * mb + j] = dot(xi, wj);
                }
            }
            (t * rows_per_task, part)
        })
        .collect();
    for (j0, part) in parts {
        let mb = part.len() / n;
        for i in 0..n {
            y[i * m + j0..i * m + j0 + mb].copy_from_slice(&part[i * mb..(i + 1) * mb]);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product() {
        let (n, k, m) = (5, 37, 300);
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let w: Vec<f32> = (0..m * k).map(|i| ((i * 11 % 17) as f32 - 8.0) / 7.0).collect();
        let y = matmul_t(&x, n, k, &w, m);
        for i in 0..n {
            for j in 0..m {
                let r: f32 = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
                assert!((y[i * m + j] - r).abs() < 1e-4, "{i},{j}");
            }
        }
    }
}
