//! KV-block transfer between the GPU ranks of one process over NCCL: the prefill rank's thread
//! sends a request's blocks straight from its cache into the blocks the decode rank reserved.
//!
//! Protocol (per ordered pair of ranks, through the in-process [`KvHub`]): the pair's 2-rank
//! communicator is either joined by both ranks at start-up ([`KvLink::connect`]) or created lazily
//! by the sender (publishing the NCCL id, which the receiver joins on its next poll). The sender
//! announces which request it is sending and queues one group of block-sized sends on its
//! transfer stream; the receiver posts the matching receives on its own transfer stream when it
//! sees its request announced, so NCCL's in-order matching never pairs different requests, and
//! decoding on the compute stream is never held up by an incoming transfer. NCCL may complete a
//! send before the receive is posted (the data waits in the receiver's buffers), so the sender
//! returns only once the receiver acknowledged the request.
//!
//! Every communicator has an epoch in the hub. A side that drops its communicator (deadline, NCCL
//! error, abandoned receive, restarted rank) bumps the epoch if it was current; a sender whose
//! communicator is older re-creates it, a sender waiting on a transfer whose epoch moved gives up
//! at once, and a receiver only ever joins the id of the newest epoch, once. A deadline bounds
//! both sides.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cleave_kernels::cudarc::driver::CudaEvent;
use cleave_kernels::nccl::{NcclComm, NcclId, P2p};
use cleave_kernels::Gpu;

use super::{kerr, CudaBackend, CudaKvCache};
use crate::error::{EngineError, Result};
use crate::kv_port::KvPort;

/// How many failed or abandoned request ids a pair remembers.
const REMEMBER: usize = 64;

#[derive(Default)]
struct Pair {
    /// The id of a communicator the sender created for the receiver to join (`None` once there is
    /// nothing to join: start-up communicators, or after a failure).
    id: Option<NcclId>,
    /// Generation of the pair's communicator.
    epoch: u64,
    /// The request the sender is sending now, and its blocks (the receiver cuts the transfer into
    /// the same runs).
    current: Option<u64>,
    current_blocks: Vec<u32>,
    /// Requests whose send failed (the receiver gives up on them).
    failed: VecDeque<u64>,
    /// Requests the receiver gave up on (the sender does not start them, or stops waiting).
    abandoned: VecDeque<u64>,
    /// The last request the receiver has fully received.
    acked: Option<u64>,
}

fn remember(q: &mut VecDeque<u64>, req: u64) {
    if q.len() >= REMEMBER {
        q.pop_front();
    }
    q.push_back(req);
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

/// `e` with `at` (which pair, which request) in front, of the same kind (a timeout stays one).
fn at_pair(at: &str, e: EngineError) -> EngineError {
    match e {
        EngineError::Timeout(m) => EngineError::Timeout(format!("KV transfer: {at}: {m}")),
        e => xerr(format!("{at}: {e}")),
    }
}

/// One rank's endpoint; lives on the rank's thread with its backend.
pub struct KvLink {
    hub: KvHub,
    rank: usize,
    /// Communicators by (sender, receiver), with their epochs.
    comms: HashMap<(usize, usize), (u64, NcclComm)>,
    /// Receiver: the last epoch joined per pair (each id is joined at most once).
    joined: HashMap<(usize, usize), u64>,
    /// Receiver: receives in flight by (sender, request), with the epoch they were posted on.
    pending: HashMap<(usize, u64), (u64, CudaEvent)>,
}

impl KvLink {
    pub fn new(hub: KvHub, rank: usize) -> Self {
        KvLink { hub, rank, comms: HashMap::new(), joined: HashMap::new(), pending: HashMap::new() }
    }

    /// Start-up: joins the communicator of the pair `src -> dst` (this rank is one of them)
    /// with `id`, made once for the pair and handed to both ranks' threads. Waits for the peer to
    /// join (until `deadline`), so every rank must connect its pairs in one global order (sorted by
    /// `(src, dst)`).
    pub fn connect(&mut self, gpu: &Gpu, src: usize, dst: usize, id: NcclId, deadline: Instant) -> Result<()> {
        let me = match self.rank {
            r if r == src => 0,
            r if r == dst => 1,
            r => return Err(xerr(format!("rank {r} is not part of the pair {src} -> {dst}"))),
        };
        let key = (src, dst);
        let epoch = self.hub.with(key, |p| p.epoch);
        let t = Instant::now();
        let comm = NcclComm::init(gpu, id, me, 2, deadline).map_err(kerr)?;
        tracing::info!(src, dst, rank = self.rank, ms = t.elapsed().as_millis() as u64, "KV transfer: communicator up");
        self.comms.insert(key, (epoch, comm));
        self.joined.insert(key, epoch);
        Ok(())
    }

    /// For a restarted rank: marks every communicator of its previous incarnation stale, so that
    /// its peers re-create them (as senders) or stop waiting on them (as receivers) and nobody
    /// joins their ids again.
    pub fn invalidate_pairs(&self) {
        let mut m = self.hub.pairs.lock().unwrap_or_else(|e| e.into_inner());
        for (_, p) in m.iter_mut().filter(|((s, d), _)| *s == self.rank || *d == self.rank) {
            p.epoch += 1;
            p.id = None;
            p.current = None;
        }
    }

    fn drop_comm(&mut self, key: (usize, usize)) {
        if let Some((_, mut c)) = self.comms.remove(&key) {
            c.abort();
        }
    }

    /// Receiver: drops the pair's communicator and, if it was the current one, tells the sender.
    fn drop_recv_comm(&mut self, key: (usize, usize)) {
        if let Some((e, mut c)) = self.comms.remove(&key) {
            c.abort();
            self.hub.with(key, |p| {
                if p.epoch == e {
                    p.epoch += 1;
                    p.id = None;
                }
            });
        }
    }

    /// Queues the sends and waits for their completion and the receiver's acknowledgement.
    fn deliver(
        &mut self,
        gpu: &Gpu,
        key: (usize, usize),
        epoch: u64,
        regions: &[P2p],
        req: u64,
        deadline: Instant,
    ) -> Result<()> {
        let stream = gpu.xfer_stream().map_err(kerr)?;
        let comm = &mut self.comms.get_mut(&key).expect("created").1;
        // SAFETY: every send and receive names a live buffer of this GPU of its byte count, kept
        // until the transfer completes (the caller waits on it before reusing them).
        unsafe { comm.transfer_on(gpu, &stream, regions, &[]) }.map_err(kerr)?;
        let ev = stream.record_event(None).map_err(|e| xerr(format!("{e:?}")))?;
        let mut sent = false;
        loop {
            if !sent {
                sent = comm.poll(&ev).map_err(kerr)?;
            }
            let (acked, gone) =
                self.hub.with(key, |p| (p.acked == Some(req), p.epoch != epoch || p.abandoned.contains(&req)));
            if sent && acked {
                return Ok(());
            }
            if gone {
                return Err(xerr("the receiver gave up on the transfer".into()));
            }
            if Instant::now() >= deadline {
                return Err(EngineError::Timeout(if sent {
                    "the receiver did not take the blocks before the deadline".into()
                } else {
                    "the send did not complete before the deadline".into()
                }));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Drop for KvLink {
    /// Aborts every communicator (local and non-blocking; peers notice through the epochs or
    /// their deadlines).
    fn drop(&mut self) {
        for (_, (_, mut c)) in self.comms.drain() {
            c.abort();
        }
    }
}

/// The NCCL end of the KV links between groups (see the module docs).
impl KvPort<CudaBackend> for KvLink {
    fn rank(&self) -> usize {
        self.rank
    }

    /// Prefill side: sends `blocks` of `cache` for request `req` into `dst_blocks` of rank `dst`.
    /// Returns the bytes sent once they are in the receiver's blocks; fails at `deadline`.
    fn send(
        &mut self,
        be: &CudaBackend,
        cache: &CudaKvCache,
        blocks: &[u32],
        dst_blocks: &[u32],
        dst: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<u64> {
        let key = (self.rank, dst);
        let gpu = be.gpu();
        let hub_epoch = self.hub.with(key, |p| p.epoch);
        if self.comms.get(&key).is_none_or(|(e, c)| c.is_aborted() || *e != hub_epoch) {
            self.drop_comm(key);
            let id = NcclComm::unique_id().map_err(kerr)?;
            let epoch = self.hub.with(key, |p| {
                p.id = Some(id);
                p.epoch += 1;
                p.current = None;
                p.epoch
            });
            tracing::info!(src = self.rank, dst, epoch, "KV transfer: new communicator; waiting for the receiver");
            // Waits for the receiver to join on its next poll, until the transfer's deadline.
            let comm = NcclComm::init(gpu, id, 0, 2, deadline).map_err(kerr)?;
            self.comms.insert(key, (epoch, comm));
        }
        let epoch = self.comms[&key].0;
        let regions = CudaBackend::regions(cache, blocks, dst_blocks, 1)?;
        let abandoned = self.hub.with(key, |p| {
            let gone = p.abandoned.contains(&req);
            if !gone {
                p.current = Some(req);
                p.current_blocks = blocks.to_vec();
            }
            gone
        });
        if abandoned {
            return Err(xerr(format!(
                "rank {} -> {dst}, request {req}: the receiver gave up before the send",
                self.rank
            )));
        }
        let bytes: u64 = regions.iter().map(|r| r.bytes as u64).sum();
        match self.deliver(gpu, key, epoch, &regions, req, deadline) {
            Ok(()) => {
                self.hub.with(key, |p| p.current = None);
                Ok(bytes)
            }
            Err(e) => {
                self.hub.with(key, |p| {
                    p.current = None;
                    remember(&mut p.failed, req);
                    p.id = None;
                });
                self.drop_comm(key);
                Err(at_pair(&format!("rank {} -> {dst}, request {req}", self.rank), e))
            }
        }
    }

    /// Decode side, called repeatedly: `Ok(Some(bytes))` once request `req`'s KV from rank `src`
    /// sits in `blocks`, `Ok(None)` while it is not there yet. Never blocks for long (except for
    /// joining a communicator the sender re-created).
    fn poll_recv(
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
        let (id, epoch, current, failed) = self.hub.with(key, |p| {
            let current = p.current.filter(|&c| c == req).map(|c| (c, p.current_blocks.clone()));
            (p.id, p.epoch, current, p.failed.contains(&req))
        });
        if failed {
            if self.pending.remove(&(src, req)).is_some() {
                self.drop_recv_comm(key);
            }
            return Err(xerr(format!("rank {src} failed to send request {req}")));
        }
        if Instant::now() >= deadline {
            self.cancel(src, req);
            return Err(EngineError::Timeout(format!(
                "KV transfer: request {req} from rank {src} did not arrive in time"
            )));
        }
        if let Some(id) = id {
            if self.joined.get(&key) != Some(&epoch) {
                // The sender made a new communicator: the old one (and what was posted on it) is void.
                self.drop_comm(key);
                self.joined.insert(key, epoch);
                let comm = NcclComm::init(gpu, id, 1, 2, deadline).map_err(kerr)?;
                tracing::info!(src, dst = self.rank, epoch, "KV transfer: joined a new communicator");
                self.comms.insert(key, (epoch, comm));
            }
        }
        let bytes = blocks.len() as u64 * cache.block_region(0).1 as u64;
        if let Some((posted, ev)) = self.pending.get(&(src, req)) {
            let res = match self.comms.get_mut(&key) {
                Some((e, comm)) if e == posted => comm.poll(ev).map_err(|e| e.to_string()),
                _ => Err(format!("the communicator with rank {src} was replaced mid-transfer")),
            };
            return match res {
                Ok(true) => {
                    self.pending.remove(&(src, req));
                    self.hub.with(key, |p| p.acked = Some(req));
                    Ok(Some(bytes))
                }
                Ok(false) => Ok(None),
                Err(e) => {
                    self.pending.remove(&(src, req));
                    self.drop_recv_comm(key);
                    Err(xerr(format!("request {req} from rank {src}: {e}")))
                }
            };
        }
        if let Some((_, src_blocks)) = current {
            let regions = CudaBackend::regions(cache, blocks, &src_blocks, 0)?;
            let Some((e, comm)) = self.comms.get(&key) else { return Ok(None) };
            let stream = gpu.xfer_stream().map_err(kerr)?;
            // SAFETY: every send and receive names a live buffer of this GPU of its byte count, kept
            // until the transfer completes (the caller waits on it before reusing them).
            unsafe { comm.transfer_on(gpu, &stream, &[], &regions) }.map_err(kerr)?;
            let ev = stream.record_event(None).map_err(|e| kerr(e.into()))?;
            self.pending.insert((src, req), (*e, ev));
        }
        Ok(None)
    }

    /// Forgets an abandoned receive: the sender will not start it or stops waiting on it, and a
    /// receive in flight takes the pair's communicator with it.
    fn cancel(&mut self, src: usize, req: u64) {
        let key = (src, self.rank);
        self.hub.with(key, |p| remember(&mut p.abandoned, req));
        if self.pending.remove(&(src, req)).is_some() {
            self.drop_recv_comm(key);
        }
    }
}
