//! The side stream: kernels launched beside the compute stream's, for work that does not depend
//! on what the compute stream does meanwhile (a MoE layer's shared experts while its router
//! runs). A branch forks from the compute stream ([`Gpu::on_side`]: the side stream first waits
//! for everything queued so far) and joins it again ([`Gpu::join_side`]: the compute stream waits
//! for the side's work). Both are event record/wait pairs, so a graph capture records the branch
//! as two parallel chains of nodes.
//!
//! What runs on the side: kernel launches and fills. cuBLAS, host copies and synchronization
//! stay on the compute stream (they fail there with [`KernelError::Invalid`]); an allocation
//! made inside a branch is ordered on the compute stream, and the side waits for it. The caller keeps
//! every buffer the side reads or writes from being reused until the join: buffers are recycled
//! in the compute stream's order only.

use std::sync::Arc;

use cudarc::driver::sys as drv_sys;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::{Gpu, KernelError, Result};

/// The side stream and the two events of its fork and join (made once: re-recording an event
/// leaves earlier waits on it as they were).
pub(crate) struct Side {
    stream: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
}

impl Side {
    pub(crate) fn new(main: &Arc<CudaStream>) -> Result<Side> {
        let ctx = main.context();
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(Side { stream: ctx.new_stream()?, fork: ctx.new_event(flags)?, join: ctx.new_event(flags)? })
    }
}

impl Gpu {
    /// The stream that launches go to now: the side stream inside [`Gpu::on_side`], else the
    /// compute stream.
    pub(crate) fn cur_stream(&self) -> &Arc<CudaStream> {
        if self.on_side.get() {
            &self.side.stream
        } else {
            &self.stream
        }
    }

    /// Fails when called inside [`Gpu::on_side`]: `what` runs on the compute stream only.
    pub(crate) fn main_only(&self, what: &str) -> Result<()> {
        if self.on_side.get() {
            return Err(KernelError::Invalid(format!(
                "{what} runs on the compute stream only, not on the side stream"
            )));
        }
        Ok(())
    }

    /// Launches what `f` launches on the side stream, after everything queued on the compute
    /// stream so far; the compute stream goes on without waiting for it until
    /// [`Gpu::join_side`]. Branches do not nest.
    /// `f`'s own result (often a `Result` of its own) comes back inside this one.
    pub fn on_side<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        if self.on_side.get() {
            return Err(KernelError::Invalid("a side-stream branch is already open".into()));
        }
        self.ctx.bind_to_thread()?;
        self.side.fork.record(&self.stream)?;
        self.side.stream.wait(&self.side.fork)?;
        self.on_side.set(true);
        let out = f();
        self.on_side.set(false);
        Ok(out)
    }

    /// Inside [`Gpu::on_side`]: makes the side stream wait for everything queued on the compute
    /// stream so far (a new allocation, which is ordered there); elsewhere nothing.
    pub(crate) fn side_after_main(&self) -> Result<()> {
        if self.on_side.get() {
            self.side.fork.record(&self.stream)?;
            self.side.stream.wait(&self.side.fork)?;
        }
        Ok(())
    }

    /// Makes the compute stream wait for everything queued on the side stream so far.
    pub fn join_side(&self) -> Result<()> {
        self.ctx.bind_to_thread()?;
        self.side.join.record(&self.side.stream)?;
        self.stream.wait(&self.side.join)?;
        Ok(())
    }
}
