//! CUDA kernels for cleave: CUDA C sources (`src/cu/*.cu`, embedded with `include_str!`) compiled
//! with NVRTC for the device's architecture (`sm_90a` on H100/H200) at first use and cached on
//! disk, typed launchers over raw device pointers, cuBLAS GEMMs and an NCCL KV transport. For
//! kernel experiments, `$CLEAVE_KERNEL_SOURCES` names files that replace embedded ones ([`sources`]).
//!
//! Everything is opened with dlopen at run time (cudarc `dynamic-loading`), so this crate builds
//! and its non-GPU tests run on machines without CUDA; [`probe`] says whether a GPU is usable.

pub mod blas;
pub mod blaslt;
pub mod compile;
pub mod fp8;
mod gpu;
pub mod graph;
pub mod nccl;
pub mod ops;
pub mod peer;
pub mod quant;
pub mod sources;

pub use cudarc;
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext};
pub use gpu::{ptr, Arg, Gpu, ModuleReport};

/// One embedded CUDA source file: its name under `src/cu/` and its text.
pub type CuFile = (&'static str, &'static str);
macro_rules! cu {
    ($f:literal) => {
        ($f, include_str!(concat!("cu/", $f)))
    };
}
/// The header every module starts with.
pub(crate) const COMMON: CuFile = cu!("common.cuh");
/// The dynamic shared memory [`Gpu::new`] lets the kernels that need more than 48 KB take (at most
/// the device's opt-in limit: [`Gpu::dyn_smem_limit`]), but those of [`FULL_SMEM_KERNELS`].
pub const DYN_SMEM_MAX: usize = 200 * 1024;
/// Kernels granted the device's whole opt-in shared memory (227 KB on Hopper): one block an SM.
pub const FULL_SMEM_KERNELS: &[&str] = &[ops::MLA4_KERNEL];

/// The dynamic shared memory kernel `name` may take on a device whose opt-in limit is `optin`.
pub(crate) fn smem_limit(optin: usize, name: &str) -> usize {
    if FULL_SMEM_KERNELS.contains(&name) {
        optin
    } else {
        optin.min(DYN_SMEM_MAX)
    }
}
/// Kernel modules: name, source files (after `common.cuh`, in this order), functions.
pub const MODULES: &[(&str, &[CuFile], &[&str])] = &[
    (
        "elementwise",
        &[cu!("elementwise.cu")],
        &[
            "embedding_f32",
            "rms_norm_f32",
            "silu_mul_f32",
            "add_f32",
            "gather_rows_f32",
            "rope_f32",
            "write_kv_bf16",
            "kv_export_f32",
            "kv_import_f32",
            "cast_f32_bf16",
            "cast_bf16_f32",
            "convert_weight",
            "fill_uniform_bf16",
            "write_kv_f32",
            "kv_gather_f32",
            "kv_scatter_f32",
            "mla_prologue_bf16",
            "mla_prologue_f32",
            "moe_combine_norm",
        ],
    ),
    (
        "attention",
        &[cu!("attention.cu")],
        &[
            "mla_decode",
            "mla_decode2",
            "mla_decode2_dsv",
            "mla_combine8",
            "mla_combine16",
            "mla_combine",
            "mla_ref_f32",
        ],
    ),
    ("mla_decode", &[cu!("wgmma.cuh"), cu!("mla_decode.cu"), cu!("mla_decode4.cu")], ops::MLA_DECODE_KERNELS),
    ("prefill", &[cu!("prefill.cu")], &["gather_latent", ops::PREFILL_FLASH[0], ops::PREFILL_FLASH[1]]),
    ("sample", &[cu!("sample.cu")], &["sample_rows"]),
    ("gemv", &[cu!("gemv.cu")], ops::GEMV_KERNELS),
    ("quant", &[cu!("quant.cu")], ops::QUANT_KERNELS),
    ("qdecode", &[cu!("wgmma.cuh"), cu!("qdecode.cu")], ops::QDECODE_KERNELS),
    ("wgmma", &[cu!("wgmma.cuh"), cu!("wgmma.cu")], ops::GGW_KERNELS),
    ("peer", &[cu!("peer.cu")], &["peer_all_reduce_f32"]),
    ("routing", &[cu!("routing.cu")], &["moe_route", "moe_align", "moe_route_align", "moe_combine"]),
    (
        "moe",
        &[cu!("moe.cu")],
        &[
            "gg16_f32",
            "gg16_silu",
            "gg64_f32",
            "gg64_silu",
            "moe_f32_gateup",
            "moe_f32_down",
            "gg16_f32_v2",
            "gg16_silu_v2",
            "gg64_f32_v2",
            "gg64_silu_v2",
            "ggp16_32_8_f32",
            "ggp16_32_8_silu",
            "ggp16_64_4_f32",
            "ggp16_64_4_silu",
            "ggp16_64_8_f32",
            "ggp16_64_8_silu",
            "ggp32_32_4_f32",
            "ggp32_32_4_silu",
            "ggp32_32_8_f32",
            "ggp32_32_8_silu",
            "ggp32_64_4_f32",
            "ggp32_64_4_silu",
            "ggp32_64_6_f32",
            "ggp32_64_6_silu",
            "ggp64_32_4_f32",
            "ggp64_32_4_silu",
            "ggp64_32_6_f32",
            "ggp64_32_6_silu",
            "ggp64_32_8_f32",
            "ggp64_32_8_silu",
            "ggpr32_32_64_4_f32",
            "ggpr32_32_64_4_silu",
            "ggpr32_32_64_5_f32",
            "ggpr32_32_64_5_silu",
            "ggpr32_64_32_6_f32",
            "ggpr32_64_32_6_silu",
            "ggpr32_64_64_3_f32",
            "ggpr32_64_64_3_silu",
        ],
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("no usable CUDA GPU: {0}")]
    NoGpu(String),
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    #[error("CUDA driver: {0:?}")]
    Driver(#[from] drv::DriverError),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("NCCL: {0}")]
    Nccl(String),
    /// A collective or transfer did not complete by its deadline (the communicator was aborted).
    #[error("NCCL: {0}")]
    Timeout(String),
    #[error("{0}")]
    Invalid(String),
    /// This GPU or library version has no kernel for the operation (the caller may fall back).
    #[error("not supported here: {0}")]
    Unsupported(String),
    /// A call that cannot be part of a CUDA graph was made while one was being captured, or the
    /// capture failed.
    #[error("CUDA graph capture: {0}")]
    Capture(String),
}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Whether a CUDA GPU can be used here: `Ok(device count)` or why not. Never panics, also when
/// the driver or the CUDA libraries are missing.
pub fn probe() -> std::result::Result<usize, String> {
    if !unsafe { drv_sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) is not installed".into());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("libnvrtc is not on the library path (set LD_LIBRARY_PATH=/usr/local/cuda/lib64)".into());
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err("libcublas is not on the library path (set LD_LIBRARY_PATH=/usr/local/cuda/lib64)".into());
    }
    drv::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("no CUDA device".into()),
        Err(e) => Err(format!("no CUDA device: {e:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        // On CI machines there is no driver: probe must say so instead of panicking.
        match probe() {
            Ok(n) => assert!(n > 0),
            Err(msg) => assert!(!msg.is_empty()),
        }
    }

    /// Functions of this crate that take a `u64` (by convention a raw device address) and are
    /// safe, because they never write through it.
    const SAFE_OVER_ADDRESSES: &[&str] = &[
        "absorb_check", // checks a weight's alignment
        "grid1",        // a count, not an address
        "dense",        // builds a launch description (QGemm) for an unsafe launcher
    ];

    /// Every function over raw device addresses is an `unsafe fn` (the crate's rule: a launcher
    /// cannot see the allocations behind its addresses), but those of [`SAFE_OVER_ADDRESSES`].
    #[test]
    fn functions_over_device_addresses_are_unsafe() {
        fn sources(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).expect("source dir") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    sources(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push((p.display().to_string(), std::fs::read_to_string(&p).expect("source")));
                }
            }
        }
        let mut files = Vec::new();
        sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        let mut safe = Vec::new();
        for (path, src) in &files {
            for (at, _) in src.match_indices("fn ") {
                let rest = &src[at + 3..];
                let Some(open) = rest.find('(') else { continue };
                let name = &rest[..open];
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    continue;
                }
                let (mut depth, mut end) = (1, open + 1);
                for (i, c) in rest[open + 1..].char_indices() {
                    depth += (c == '(') as i32 - (c == ')') as i32;
                    if depth == 0 {
                        end = open + 1 + i;
                        break;
                    }
                }
                let params = &rest[open + 1..end];
                let over_u64 = params.split(',').any(|p| p.split(':').nth(1).is_some_and(|t| t.trim() == "u64"));
                if over_u64 && !src[..at].ends_with("unsafe ") && !SAFE_OVER_ADDRESSES.contains(&name) {
                    safe.push(format!("{path}: {name}"));
                }
            }
        }
        assert!(files.len() > 10 && safe.is_empty(), "safe functions over device addresses: {safe:?}");
    }

    #[test]
    fn every_module_defines_its_kernels() {
        for (name, files, fns) in MODULES {
            let src = sources::Replacements::default().module(files).text;
            for f in *fns {
                assert!(src.contains(&format!(" {f}(")), "{name}.cu lacks kernel {f}");
            }
            // And every kernel the source defines is listed (loaded), the other way round.
            for part in src.split("extern \"C\" __global__ void ").skip(1) {
                let part = match part.strip_prefix("__launch_bounds__(") {
                    Some(rest) => rest.split_once(") ").expect("launch bounds").1,
                    None => part,
                };
                let kernel = part.split('(').next().expect("kernel name").trim();
                assert!(fns.contains(&kernel), "{name}.cu defines {kernel}, which MODULES does not list");
            }
        }
    }

    /// Each `mla_combine` instance the launcher picks holds the split count it is listed with
    /// (the source's template argument), smallest first.
    #[test]
    fn mla_combine_instances_hold_their_listed_splits() {
        let src = include_str!("cu/attention.cu");
        assert_eq!(ops::MLA_COMBINE_KERNELS.len(), ops::MLA_COMBINE_SPLITS.len());
        for (k, bound) in ops::MLA_COMBINE_KERNELS.iter().zip(ops::MLA_COMBINE_SPLITS) {
            let def = format!(" {k}(COMBINE_ARGS) {{ mla_combine_t<{bound}>(COMBINE_PASS); }}");
            assert!(src.contains(&def), "attention.cu: {k} is not `{def}`");
        }
        assert!(ops::MLA_COMBINE_SPLITS.windows(2).all(|w| w[0] < w[1]));
    }
}
