//! NCCL point-to-point transport for latent KV blocks. Each rank's communicator is created on,
//! and stays on, the thread that owns its GPU (the raw handle makes [`NcclComm`] neither Send nor
//! Sync). Sends and receives of one transfer go in one group call, so a rank that sends and
//! receives at once never deadlocks; [`NcclComm::wait`] bounds the wait and aborts the
//! communicator on a timeout or an asynchronous NCCL error.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::nccl::{result as nccl, sys};

use crate::{Gpu, KernelError, Result};

/// The rendezvous id every rank of one communicator is created with (plain bytes: Send + Copy).
#[derive(Clone, Copy)]
pub struct NcclId(pub [std::ffi::c_char; 128]);

/// One direction of one contiguous byte range.
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    pub ptr: u64,
    pub bytes: usize,
    pub peer: usize,
}

/// Whether the NCCL library can be opened here.
pub fn available() -> bool {
    unsafe { sys::is_culib_present() }
}

pub struct NcclComm {
    comm: sys::ncclComm_t,
    rank: usize,
    world: usize,
    aborted: bool,
}

/// How long enqueueing one group may take before the transfer is given up.
const ENQUEUE_BOUND: Duration = Duration::from_secs(30);

/// Why a communicator's background work did not settle.
enum Settle {
    Late,
    Failed(sys::ncclResult_t),
}

/// NCCL_CONFIG_INITIALIZER with `blocking = 0`: every other field left to NCCL's default (its
/// "undefined" value), `version` the library's own so that it reads every field it knows.
fn nonblocking_config() -> Result<sys::ncclConfig_t> {
    const UNDEF: i32 = i32::MIN;
    let version = nccl::get_nccl_version().map_err(|e| err("ncclGetVersion", e))?;
    let mut c: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = std::mem::size_of::<sys::ncclConfig_t>();
    c.magic = 0xcafebeef;
    c.version = version as u32;
    c.blocking = 0;
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.splitShare = UNDEF;
    c.trafficClass = UNDEF;
    c.collnetEnable = UNDEF;
    c.CTAPolicy = UNDEF;
    c.shrinkShare = UNDEF;
    c.nvlsCTAs = UNDEF;
    c.nChannelsPerNetPeer = UNDEF;
    c.nvlinkCentricSched = UNDEF;
    c.graphUsageMode = UNDEF;
    c.numRmaCtx = UNDEF;
    Ok(c)
}

fn err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Nccl(format!("{what}: {e:?}"))
}

impl NcclComm {
    /// A fresh rendezvous id (made once, handed to every rank's thread).
    pub fn unique_id() -> Result<NcclId> {
        if !available() {
            return Err(KernelError::Nccl("libnccl is not on the library path".into()));
        }
        let id = nccl::get_uniqueid().map_err(|e| err("ncclGetUniqueId", e))?;
        Ok(NcclId(id.internal))
    }

    /// Joins the communicator as `rank` of `world` on `gpu`'s device once every rank joined; at
    /// `deadline` gives up and aborts it. The communicator is non-blocking (NCCL returns at once and
    /// finishes in the background), so a peer that never joins cannot hold this thread forever.
    pub fn init(gpu: &Gpu, id: NcclId, rank: usize, world: usize, deadline: Instant) -> Result<NcclComm> {
        gpu.ctx.bind_to_thread()?;
        let mut config = nonblocking_config()?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let id = sys::ncclUniqueId { internal: id.0 };
        unsafe { nccl::comm_init_rank_config(&mut comm, world as i32, id, rank as i32, &mut config) }
            .map_err(|e| err("ncclCommInitRankConfig", e))?;
        let mut c = NcclComm { comm, rank, world, aborted: false };
        if let Err(e) = c.settle(deadline) {
            c.abort();
            return Err(match e {
                Settle::Late => KernelError::Timeout(format!(
                    "ncclCommInitRankConfig: rank {rank} of {world}: the other ranks did not join before the deadline"
                )),
                Settle::Failed(s) => err("ncclCommInitRankConfig", s),
            });
        }
        Ok(c)
    }

    /// Waits until the communicator's background work (initialization, enqueueing a group) is
    /// done.
    fn settle(&self, deadline: Instant) -> std::result::Result<(), Settle> {
        let spin_until = Instant::now() + Duration::from_millis(1);
        loop {
            let mut state = sys::ncclResult_t::ncclSuccess;
            unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            match state {
                sys::ncclResult_t::ncclSuccess => return Ok(()),
                sys::ncclResult_t::ncclInProgress => {}
                s => return Err(Settle::Failed(s)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Settle::Late);
            }
            // Enqueueing a group settles in microseconds: spin (yielding) through the first
            // millisecond, then poll gently (a peer joining a communicator takes 100s of ms).
            if now < spin_until {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Queues every send and receive of one transfer on `gpu`'s stream as one NCCL group.
    /// Profiled as `nccl_p2p` ([`Gpu::profile_start`]).
    ///
    /// # Safety
    /// Every send's `ptr` holds its `bytes` on this GPU until the transfer completes, and every
    /// receive's `ptr` as many bytes that nothing else uses until then.
    pub unsafe fn transfer(&self, gpu: &Gpu, sends: &[P2p], recvs: &[P2p]) -> Result<()> {
        let t = gpu.prof_mark()?;
        self.transfer_on(gpu, &gpu.stream, sends, recvs)?;
        gpu.prof_end("nccl_p2p", t)
    }

    /// Like [`NcclComm::transfer`], on `stream`.
    ///
    /// # Safety
    /// As [`NcclComm::transfer`].
    pub unsafe fn transfer_on(
        &self,
        gpu: &Gpu,
        stream: &cudarc::driver::CudaStream,
        sends: &[P2p],
        recvs: &[P2p],
    ) -> Result<()> {
        if self.aborted {
            return Err(KernelError::Nccl("the communicator was aborted after an earlier failure".into()));
        }
        gpu.ctx.bind_to_thread()?;
        let stream = stream.cu_stream() as sys::cudaStream_t;
        nccl::group_start().map_err(|e| err("ncclGroupStart", e))?;
        // Every operation is queued inside the group (which is always closed), stopping at the
        // first that fails.
        let u8t = sys::ncclDataType_t::ncclUint8;
        let queue = |p: &P2p, send: bool| unsafe {
            let r = if send {
                nccl::send(p.ptr as *const c_void, p.bytes, u8t, p.peer as i32, self.comm, stream)
            } else {
                nccl::recv(p.ptr as *mut c_void, p.bytes, u8t, p.peer as i32, self.comm, stream)
            };
            r.map(drop).map_err(|e| err(if send { "ncclSend" } else { "ncclRecv" }, e))
        };
        let ops = sends.iter().map(|p| (p, true)).chain(recvs.iter().map(|p| (p, false)));
        let res = ops.filter(|(p, _)| p.bytes > 0).try_for_each(|(p, send)| queue(p, send));
        let end = nccl::group_end().map_err(|e| err("ncclGroupEnd", e));
        res?;
        // A non-blocking communicator may still be enqueueing the group: the operations are on
        // the stream (and an event recorded after them means something) only once it settled.
        self.enqueued(end?, "ncclGroupEnd")
    }

    /// Waits, when NCCL returned "in progress", until the operation `what` is on the stream.
    fn enqueued(&self, status: nccl::NcclStatus, what: &str) -> Result<()> {
        if let nccl::NcclStatus::InProgress = status {
            self.settle(Instant::now() + ENQUEUE_BOUND).map_err(|e| match e {
                Settle::Late => KernelError::Nccl(format!("{what}: not enqueued within {} s", ENQUEUE_BOUND.as_secs())),
                Settle::Failed(s) => err(what, s),
            })?;
        }
        Ok(())
    }

    /// Queues an in-place f32 sum of `count` values at `ptr` over every rank, on `gpu`'s stream
    /// (profiled as `nccl_all_reduce`).
    ///
    /// # Safety
    /// `ptr` must address at least `count` f32 values in memory of `gpu`'s context that stay
    /// allocated until the stream passes the operation.
    pub unsafe fn all_reduce_sum_f32(&self, gpu: &Gpu, ptr: u64, count: usize) -> Result<()> {
        self.check_usable()?;
        if count == 0 {
            return Ok(());
        }
        gpu.ctx.bind_to_thread()?;
        let t = gpu.prof_mark()?;
        let stream = gpu.stream.cu_stream() as sys::cudaStream_t;
        let (f32t, sum) = (sys::ncclDataType_t::ncclFloat32, sys::ncclRedOp_t::ncclSum);
        // SAFETY: the caller guarantees the buffer; in place is allowed (send == recv).
        let status =
            unsafe { nccl::all_reduce(ptr as *const c_void, ptr as *mut c_void, count, f32t, sum, self.comm, stream) }
                .map_err(|e| err("ncclAllReduce", e))?;
        self.enqueued(status, "ncclAllReduce")?;
        gpu.prof_end("nccl_all_reduce", t)
    }

    /// Queues an all-gather of `count` f32 values from every rank into `recv` (`count * world`
    /// values, rank order), on `gpu`'s stream.
    ///
    /// # Safety
    /// `send` must address `count` and `recv` `count * world` f32 values in memory of `gpu`'s
    /// context that stay allocated until the stream passes the operation.
    pub unsafe fn all_gather_f32(&self, gpu: &Gpu, send: u64, recv: u64, count: usize) -> Result<()> {
        self.check_usable()?;
        gpu.ctx.bind_to_thread()?;
        let stream = gpu.stream.cu_stream() as sys::cudaStream_t;
        let f32t = sys::ncclDataType_t::ncclFloat32;
        // SAFETY: the caller guarantees both buffers.
        let status =
            unsafe { nccl::all_gather(send as *const c_void, recv as *mut c_void, count, f32t, self.comm, stream) }
                .map_err(|e| err("ncclAllGather", e))?;
        self.enqueued(status, "ncclAllGather")
    }

    /// Queues a sum over every rank of `count * world` f32 values at `send`, rank `r` receiving
    /// block `r` (`count` values) in `recv`, on `gpu`'s stream.
    ///
    /// # Safety
    /// `send` must address `count * world` and `recv` `count` f32 values in memory of `gpu`'s
    /// context that stay allocated until the stream passes the operation.
    pub unsafe fn reduce_scatter_sum_f32(&self, gpu: &Gpu, send: u64, recv: u64, count: usize) -> Result<()> {
        self.check_usable()?;
        gpu.ctx.bind_to_thread()?;
        let stream = gpu.stream.cu_stream() as sys::cudaStream_t;
        let (f32t, sum) = (sys::ncclDataType_t::ncclFloat32, sys::ncclRedOp_t::ncclSum);
        // SAFETY: the caller guarantees both buffers.
        let status = unsafe {
            nccl::reduce_scatter(send as *const c_void, recv as *mut c_void, count, f32t, sum, self.comm, stream)
        }
        .map_err(|e| err("ncclReduceScatter", e))?;
        self.enqueued(status, "ncclReduceScatter")
    }

    fn check_usable(&self) -> Result<()> {
        if self.aborted {
            return Err(KernelError::Nccl("the communicator was aborted after an earlier failure".into()));
        }
        Ok(())
    }

    /// Waits for the queued transfer; on a timeout or an asynchronous error the communicator is
    /// aborted (its pending operations are cancelled) and the error returned.
    pub fn wait(&mut self, gpu: &Gpu, timeout: Duration) -> Result<()> {
        let ev = gpu.record()?;
        self.wait_event(&ev, timeout)
    }

    /// Waits for `ev` (recorded after a queued transfer), bounded by `timeout`.
    pub fn wait_event(&mut self, ev: &cudarc::driver::CudaEvent, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if self.poll(ev)? {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                self.abort();
                return Err(KernelError::Timeout(format!("transfer timed out after {} ms", timeout.as_millis())));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Whether the transfer before `ev` finished; an asynchronous NCCL error aborts the
    /// communicator and is returned.
    pub fn poll(&mut self, ev: &cudarc::driver::CudaEvent) -> Result<bool> {
        if ev.try_is_complete()? {
            return Ok(true);
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
        if state != sys::ncclResult_t::ncclSuccess && state != sys::ncclResult_t::ncclInProgress {
            self.abort();
            return Err(KernelError::Nccl(format!("asynchronous NCCL error {state:?}")));
        }
        Ok(false)
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// Cancels whatever is pending on this communicator (it cannot be used afterwards).
    pub fn abort(&mut self) {
        if !self.aborted {
            let _ = unsafe { nccl::comm_abort(self.comm) };
            self.aborted = true;
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.aborted {
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        }
    }
}

/// Merges sorted block ids into runs of consecutive ids: `(first, count)`.
pub fn block_runs(blocks: &[u32]) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some((s, n)) if *s + *n == b => *n += 1,
            _ => runs.push((b, 1)),
        }
    }
    runs
}

/// Pairs the sender's and receiver's block lists into ranges that are contiguous on both sides:
/// `(src_first, dst_first, count)`.
pub fn paired_runs(src: &[u32], dst: &[u32]) -> Vec<(u32, u32, u32)> {
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        match runs.last_mut() {
            Some((a, b, n)) if *a + *n == s && *b + *n == d => *n += 1,
            _ => runs.push((s, d, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_consecutive_blocks() {
        assert_eq!(block_runs(&[3, 4, 5, 9, 10, 2]), vec![(3, 3), (9, 2), (2, 1)]);
        assert_eq!(paired_runs(&[1, 2, 3, 7], &[10, 11, 20, 21]), vec![(1, 10, 2), (3, 20, 1), (7, 21, 1)]);
        assert!(paired_runs(&[], &[]).is_empty());
    }
}
