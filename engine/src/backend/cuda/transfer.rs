//! KV-block transfer between the GPU ranks of one process over NCCL: the prefill rank's thread
//! sends a request's blocks straight from its cache into the blocks the decode rank reserved.
//!
//! Protocol (per ordered pair of ranks, through the in-process [`KvHub`]): the sender creates the
//! pair's 2-rank communicator lazily (publishing the NCCL id, which the receiver joins on its next
//! poll), announces which request it is sending, and queues one group of block-sized sends on its
//! transfer stream; the receiver posts the matching receives on its own transfer stream when it
//! sees its request announced, so NCCL's in-order matching never pairs different requests, and
//! decoding on the compute stream is never held up by an incoming transfer. A deadline bounds both
//! sides; on expiry or an NCCL error the pair's communicator is aborted on both sides and
//! re-created by the next transfer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cleave_kernels::cudarc::driver::CudaEvent;
use cleave_kernels::nccl::{NcclComm, NcclId};

use super::{kerr, CudaBackend, CudaKvCache};
use crate::error::{EngineError, Result};

#[derive(Default)]
struct Pair {
    id: Option<NcclId>,
    epoch: u64,
    /// The request the sender is sending now.
    current: Option<u64>,
    /// A request whose send failed (the receiver gives up on it).
    failed: Option<u64>,
    /// The last request the receiver has fully received. NCCL may complete a send before the
    /// matching receive is even posted (the data waits in the receiver's buffers), so the
    /// sender's own completion does not prove delivery: it waits for this.
    acked: Option<u64>,
}

/// Shared by every rank of the process.
#[derive(Clone, Default)]
pub struct KvHub {
    pairs: Arc<Mutex<HashMap<(usize, usize), Pair>>>,
}

impl KvHub {
    fn with<T>(&self, key: (usize, usize), f: impl FnOnce(&mut Pair) -> T) -> T {
        let mut m = self.pairs.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(key).or_default())
    }
}

fn xerr(msg: String) -> EngineError {
    EngineError::Backend(format!("KV transfer: {msg}"))
}

/// One rank's endpoint; lives on the rank's thread with its backend.
pub struct KvLink {
    hub: KvHub,
    rank: usize,
    comms: HashMap<(usize, usize), (u64, NcclComm)>,
    pending: HashMap<(usize, u64), CudaEvent>,
}

impl KvLink {
    pub fn new(hub: KvHub, rank: usize) -> Self {
        KvLink { hub, rank, comms: HashMap::new(), pending: HashMap::new() }
    }

    fn drop_comm(&mut self, key: (usize, usize)) {
        if let Some((_, mut c)) = self.comms.remove(&key) {
            c.abort();
        }
    }

    /// Prefill side: sends `blocks` of `cache` for request `req` to rank `dst`. Returns the bytes
    /// sent once they are in the receiver's blocks; fails at `deadline`.
    pub fn send(
        &mut self,
        be: &CudaBackend,
        cache: &CudaKvCache,
        blocks: &[u32],
        dst: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<u64> {
        let key = (self.rank, dst);
        let gpu = be.gpu();
        if self.comms.get(&key).is_none_or(|(_, c)| c.is_aborted()) {
            self.drop_comm(key);
            let id = NcclComm::unique_id().map_err(kerr)?;
            let epoch = self.hub.with(key, |p| {
                p.id = Some(id);
                p.epoch += 1;
                p.current = None;
                p.epoch
            });
            // Blocks until the receiver joins on its next poll.
            let comm = NcclComm::init(gpu, id, 0, 2).map_err(kerr)?;
            self.comms.insert(key, (epoch, comm));
        }
        self.hub.with(key, |p| {
            p.current = Some(req);
            p.failed = None;
        });
        let regions = CudaBackend::regions(cache, blocks, 1)?;
        let bytes: u64 = regions.iter().map(|r| r.bytes as u64).sum();
        let stream = gpu.xfer_stream().map_err(kerr)?;
        let comm = &mut self.comms.get_mut(&key).expect("created").1;
        let mut res = comm
            .transfer_on(gpu, &stream, &regions, &[])
            .and_then(|_| stream.record_event(None).map_err(Into::into))
            .and_then(|ev| comm.wait_event(&ev, deadline.saturating_duration_since(Instant::now())))
            .map_err(|e| e.to_string());
        while res.is_ok() && self.hub.with(key, |p| p.acked) != Some(req) {
            if Instant::now() >= deadline {
                res = Err("the receiver did not take the blocks before the deadline".into());
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        match res {
            Ok(()) => {
                self.hub.with(key, |p| p.current = None);
                Ok(bytes)
            }
            Err(e) => {
                self.hub.with(key, |p| {
                    p.current = None;
                    p.failed = Some(req);
                    p.id = None;
                });
                self.drop_comm(key);
                Err(xerr(format!("rank {} -> {dst}, request {req}: {e}", self.rank)))
            }
        }
    }

    /// Decode side, called repeatedly: `Ok(Some(bytes))` once request `req`'s KV from rank `src`
    /// sits in `blocks`, `Ok(None)` while it is not there yet. Never blocks for long (except for
    /// joining a new communicator, once per pair).
    pub fn poll_recv(
        &mut self,
        be: &CudaBackend,
        cache: &mut CudaKvCache,
        blocks: &[u32],
        src: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<Option<u64>> {
        let key = (src, self.rank);
        let gpu = be.gpu();
        let (id, epoch, current, failed) = self.hub.with(key, |p| (p.id, p.epoch, p.current, p.failed));
        if failed == Some(req) {
            self.pending.remove(&(src, req));
            self.drop_comm(key);
            return Err(xerr(format!("rank {src} failed to send request {req}")));
        }
        if Instant::now() >= deadline {
            if self.pending.remove(&(src, req)).is_some() {
                self.drop_comm(key);
            }
            return Err(xerr(format!("request {req} from rank {src} did not arrive in time")));
        }
        if let Some(id) = id {
            if self.comms.get(&key).map(|c| c.0) != Some(epoch) {
                self.drop_comm(key);
                let comm = NcclComm::init(gpu, id, 1, 2).map_err(kerr)?;
                self.comms.insert(key, (epoch, comm));
            }
        }
        let regions = CudaBackend::regions(cache, blocks, 0)?;
        let bytes: u64 = regions.iter().map(|r| r.bytes as u64).sum();
        if let Some(ev) = self.pending.get(&(src, req)) {
            let Some((_, comm)) = self.comms.get_mut(&key) else {
                self.pending.remove(&(src, req));
                return Err(xerr(format!("the communicator with rank {src} went away")));
            };
            return match comm.poll(ev) {
                Ok(true) => {
                    self.pending.remove(&(src, req));
                    self.hub.with(key, |p| p.acked = Some(req));
                    Ok(Some(bytes))
                }
                Ok(false) => Ok(None),
                Err(e) => {
                    self.pending.remove(&(src, req));
                    self.drop_comm(key);
                    Err(xerr(format!("request {req} from rank {src}: {e}")))
                }
            };
        }
        if current == Some(req) {
            let Some((_, comm)) = self.comms.get(&key) else { return Ok(None) };
            let stream = gpu.xfer_stream().map_err(kerr)?;
            comm.transfer_on(gpu, &stream, &[], &regions).map_err(kerr)?;
            let ev = stream.record_event(None).map_err(|e| kerr(e.into()))?;
            self.pending.insert((src, req), ev);
        }
        Ok(None)
    }

    /// Forgets an abandoned receive (a receive in flight takes the pair's communicator with it).
    pub fn cancel(&mut self, src: usize, req: u64) {
        if self.pending.remove(&(src, req)).is_some() {
            self.drop_comm((src, self.rank));
        }
    }
}
