//! NVRTC compilation to a CUBIN for the device's own architecture (`sm_90a` on Hopper), cached on
//! disk under a key made of the source, the options, the GPU and the NVRTC version.

use std::ffi::{CStr, CString};
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::KernelError;

/// FNV-1a, 64 bits: stable across builds, unlike `DefaultHasher`.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// `$CLEAVE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/cleave/kernels`, else `~/.cache/cleave/kernels`,
/// else a directory under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CLEAVE_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("cleave/kernels");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache/cleave/kernels");
    }
    std::env::temp_dir().join("cleave-kernels")
}

/// The NVRTC version as `major.minor`.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    let (mut a, mut b) = (0, 0);
    unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(|e| KernelError::Compile(format!("nvrtcVersion: {e}")))?;
    Ok((a, b))
}

/// Outcome of [`compile_cached`]: the CUBIN and whether it came from the disk cache.
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub cached: bool,
    pub seconds: f64,
}

/// Compiles `src` for `arch` (e.g. `sm_90a`), or reads the cached CUBIN.
pub fn compile_cached(name: &str, src: &str, arch: &str, gpu_key: &str) -> Result<Compiled, KernelError> {
    let (maj, min) = nvrtc_version()?;
    let options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string()];
    let ver = format!("{maj}.{min}");
    let key = fnv1a(&[src.as_bytes(), options.join(" ").as_bytes(), gpu_key.as_bytes(), ver.as_bytes()]);
    let dir = cache_dir();
    let path = dir.join(format!("{name}-{key:016x}.cubin"));
    let t0 = std::time::Instant::now();
    if let Ok(cubin) = std::fs::read(&path) {
        if !cubin.is_empty() {
            return Ok(Compiled { cubin, cached: true, seconds: t0.elapsed().as_secs_f64() });
        }
    }
    let cubin = compile(name, src, &options)?;
    // A cache that cannot be written only costs a recompile next time.
    if std::fs::create_dir_all(&dir).is_ok() {
        let tmp = dir.join(format!(".{name}-{key:016x}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(Compiled { cubin, cached: false, seconds: t0.elapsed().as_secs_f64() })
}

/// Compiles without caching and returns the CUBIN and ptxas' resource report (registers, shared
/// memory, spills) for every kernel. Needs only libnvrtc, no GPU.
pub fn resource_report(name: &str, src: &str, arch: &str) -> Result<(Vec<u8>, String), KernelError> {
    let options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    compile_with_log(name, src, &options)
}

fn compile(name: &str, src: &str, options: &[String]) -> Result<Vec<u8>, KernelError> {
    compile_with_log(name, src, options).map(|(c, _)| c)
}

fn compile_with_log(name: &str, src: &str, options: &[String]) -> Result<(Vec<u8>, String), KernelError> {
    let csrc = CString::new(src).map_err(|_| KernelError::Compile(format!("{name}: source has a NUL byte")))?;
    let cname = CString::new(format!("{name}.cu")).expect("no NUL in name");
    let prog = nvrtc::create_program(&csrc, Some(&cname)).map_err(|e| KernelError::Compile(format!("{name}: {e}")))?;
    let res = unsafe { nvrtc::compile_program(prog, options) };
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(|l| unsafe { CStr::from_ptr(l.as_ptr()) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Err(e) = res {
        let _ = unsafe { nvrtc::destroy_program(prog) };
        return Err(KernelError::Compile(format!("{name}.cu ({e}) with {options:?}:\n{log}")));
    }
    let mut size = 0usize;
    let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }.result();
    let mut cubin = vec![0u8; size];
    let r = r.and_then(|_| unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _) }.result());
    let _ = unsafe { nvrtc::destroy_program(prog) };
    r.map_err(|e| KernelError::Compile(format!("{name}: nvrtcGetCUBIN: {e}")))?;
    Ok((cubin, log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[]), 0xcbf29ce484222325);
    }

    /// Kernels allowed to spill (by name, or by prefix where a name ends in `_`), and why. Spills
    /// measured at NVRTC 12.9 and 13.0 (the GPU machines' version); any other kernel that spills
    /// fails the test.
    const SPILLS_ALLOWED: &[(&str, &str)] = &[
        (
            "mla_decode3_h64",
            "36 bytes (512 threads cap it at 128 registers): a few refills per 32-key tile against \
             ~1,000 instructions; the fastest MLA decode at 128 heads (kernels/NOTES.md, run 33)",
        ),
        (
            "mla_decode3_h32",
            "28 bytes (two blocks of 256 threads an SM: 128 registers): one block's softmax under \
             the other's MMAs took 256 x 2,048 from 324 to 269 us (kernels/NOTES.md, run 105)",
        ),
        ("sample_rows", "8 bytes at 32 registers: one launch a step, its time the passes over the vocabulary"),
        (
            "qg64_awq_",
            "16 bytes (two blocks of 256 threads an SM: 128 registers): the tiled AWQ GEMM, a \
             reference and fallback beside the persistent one",
        ),
        (
            "ggw_fp8_",
            "12 bytes stored, 52 loaded: the warp-specialized FP8 prefill GEMM's producer warpgroup \
             at 64 registers (setmaxnreg), its 32-bit offsets keeping it near that (kernels/NOTES.md, \
             run 76)",
        ),
        ("ggw_fp8c_", "as ggw_fp8_ (the same GEMM with per-column weight scales)"),
    ];

    /// Whether `kernel` is in [`SPILLS_ALLOWED`].
    fn spill_allowed(kernel: &str) -> bool {
        SPILLS_ALLOWED.iter().any(|(k, _)| if k.ends_with('_') { kernel.starts_with(k) } else { kernel == *k })
    }

    /// The kernels of a ptxas `-v` log that spill registers.
    fn spilling(log: &str) -> Vec<String> {
        let mut func = String::new();
        let mut out = Vec::new();
        for line in log.lines() {
            if let Some(rest) = line.split("Function properties for ").nth(1) {
                func = rest.trim().to_string();
            } else if line.contains("spill stores") && !line.contains(" 0 bytes spill stores") {
                out.push(func.clone());
            }
        }
        out
    }

    /// Compiles every module for sm_90a when libnvrtc can be opened (no GPU needed), so that
    /// syntax and PTX errors, spills and serialized wgmmas surface before a GPU run; skipped
    /// otherwise. With `CLEAVE_CUBIN_DIR` set, each module's CUBIN is written there as
    /// `NAME.cubin`, for reading its SASS offline (`nvdisasm -c`, kernels/NOTES.md); with
    /// `CLEAVE_KERNEL_SOURCES` set, a variant's files are compiled in place of the embedded ones.
    #[test]
    fn modules_compile_for_hopper() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc is not on the library path");
            return;
        }
        let replacements = crate::sources::Replacements::from_env().unwrap_or_else(|e| panic!("{e}"));
        for (name, files, _) in crate::MODULES {
            let src = replacements.module(files);
            let (cubin, log) = resource_report(name, &src.text, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
            eprintln!("== {name}.cu{}: {} bytes of CUBIN\n{log}", replaced_note(&src.replaced), cubin.len());
            assert!(!cubin.is_empty());
            if let Some(dir) = std::env::var_os("CLEAVE_CUBIN_DIR") {
                let path = std::path::Path::new(&dir).join(format!("{name}.cubin"));
                std::fs::write(&path, &cubin).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            let spills: Vec<String> = spilling(&log).into_iter().filter(|f| !spill_allowed(f)).collect();
            assert!(spills.is_empty(), "{name}.cu: {spills:?} spill registers:\n{log}");
            // ptxas C7510/C7520: every wgmma of a kernel waits for the one before it (MLA decode
            // v4 lost its overlap so to a spin-wait between wgmmas: kernels/NOTES.md "MLA decode v4").
            let serialized: Vec<&str> =
                log.lines().filter(|l| l.contains("wgmma.mma_async instructions are serialized")).collect();
            assert!(serialized.is_empty(), "{name}.cu: {serialized:?}")
        }
    }

    fn replaced_note(files: &[&str]) -> String {
        if files.is_empty() {
            String::new()
        } else {
            format!(" (with {} from $CLEAVE_KERNEL_SOURCES)", files.join(", "))
        }
    }

    #[test]
    fn spill_report_names_the_kernel() {
        let log = "ptxas info    : Function properties for a\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Function properties for b\n    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n";
        assert_eq!(spilling(log), vec!["b".to_string()]);
    }
}
