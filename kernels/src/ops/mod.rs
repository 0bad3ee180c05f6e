//! Typed launchers: one method per kernel, over raw device addresses (`u64`) and sizes. Callers
//! own the buffers; these only check what the kernels assume and pick the launch shape. Each is
//! an `unsafe fn` whose `# Safety` section says what every address must hold: the launcher
//! cannot see the allocations behind them.

use std::cell::RefCell;
use std::collections::HashMap;

use cudarc::driver::sys::CUfunction_attribute;

use crate::{Arg, Gpu, Result};

mod attention;
pub use attention::{MlaOut, PREFILL_FLASH, PREFILL_FLASH_DS_DIMS};
mod elementwise;
mod gemv;
pub use gemv::{gemv_weight_reads, GemvOut, GemvWeight, GEMV_KERNELS, GEMV_MAX_ROWS};
mod kv;
pub use kv::{MlaPrologue, NO_SLOT};
mod mla;
pub use mla::{
    MlaDecode, MlaKernel, MlaLaunch, MLA4_KERNEL, MLA_COMBINE_KERNELS, MLA_COMBINE_SPLITS, MLA_DECODE_KERNELS,
    MLA_MAX_LATENT, MLA_MAX_SPLITS, MLA_TILE,
};
mod moe;
pub use moe::{GemmKernel, GroupedGemm, PersistentGemm, WgmmaGemm, GGW_FP8_BM, GGW_KERNELS};
mod qdecode;
pub(crate) use qdecode::StreamK;
pub use qdecode::{Fp8Order, QMma, QPersist, QDECODE_KERNELS};
mod quant;
pub use quant::{Expansion, QCut, QGemm, QWeights, QUANT_KERNELS};
mod routing;
pub use routing::{align_reference, Align, Aligned, Route, ROUTE_ALIGN_MAX_TOKENS};
mod sample;
pub use sample::{SampleLaunch, NO_MASK, SAMPLE_PARAM_WORDS};

/// Kernels of a decode step that open with `pdl_wait` (common.cuh), so that they may be launched
/// with programmatic dependent launch ([`Gpu::set_pdl`]), besides the families that all do:
/// [`GEMV_KERNELS`], [`MLA_DECODE_KERNELS`], [`MLA_COMBINE_KERNELS`] and the persistent grouped GEMMs
/// (see [`pdl_kernels`]).
const PDL_OPS: &[&str] = &[
    "rms_norm_f32",
    "mla_prologue_bf16",
    "mla_prologue_f32",
    "moe_route",
    "moe_align",
    "moe_route_align",
    "moe_combine",
    "moe_combine_norm",
    "qgemm_reduce",
    "act_quant_fp8_mma_f32",
    "act_quant_fp8_mma_bf16",
];

/// Whether `name` is one of the persistent grouped GEMMs (moe.cu `gg_persistent`).
fn persistent_grouped(name: &str) -> bool {
    moe::GGP_KERNELS.iter().any(|c| c.4 == name || c.5 == name)
}

/// Every kernel that may be launched with programmatic dependent launch: the decode step's ops
/// after the embedding, except cuBLAS's.
pub fn pdl_kernels() -> impl Iterator<Item = &'static str> {
    let grouped = moe::GGP_KERNELS.iter().flat_map(|c| [c.4, c.5]);
    PDL_OPS
        .iter()
        .chain(GEMV_KERNELS)
        .chain(MLA_DECODE_KERNELS)
        .chain(MLA_COMBINE_KERNELS)
        .chain(QDECODE_KERNELS)
        .copied()
        .chain(grouped)
}

/// Which kernels [`Gpu::set_pdl`] launches with programmatic dependent launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdl {
    Off,
    /// [`pdl_kernels`] but the bf16 persistent grouped GEMMs (those over compressed weights are
    /// in: they let the next kernel launch only once their work is done, and dense ones prefetch
    /// their first weights into L2 before they wait).
    Light,
    /// Every kernel of [`pdl_kernels`].
    All,
}

impl Pdl {
    /// Whether kernel `name` is launched with it.
    pub fn takes(self, name: &str) -> bool {
        let ops = || [PDL_OPS, GEMV_KERNELS, MLA_DECODE_KERNELS, MLA_COMBINE_KERNELS].iter().any(|l| l.contains(&name));
        let compressed = || QDECODE_KERNELS.contains(&name);
        match self {
            Pdl::Off => false,
            Pdl::Light => ops() || compressed(),
            Pdl::All => ops() || compressed() || persistent_grouped(name),
        }
    }
}

/// Output columns per grouped-GEMM block (must match moe.cu).
pub const GG_BN: usize = 128;

/// Stored weight dtypes `convert_weight` understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcDtype {
    Bf16 = 0,
    F16 = 1,
    F32 = 2,
    Fp8E4m3 = 3,
}

thread_local! {
    /// Resident blocks per SM by (kernel handle, dynamic shared memory). A stale entry (a handle
    /// reused by another module) would only change a grid size, never a result.
    static OCCUPANCY: RefCell<HashMap<(usize, usize), usize>> = RefCell::new(HashMap::new());
}

impl Gpu {
    /// Resident blocks per SM of kernel `name` with `threads` per block and `smem` bytes of dynamic
    /// shared memory, with the shared-memory carveout at its maximum (the driver's occupancy,
    /// queried once per kernel, size and thread): the grid of a persistent kernel.
    pub(crate) fn resident_blocks(&self, name: &'static str, threads: u32, smem: usize) -> Result<usize> {
        let f = self.func(name)?;
        let key = (f.cu_function() as usize, smem);
        if let Some(b) = OCCUPANCY.with(|c| c.borrow().get(&key).copied()) {
            return Ok(b);
        }
        self.ctx.bind_to_thread()?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
        let b = (f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)? as usize).max(1);
        OCCUPANCY.with(|c| c.borrow_mut().insert(key, b));
        Ok(b)
    }

    fn grid1(&self, n: u64) -> u32 {
        (n.div_ceil(256)).clamp(1, (self.sm_count * 16) as u64) as u32
    }

    /// A grid-stride kernel over `total` elements: 256 threads, at most 16 blocks per SM.
    ///
    /// # Safety
    /// As [`Gpu::launch`].
    unsafe fn launch_flat(&self, name: &'static str, total: usize, args: &[Arg]) -> Result<()> {
        self.launch(name, (self.grid1(total as u64), 1, 1), 256, 0, args)
    }

    /// One block of `block` threads per row.
    ///
    /// # Safety
    /// As [`Gpu::launch`].
    unsafe fn launch_rows(&self, name: &'static str, rows: usize, block: u32, args: &[Arg]) -> Result<()> {
        self.launch(name, (rows as u32, 1, 1), block, 0, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_levels_pick_their_kernels() {
        assert!(Pdl::All.takes("ggp32_64_6_silu") && !Pdl::Light.takes("ggp32_64_6_silu"));
        assert!(Pdl::Light.takes("gemv_bf16_r1") && !Pdl::Off.takes("gemv_bf16_r1"));
        assert!(!Pdl::All.takes("sample_rows"));
        assert!(Pdl::Light.takes("qgp8_awq_256_64_4_f32") && Pdl::Light.takes("qgp_fp8_64_128_4_silu"));
        assert!(!Pdl::Light.takes("qgemm_reduce_") && !Pdl::Light.takes("qgp"), "names match whole");
    }

    #[test]
    fn pdl_kernels_are_loaded_and_wait() {
        for k in pdl_kernels() {
            let (name, files, _) = crate::MODULES
                .iter()
                .find(|(_, _, fns)| fns.contains(&k))
                .unwrap_or_else(|| panic!("{k} is in no module"));
            let src = crate::sources::Replacements::default().module(files).text;
            // pdl_enter (common.cuh) waits and lets the next one launch; qg_persistent waits
            // (pdl_wait) once its first weights are on their way and lets the next one launch last.
            assert!(
                src.contains("pdl_enter();") || src.contains("pdl_wait();"),
                "{name}.cu never waits for the kernel before"
            );
            assert!(Pdl::All.takes(k));
        }
    }

    #[test]
    fn tile_bound_covers_worst_case() {
        // every expert with one row over: ceil(A/bm) + E bounds sum_e ceil(c_e/bm)
        let (a, e, bm) = (100usize, 8usize, 16usize);
        let counts = [13usize, 13, 13, 13, 12, 12, 12, 12];
        let tiles: usize = counts.iter().map(|c| c.div_ceil(bm)).sum();
        assert!(tiles <= Gpu::moe_max_tiles(a, e, bm));
    }
}
