//! MLA's prologue (RoPE on q, the latent's RMSNorm and RoPE, the cache write), fused and as
//! separate ops, against the CPU backend's separate ops.

use anyhow::Result;
use cleave_engine::backend::cuda::Variants;
use cleave_engine::backend::{Backend, KvLayout, MlaDims, Rotary, NO_SLOT};

use super::ops::Ctx;
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    /// Under the default kernels and with the other prologue (fused or separate).
    pub(super) fn mla_prologue(&mut self) -> Result<()> {
        let def = self.cu.variants();
        let other = if def.fused_prologue { " separate" } else { " fused" };
        let alts = [(other.to_string(), Variants { fused_prologue: !def.fused_prologue, ..def })];
        let tag = if def.fused_prologue { " fused" } else { " separate" };
        self.each_variant(tag, &alts, Self::prologue_all)
    }

    fn prologue_all(&mut self) -> Result<()> {
        let odd = MlaDims { heads: 3, nope: 16, rope: 8, v: 16, kv_lora: 40, scale: 0.25 };
        let lite = MlaDims { heads: 16, nope: 128, rope: 64, v: 128, kv_lora: 512, scale: 0.1 };
        let v3 = MlaDims { heads: 128, ..lite };
        let cases: &[(MlaDims, usize, bool)] = if self.quick {
            &[(odd, 5, true), (lite, 3, false)]
        } else {
            &[(odd, 5, true), (lite, 1, false), (lite, 64, false), (v3, 256, true), (lite, 4096, false)]
        };
        for &(d, rows, interleaved) in cases {
            self.prologue_case(d, rows, interleaved)?;
        }
        Ok(())
    }

    fn prologue_case(&mut self, d: MlaDims, rows: usize, interleaved: bool) -> Result<()> {
        let (bs, width, qk, max_pos) = (16, d.kv_lora + d.rope, d.nope + d.rope, 4096);
        let layout = KvLayout { layers: 2, num_blocks: rows.div_ceil(bs) + 2, block_size: bs, width };
        let mut slots: Vec<u32> = (0..(layout.num_blocks * bs) as u32).collect();
        self.rng.shuffle(&mut slots);
        slots.truncate(rows);
        if rows > 1 {
            slots[rows - 1] = NO_SLOT; // a captured step's padding row
        }
        let positions: Vec<u32> = (0..rows).map(|_| self.rng.below(max_pos) as u32).collect();
        let q = self.rng.vec(rows * d.heads * qk, 1.0);
        let kv = self.rng.vec(rows * width, 2.0);
        let norm: Vec<f32> = (0..d.kv_lora).map(|_| 0.5 + self.rng.unit()).collect();
        let table = self.rng.vec(max_pos * d.rope, 1.0);
        let (mut qc, mut qg) = self.up(&q, rows, d.heads * qk)?;
        let (kc, kg) = self.up(&kv, rows, width)?;
        let (nc, ng) = self.up(&norm, 1, d.kv_lora)?;
        let (tc, tg) = self.up(&table, max_pos, d.rope)?;
        let (mut cc, mut cg) = (self.cpu.alloc_kv_cache(layout)?, self.cu.alloc_kv_cache(layout)?);
        let rot_c = Rotary { cos_sin: &tc, positions: &positions, interleaved };
        let rot_g = Rotary { cos_sin: &tg, positions: &positions, interleaved };
        self.cpu.mla_prologue(&mut qc, &kc, &nc, 1e-6, rot_c, &mut cc, 1, &slots, d)?;
        self.cu.mla_prologue(&mut qg, &kg, &ng, 1e-6, rot_g, &mut cg, 1, &slots, d)?;
        let blocks: Vec<u32> = (0..layout.num_blocks as u32).collect();
        let cache_err = rel_err(&self.cu.export_blocks(&cg, &blocks)?, &self.cpu.export_blocks(&cc, &blocks)?);
        let mut err = rel_err(&self.cu.download(&qg)?, &qc.data).max(cache_err);
        if self.cu.variants().fused_prologue {
            // The fused kernel leaves q's bf16 copy (the attention's GEMM operand) beside it.
            err = err.max(self.shadow_err(&qg)?);
        }
        let us = self.time(|| self.cu.mla_prologue(&mut qg, &kg, &ng, 1e-6, rot_g, &mut cg, 1, &slots, d))?;
        let bytes = (rows * (d.heads * d.rope * 8 + width * 6)) as f64;
        let shape =
            format!("{rows} rows, {} heads, latent {}+{}, interleaved {interleaved}", d.heads, d.kv_lora, d.rope);
        self.push("mla_prologue", shape, err, 1e-2, us, bytes, 0.0, Ceiling::Mem);
        Ok(())
    }
}
