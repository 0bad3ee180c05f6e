//! CUDA graphs: the work a closure enqueues on the compute stream, captured once and replayed
//! with one launch. A replay runs the captured kernels with the arguments they were captured
//! with, so everything a captured step reads must sit at the addresses it had during capture;
//! the caller rewrites those buffers' contents between replays (outside the graph).
//!
//! While a capture is open, the calls that cannot be captured (host copies, allocations,
//! synchronizations) fail with [`KernelError::Capture`] instead of invalidating the capture.

use cudarc::driver::{sys as drv_sys, CudaGraph};

use crate::{Gpu, KernelError, Result};

/// cuBLAS's workspace, set once so that a captured GEMM never allocates (NVIDIA's size for Hopper).
pub(crate) const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A captured sequence of the compute stream's work, instantiated and ready to launch. Lives on
/// the thread of the [`Gpu`] that captured it, like the stream it replays on.
pub struct Graph {
    exec: CudaGraph,
    nodes: usize,
}

impl Graph {
    /// Kernels, copies and GEMM launches in the graph.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

impl Gpu {
    /// Captures what `f` enqueues on the compute stream. The capture is closed whether or not `f`
    /// succeeds; an error from `f` or from the capture itself is returned and no graph is kept.
    pub fn capture<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(Graph, T)> {
        self.ctx.bind_to_thread()?;
        // Thread-local mode: this thread may make no call the driver cannot capture; other ranks'
        // threads are unaffected.
        self.stream.begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        self.capturing.set(true);
        let out = f();
        self.capturing.set(false);
        let flags = drv_sys::CUgraphInstantiate_flags(0);
        let ended = self.stream.end_capture(flags);
        let value = out?;
        let exec = ended?.ok_or_else(|| KernelError::Capture("the capture recorded no work".into()))?;
        let mut nodes = 0usize;
        // SAFETY: the graph is alive (owned by `exec`); a null node array asks for the count only.
        unsafe { drv_sys::cuGraphGetNodes(exec.cu_graph(), std::ptr::null_mut(), &mut nodes) }.result()?;
        Ok((Graph { exec, nodes }, value))
    }

    /// Enqueues one replay of `g` on the compute stream.
    pub fn replay(&self, g: &Graph) -> Result<()> {
        self.no_capture("replay a graph")?;
        let t = self.prof_mark()?;
        g.exec.launch()?;
        self.prof_end("graph replay", t)
    }

    /// Whether a capture is open on this thread's stream.
    pub fn capturing(&self) -> bool {
        self.capturing.get()
    }

    /// Fails with a clear error when `what` is attempted inside a capture.
    pub(crate) fn no_capture(&self, what: &str) -> Result<()> {
        if self.capturing.get() {
            return Err(KernelError::Capture(format!("cannot {what} while a CUDA graph is being captured")));
        }
        Ok(())
    }

    /// Gives cuBLAS a workspace of its own, so that GEMMs allocate nothing when captured.
    pub(crate) fn set_blas_workspace(&self) -> Result<()> {
        let ws = self.alloc::<u8>(BLAS_WORKSPACE_BYTES)?;
        let p = crate::ptr(&ws);
        // SAFETY: `ws` is a live device allocation of that many bytes, kept alive with the handle
        // (`blas_ws`, declared after `blas` so that it is freed after the handle).
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *self.blas.handle(),
                p as *mut std::ffi::c_void,
                BLAS_WORKSPACE_BYTES,
            )
        }
        .result()
        .map_err(|e| KernelError::Blas(format!("{e:?}")))?;
        *self.blas_ws.borrow_mut() = Some(ws);
        Ok(())
    }
}
