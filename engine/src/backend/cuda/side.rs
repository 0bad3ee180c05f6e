//! Branches on the GPU's side stream ([`cleave_kernels::Gpu::on_side`]) with the workspace held
//! while they are open, so that no buffer the side stream may still touch is handed to other work
//! before the branch joins the compute stream (the pool's reuse follows the compute stream's
//! order only).

use super::{kerr, CudaBackend};
use crate::error::Result;

/// An open side-stream branch: [`Branch::join`] (or dropping it, after an error) joins it to the
/// compute stream and releases the buffers handed back while it was open.
pub(super) struct Branch<'a> {
    be: &'a CudaBackend,
    joined: bool,
}

impl CudaBackend {
    /// Runs `f`'s launches on the side stream, which starts after everything queued on the
    /// compute stream so far; the compute stream goes on until the branch joins.
    pub(super) fn fork<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(Branch<'_>, T)> {
        self.ws.hold();
        self.graphs.ws.hold();
        let branch = Branch { be: self, joined: false };
        let out = self.gpu.on_side(f).map_err(kerr)??;
        Ok((branch, out))
    }
}

impl Branch<'_> {
    /// Makes the compute stream wait for the branch's work.
    pub(super) fn join(mut self) -> Result<()> {
        self.joined = true;
        self.be.gpu.join_side().map_err(kerr)
        // Dropping `self` releases the held buffers.
    }
}

impl Drop for Branch<'_> {
    fn drop(&mut self) {
        if !self.joined {
            // After an error: the compute stream still must not run ahead of the side's work.
            let _ = self.be.gpu.join_side();
        }
        self.be.ws.release();
        self.be.graphs.ws.release();
    }
}
