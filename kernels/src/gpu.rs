//! [`Gpu`]: one device's context, stream, cuBLAS handle and loaded kernel modules, with the
//! launch, copy, allocation and profiling calls every launcher goes through.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::nvrtc::Ptx;

use crate::{blaslt, compile, ops, probe, smem_limit, sources, KernelError, Result, DYN_SMEM_MAX, MODULES};

/// How one module was obtained at start-up.
#[derive(Debug, Clone)]
pub struct ModuleReport {
    pub name: String,
    pub cached: bool,
    pub seconds: f64,
    /// The files of the module that `$CLEAVE_KERNEL_SOURCES` replaced, with its directory.
    pub replaced: Option<(PathBuf, Vec<&'static str>)>,
}

/// One profiled launch or GEMM: its name and the events before and after it.
type ProfEvents = (&'static str, CudaEvent, CudaEvent);

/// One GPU, its stream, cuBLAS handle and loaded kernels. Created on, and used from, the thread
/// that owns the device.
pub struct Gpu {
    /// cuBLASLt, for the block-scaled FP8 GEMM (created at first use; first field, so that it is
    /// destroyed while the context still lives).
    pub(crate) lt: std::cell::OnceCell<blaslt::LtHandle>,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub(crate) blas: cudarc::cublas::CudaBlas,
    /// cuBLAS's workspace (see [`crate::graph`]); after `blas`, so that it outlives the handle.
    pub(crate) blas_ws: RefCell<Option<CudaSlice<u8>>>,
    /// A graph capture is open on the stream ([`Gpu::capture`]).
    pub(crate) capturing: Cell<bool>,
    funcs: HashMap<&'static str, CudaFunction>,
    _modules: Vec<Arc<CudaModule>>,
    pub sm_count: usize,
    pub name: String,
    pub arch: String,
    /// Hopper's warpgroup MMA is there (compute capability 9.0, compiled for `sm_90a`).
    pub(crate) wgmma: bool,
    pub modules: Vec<ModuleReport>,
    pub max_smem_optin: usize,
    /// When on, every launch and GEMM is bracketed by events (see [`Gpu::profile_start`]).
    prof: RefCell<Option<Vec<ProfEvents>>>,
    /// A second stream for KV transfers (created on first use), so that a receive in flight
    /// never holds up the compute stream.
    xfer: RefCell<Option<Arc<CudaStream>>>,
    /// Device allocations made through [`Gpu::alloc`] so far.
    allocs: Cell<u64>,
    /// Which kernels are launched with programmatic dependent launch.
    pdl: Cell<ops::Pdl>,
    /// The persistent compressed GEMMs' stream-K hand-over buffers (allocated at start-up, so
    /// that graphs capture fixed addresses).
    pub(crate) streamk: std::cell::OnceCell<ops::StreamK>,
    /// The word of the kernels' grid barrier (common.cuh `grid_barrier`), zeroed at start-up.
    barrier: CudaSlice<u32>,
}

impl Gpu {
    /// Opens device `ordinal`: context, one non-blocking stream (no cross-stream event tracking),
    /// cuBLAS, and every kernel module (compiled or read from the cache).
    pub fn new(ordinal: usize) -> Result<Gpu> {
        probe().map_err(KernelError::NoGpu)?;
        let ctx = CudaContext::new(ordinal)?;
        // One stream per device: ordering is the stream's, so cudarc's per-buffer events are
        // pure overhead.
        // SAFETY: no stream or buffer of this context exists yet, so none relies on the events.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (maj, min) = ctx.compute_capability()?;
        let wgmma = (maj, min) == (9, 0);
        let arch = if wgmma { "sm_90a".to_string() } else { format!("sm_{maj}{min}") };
        if maj < 8 {
            return Err(KernelError::NoGpu(format!(
                "compute capability {maj}.{min}: cleave's kernels need 8.0 or newer"
            )));
        }
        let name = ctx.name()?;
        let sm_count = ctx.attribute(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem_optin =
            ctx.attribute(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        keep_pool_memory(&ctx)?;
        let blas = cudarc::cublas::CudaBlas::new(stream.clone()).map_err(|e| KernelError::Blas(format!("{e:?}")))?;
        let gpu_key = format!("{name} cc{maj}.{min}");
        let mut funcs = HashMap::new();
        let mut modules = Vec::new();
        let mut reports = Vec::new();
        let replacements = sources::Replacements::from_env()?;
        for (mname, files, fnames) in MODULES {
            let src = replacements.module(files);
            let c = compile::compile_cached(mname, &src.text, &arch, &gpu_key)?;
            let replaced =
                replacements.dir().filter(|_| !src.replaced.is_empty()).map(|d| (d.to_path_buf(), src.replaced));
            reports.push(ModuleReport { name: mname.to_string(), cached: c.cached, seconds: c.seconds, replaced });
            let m = ctx.load_module(Ptx::from_binary(c.cubin))?;
            for f in *fnames {
                funcs.insert(*f, m.load_function(f)?);
            }
            modules.push(m);
        }
        let qgemm = ops::QUANT_KERNELS.iter().chain(ops::QDECODE_KERNELS).copied().filter(|k| k.starts_with("qg"));
        let mla = ["mla_decode", "mla_decode2", "mla_decode2_dsv"].iter().chain(ops::MLA_DECODE_KERNELS).copied();
        let prefill = ops::PREFILL_FLASH.into_iter();
        let opt_in = mla.chain(qgemm).chain(ops::GGW_KERNELS.iter().copied()).chain(prefill);
        for name in opt_in {
            let f = funcs.get(name).ok_or_else(|| KernelError::Invalid(format!("kernel {name} is not loaded")))?;
            let smem = smem_limit(max_smem_optin, name) as i32;
            f.set_attribute(drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)?;
            // All of the unified L1/shared memory as shared, so that two blocks fit per SM.
            f.set_attribute(drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
        }
        let gpu = Gpu {
            lt: std::cell::OnceCell::new(),
            ctx,
            blas,
            blas_ws: RefCell::new(None),
            capturing: Cell::new(false),
            funcs,
            _modules: modules,
            sm_count,
            name,
            arch,
            wgmma,
            modules: reports,
            max_smem_optin,
            prof: RefCell::new(None),
            xfer: RefCell::new(None),
            allocs: Cell::new(0),
            pdl: Cell::new(ops::Pdl::Off),
            streamk: std::cell::OnceCell::new(),
            barrier: stream.alloc_zeros::<u32>(1)?,
            stream,
        };
        gpu.set_blas_workspace()?;
        let _ = gpu.streamk.set(gpu.streamk_workspace()?);
        Ok(gpu)
    }

    /// The address of the grid barrier's word (set at start-up, so that graphs capture it).
    pub(crate) fn grid_barrier_word(&self) -> u64 {
        ptr(&self.barrier)
    }

    /// The dynamic shared memory a kernel of the opt-in list may take on this device.
    pub fn dyn_smem_limit(&self) -> usize {
        self.max_smem_optin.min(DYN_SMEM_MAX)
    }

    /// The dynamic shared memory kernel `name` may take on this device ([`crate::FULL_SMEM_KERNELS`]
    /// the whole opt-in, the others [`Gpu::dyn_smem_limit`]).
    pub fn smem_limit(&self, name: &str) -> usize {
        smem_limit(self.max_smem_optin, name)
    }

    /// Which of the kernels that support it ([`ops::pdl_kernels`]) are launched with programmatic
    /// dependent launch (each may start while the kernel before it finishes).
    pub fn set_pdl(&self, pdl: ops::Pdl) {
        self.pdl.set(pdl);
    }

    pub(crate) fn func(&self, name: &'static str) -> Result<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| KernelError::Invalid(format!("kernel {name} is not loaded")))
    }

    /// Launches `name` on the stream, with programmatic dependent launch where [`Gpu::set_pdl`]'s
    /// level takes it. `args` are the kernel's parameters in order, each as the little-endian bits
    /// of a pointer (`u64`), `int`/`unsigned` or `float`.
    ///
    /// # Safety
    /// `args` match the kernel's parameters in number and type, and every address among them is
    /// a device allocation of this context holding what the kernel reads or writes there.
    pub(crate) unsafe fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let f = self.func(name)?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        self.ctx.bind_to_thread()?;
        let t = self.prof_mark()?;
        if self.pdl.get().takes(name) {
            // SAFETY: zeroed is a valid value of this plain C union/struct; the attribute lives
            // until the call returns.
            let mut attr: drv_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = drv_sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `params` holds one pointer per kernel parameter, in order (as for
            // cuLaunchKernel); the kernel opens with pdl_wait (ops::pdl_kernels).
            unsafe { drv_sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()?;
        } else {
            // SAFETY: as above, one pointer per kernel parameter in order; a plain stream-ordered
            // launch.
            unsafe {
                drv::launch_kernel(f.cu_function(), grid, (block, 1, 1), smem, self.stream.cu_stream(), &mut params)
            }?;
        }
        self.prof_end(name, t)
    }

    pub(crate) fn prof_mark(&self) -> Result<Option<CudaEvent>> {
        if self.prof.borrow().is_none() {
            return Ok(None);
        }
        Ok(Some(self.record()?))
    }

    pub(crate) fn prof_end(&self, name: &'static str, start: Option<CudaEvent>) -> Result<()> {
        if let Some(a) = start {
            let b = self.record()?;
            if let Some(v) = self.prof.borrow_mut().as_mut() {
                v.push((name, a, b));
            }
        }
        Ok(())
    }

    /// Starts timing every kernel and GEMM with events (adds overhead; for breakdowns only).
    ///
    /// It also opens the driver's profiler range (`cuProfilerStart`), so that `ncu
    /// --profile-from-start off` measures exactly the kernels of a profiled step.
    pub fn profile_start(&self) {
        *self.prof.borrow_mut() = Some(Vec::new());
        // SAFETY: takes no arguments; without a profiler attached it does nothing.
        // Its status is of no use: the range is only a marker for an attached profiler.
        let _ = unsafe { drv_sys::cuProfilerStart() };
    }

    /// Stops timing; returns (name, total ms, launches), largest first.
    pub fn profile_stop(&self) -> Result<Vec<(String, f64, usize)>> {
        self.sync()?;
        // SAFETY: as cuProfilerStart.
        let _ = unsafe { drv_sys::cuProfilerStop() };
        let v = self.prof.borrow_mut().take().unwrap_or_default();
        let mut by: HashMap<&str, (f64, usize)> = HashMap::new();
        for (n, a, b) in &v {
            let e = by.entry(n).or_default();
            e.0 += a.elapsed_ms(b)? as f64;
            e.1 += 1;
        }
        let mut out: Vec<(String, f64, usize)> = by.into_iter().map(|(n, (t, c))| (n.to_string(), t, c)).collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(out)
    }

    /// The transfer stream, ordered after everything queued on the compute stream so far.
    pub fn xfer_stream(&self) -> Result<Arc<CudaStream>> {
        let mut x = self.xfer.borrow_mut();
        if x.is_none() {
            *x = Some(self.ctx.new_stream()?);
        }
        let s = x.as_ref().expect("created").clone();
        s.join(&self.stream)?;
        Ok(s)
    }

    /// Waits for all queued work; surfaces asynchronous kernel faults.
    pub fn sync(&self) -> Result<()> {
        self.no_capture("synchronize")?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// `n` uninitialized elements (at least one, so that empty tensors have an address).
    /// Counted in [`Gpu::device_allocs`].
    pub fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.no_capture("allocate device memory")?;
        // SAFETY: `T: DeviceRepr` is plain data and the memory is device memory, never read as
        // Rust values in place: its bytes reach the host only through `dtoh`, whose contract asks
        // for valid `T`s there (any bytes, for the plain numbers it is used with).
        let s = unsafe { self.stream.alloc::<T>(n.max(1)) }?;
        self.allocs.set(self.allocs.get() + 1);
        Ok(s)
    }

    /// How many device allocations [`Gpu::alloc`] has made (a decode step in steady state makes
    /// none: the engine's buffers come from its workspace).
    pub fn device_allocs(&self) -> u64 {
        self.allocs.get()
    }

    /// Fills `bytes` bytes at `ptr` with `value`.
    ///
    /// # Safety
    /// `ptr` holds `bytes` bytes: a device address of this context.
    pub unsafe fn memset(&self, ptr: u64, value: u8, bytes: usize) -> Result<()> {
        if bytes > 0 {
            // SAFETY: the caller's contract (# Safety above): `bytes` bytes at `ptr` of this context.
            unsafe { drv::memset_d8_async(ptr, value, bytes, self.stream.cu_stream()) }?;
        }
        Ok(())
    }

    /// Host -> device copy of raw values to `ptr` (ordered on the stream).
    ///
    /// # Safety
    /// `ptr` holds `src.len()` values of `T`: a device address of this context. `src` is pageable
    /// host memory (not a pinned buffer, which the copy would read after this returns).
    pub unsafe fn htod<T>(&self, src: &[T], ptr: u64) -> Result<()> {
        self.no_capture("copy from the host")?;
        if !src.is_empty() {
            self.ctx.bind_to_thread()?;
            // SAFETY: `ptr` holds `src.len()` values (the caller's contract). `src` is pageable
            // (the contract again), and from pageable memory the driver has staged the bytes
            // before the call returns (CUDA's documented behaviour), so `src` may go after it.
            unsafe { drv::memcpy_htod_async(ptr, src, self.stream.cu_stream()) }?;
        }
        Ok(())
    }

    /// Device -> host copy into `dst`, then waits for it.
    ///
    /// # Safety
    /// `ptr` holds `dst.len()` values of `T`, each a valid `T` (plain numbers: every bit pattern is one):
    /// a device address of this context.
    pub unsafe fn dtoh<T>(&self, ptr: u64, dst: &mut [T]) -> Result<()> {
        self.no_capture("copy to the host")?;
        if !dst.is_empty() {
            self.ctx.bind_to_thread()?;
            // SAFETY: `ptr` holds `dst.len()` valid values of `T` (the caller's contract), and
            // `dst` stays borrowed until the `sync` below has waited for the copy.
            unsafe { drv::memcpy_dtoh_async(dst, ptr, self.stream.cu_stream()) }?;
        }
        self.sync()
    }

    /// Device -> device copy.
    ///
    /// # Safety
    /// `dst` and `src` each hold `bytes` bytes, not overlapping: device addresses of this context.
    pub unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes > 0 {
            // SAFETY: `dst` and `src` each hold `bytes` bytes and do not overlap (the caller's
            // contract).
            unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }?;
        }
        Ok(())
    }

    /// A CUDA event recorded now on the stream (for timing).
    pub fn record(&self) -> Result<cudarc::driver::CudaEvent> {
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(self.stream.record_event(flags)?)
    }
}

/// The device address of a buffer.
pub fn ptr<T>(s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(s.stream());
    p
}

/// Keeps freed stream-ordered allocations in the device's pool instead of returning them to the
/// driver at every synchronization, so that steady-state steps do not call into the allocator.
fn keep_pool_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    let mut pool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and the device is this live context's.
    unsafe { drv_sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold attribute takes a pointer to a u64, which lives across the call.
    unsafe {
        drv_sys::cuMemPoolSetAttribute(
            pool,
            drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut c_void,
        )
    }
    .result()?;
    Ok(())
}

/// One kernel parameter.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U64(u64),
    F32(f32),
}

impl Arg {
    fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::I32(i) => i as u32 as u64,
            Arg::F32(f) => f.to_bits() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_little_endian_bits() {
        assert_eq!(Arg::I32(-1).bits(), 0xffff_ffff);
        assert_eq!(Arg::F32(1.0).bits(), 0x3f80_0000);
        assert_eq!(Arg::Ptr(0x1234).bits(), 0x1234);
    }
}
