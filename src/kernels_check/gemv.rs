//! The decode grouped GEMM (`grouped_gemv`, weights streamed straight into MMA fragments) in each
//! compiled shape against the shared-memory grouped GEMM (`gg16_*_v2`, itself checked against the
//! CPU in the experts stage) at DeepSeek decode shapes, with the HBM share of the expert weights
//! the step touches. The engine uses `Gpu::GEMV_DEFAULT`; this table is how it was chosen.

use anyhow::Result;
use cleave_kernels::{ptr, Gpu};

use super::ops::Ctx;
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    pub fn gemv(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        // (experts, hidden, moe_intermediate): V2-Lite, V3.
        let shapes: &[(usize, usize, usize)] =
            if self.quick { &[(8, 256, 128)] } else { &[(64, 2048, 1408), (256, 7168, 2048)] };
        let batches: &[usize] = if self.quick { &[4] } else { &[1, 16, 64] };
        let top_k = 6;
        for &(e, h, i) in shapes {
            let gate_up = g.alloc::<u16>(e * 2 * i * h)?;
            let down = g.alloc::<u16>(e * h * i)?;
            g.fill_uniform_bf16(ptr(&gate_up), e * 2 * i * h, 7, -0.05, 0.05)?;
            g.fill_uniform_bf16(ptr(&down), e * h * i, 8, -0.05, 0.05)?;
            for &b in batches {
                let a = b * top_k;
                let mut ids = Vec::with_capacity(a);
                for _ in 0..b {
                    let mut all: Vec<u32> = (0..e as u32).collect();
                    self.rng.shuffle(&mut all);
                    ids.extend_from_slice(&all[..top_k]);
                }
                let id_buf = g.alloc::<u32>(a)?;
                g.htod(&ids, ptr(&id_buf))?;
                let max_tiles = Gpu::moe_max_tiles(a, e, 16);
                let (sorted, inv) = (g.alloc::<i32>(a)?, g.alloc::<i32>(a)?);
                let (tiles, meta) = (g.alloc::<i32>(3 * max_tiles)?, g.alloc::<i32>(1)?);
                g.moe_align(ptr(&id_buf), a, top_k, e, 16, ptr(&sorted), ptr(&inv), ptr(&tiles), ptr(&meta), 0)?;
                let x = g.alloc::<u16>(b * h)?;
                g.fill_uniform_bf16(ptr(&x), b * h, 9, -1.0, 1.0)?;
                let act = g.alloc::<u16>(a * i)?;
                g.fill_uniform_bf16(ptr(&act), a * i, 10, -1.0, 1.0)?;
                let touched = {
                    let mut u = ids.clone();
                    u.sort_unstable();
                    u.dedup();
                    u.len()
                };
                // (op, silu, x, rowidx, w, n, k, out values, weight bytes read)
                let (s, guw, dnw) = (ptr(&sorted), ptr(&gate_up), ptr(&down));
                let cases = [
                    ("gate_up", true, ptr(&x), s, guw, 2 * i, h, a * i, touched * 2 * i * h * 2),
                    ("down", false, ptr(&act), 0, dnw, h, i, a * h * 2, touched * h * i * 2),
                ];
                for (op, silu, xp, rowidx, wp, n, k, out_vals, bytes) in cases {
                    // bf16 outputs are compared through their bit patterns widened to f32.
                    let out = g.alloc::<u16>(out_vals)?;
                    let read = |o: &cleave_kernels::cudarc::driver::CudaSlice<u16>| -> Result<Vec<f32>> {
                        let mut v = vec![0u16; out_vals];
                        g.dtoh(ptr(o), &mut v)?;
                        Ok(if silu {
                            v.iter().map(|&x| f32::from_bits((x as u32) << 16)).collect()
                        } else {
                            v.chunks(2).map(|c| f32::from_bits(c[0] as u32 | (c[1] as u32) << 16)).collect()
                        })
                    };
                    let (tp, mp, op_) = (ptr(&tiles), ptr(&meta), ptr(&out));
                    g.grouped_gemm(true, 16, silu, xp, rowidx, wp, op_, tp, mp, max_tiles, n, k)?;
                    let want = read(&out)?;
                    let us = self.time(|| {
                        g.grouped_gemm(true, 16, silu, xp, rowidx, wp, op_, tp, mp, max_tiles, n, k).map_err(kerr)
                    })?;
                    let label = format!("{b} tok, {e}x{n}x{k}, {touched} experts");
                    self.push(&format!("gg16 v2 {op}"), label.clone(), 0.0, 1e-2, us, bytes as f64, 0.0, Ceiling::Mem);
                    for shape in Gpu::GEMV_SHAPES {
                        g.memset(op_, 0xff, out_vals * 2)?;
                        g.grouped_gemv(shape, silu, xp, rowidx, wp, op_, tp, mp, max_tiles, n, k)?;
                        let got = read(&out)?;
                        let us = self.time(|| {
                            g.grouped_gemv(shape, silu, xp, rowidx, wp, op_, tp, mp, max_tiles, n, k).map_err(kerr)
                        })?;
                        let name = format!("gemv {}x{} {op}", shape.0, shape.1);
                        self.push(
                            &name,
                            label.clone(),
                            rel_err(&got, &want),
                            1e-2,
                            us,
                            bytes as f64,
                            0.0,
                            Ceiling::Mem,
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

fn kerr(e: cleave_kernels::KernelError) -> cleave_engine::EngineError {
    cleave_engine::EngineError::Backend(format!("cuda: {e}"))
}
