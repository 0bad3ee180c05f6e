//! A rank's end of the KV links between groups: a prefilled prompt's latent blocks move from the
//! sampling rank of the prefill group's DP rank that holds them to every TP rank of the decode
//! group's DP rank that reserved room for them, each side on its own rank's thread, cache to
//! cache. [`MemHub`] links ranks that are threads of one process through host memory (CPU ranks);
//! on GPUs the port is NCCL point-to-point (`backend::cuda::transfer::KvLink`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::parallel::RankCoord;

/// One rank's end of the KV links. Ranks are named by their configured ids (device ordinals on
/// GPUs).
pub trait KvPort<B: Backend> {
    /// This rank's configured id.
    fn rank(&self) -> usize;
    /// Sends `blocks` of `cache` for request `req` into the blocks `dst_blocks` of rank `dst`
    /// reserved; returns the bytes sent once they may be released; fails at `deadline`.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        be: &B,
        cache: &B::KvCache,
        blocks: &[u32],
        dst_blocks: &[u32],
        dst: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<u64>;
    /// Called repeatedly, never blocking for long: `Some(bytes)` once request `req`'s KV from
    /// rank `src` sits in `blocks` of `cache`.
    #[allow(clippy::too_many_arguments)]
    fn poll_recv(
        &mut self,
        be: &B,
        cache: &mut B::KvCache,
        blocks: &[u32],
        src: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<Option<u64>>;
    /// Forgets an abandoned receive of `req` from `src`.
    fn cancel(&mut self, src: usize, req: u64);
}

/// Builds the port of the rank at a group coordinate, on that rank's thread, over its backend.
pub type PortMaker<B> = dyn Fn(RankCoord, &B) -> Result<Box<dyn KvPort<B>>> + Send + Sync;

/// How long an unclaimed parcel stays in a [`MemHub`] after its deadline.
const GRACE: Duration = Duration::from_secs(5);

type Parcels = HashMap<(usize, usize, u64), (Instant, Vec<f32>)>;

/// Parcels of exported blocks between ranks of one process, by (sender, receiver, request).
#[derive(Clone, Default)]
pub struct MemHub {
    parcels: Arc<Mutex<Parcels>>,
}

impl MemHub {
    pub fn new() -> Self {
        Self::default()
    }

    /// The port of rank `rank`.
    pub fn port(&self, rank: usize) -> MemPort {
        MemPort { hub: self.clone(), rank }
    }

    /// Parcels sent and not received (tests check that none is left behind).
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parcels> {
        self.parcels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A rank's end of a [`MemHub`].
pub struct MemPort {
    hub: MemHub,
    rank: usize,
}

impl<B: Backend> KvPort<B> for MemPort {
    fn rank(&self) -> usize {
        self.rank
    }

    fn send(
        &mut self,
        be: &B,
        cache: &B::KvCache,
        blocks: &[u32],
        dst_blocks: &[u32],
        dst: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<u64> {
        if blocks.len() != dst_blocks.len() {
            return Err(EngineError::InvalidRequest(format!(
                "rank {} sends {} blocks into {} reserved on rank {dst}",
                self.rank,
                blocks.len(),
                dst_blocks.len()
            )));
        }
        let now = Instant::now();
        if now >= deadline {
            // The receiver gives up at the deadline: a parcel now would never be collected.
            return Err(EngineError::Timeout(format!("rank {}: the deadline passed before the send", self.rank)));
        }
        let data = be.export_blocks(cache, blocks)?;
        let bytes = (data.len() * std::mem::size_of::<f32>()) as u64;
        let mut p = self.hub.lock();
        p.retain(|_, (d, _)| *d + GRACE > now);
        p.insert((self.rank, dst, req), (deadline, data));
        Ok(bytes)
    }

    fn poll_recv(
        &mut self,
        be: &B,
        cache: &mut B::KvCache,
        blocks: &[u32],
        src: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<Option<u64>> {
        let parcel = self.hub.lock().remove(&(src, self.rank, req));
        match parcel {
            Some((_, data)) => {
                be.import_blocks(cache, blocks, &data)?;
                Ok(Some((data.len() * std::mem::size_of::<f32>()) as u64))
            }
            None if Instant::now() >= deadline => Err(EngineError::Timeout(format!(
                "rank {}: request {req}'s KV from rank {src} did not arrive by the deadline",
                self.rank
            ))),
            None => Ok(None),
        }
    }

    fn cancel(&mut self, src: usize, req: u64) {
        self.hub.lock().remove(&(src, self.rank, req));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::KvLayout;

    #[test]
    fn a_parcel_goes_from_one_rank_to_one_receiver_once_and_late_receives_time_out() {
        let be = CpuBackend;
        let layout = KvLayout { layers: 2, num_blocks: 4, block_size: 2, width: 3 };
        let (mut src_cache, mut dst_cache) = (be.alloc_kv_cache(layout).unwrap(), be.alloc_kv_cache(layout).unwrap());
        let per_block = 2 * 2 * 3;
        let data: Vec<f32> = (0..2 * per_block).map(|i| i as f32).collect();
        be.import_blocks(&mut src_cache, &[1, 2], &data).unwrap();
        let hub = MemHub::new();
        let (mut a, mut b, mut c) = (hub.port(0), hub.port(1), hub.port(2));
        let deadline = Instant::now() + Duration::from_secs(5);
        let sent = KvPort::<CpuBackend>::send(&mut a, &be, &src_cache, &[1, 2], &[3, 0], 1, 7, deadline).unwrap();
        assert_eq!(sent, (data.len() * 4) as u64);
        // Another rank, or another request, finds nothing.
        assert_eq!(c.poll_recv(&be, &mut dst_cache, &[3, 0], 0, 7, deadline).unwrap(), None);
        assert_eq!(b.poll_recv(&be, &mut dst_cache, &[3, 0], 0, 8, deadline).unwrap(), None);
        assert_eq!(b.poll_recv(&be, &mut dst_cache, &[3, 0], 0, 7, deadline).unwrap(), Some(sent));
        assert_eq!(be.export_blocks(&dst_cache, &[3, 0]).unwrap(), data);
        assert_eq!(hub.pending(), 0);
        // Mismatched block counts and a passed deadline are refused; a cancelled parcel is gone.
        assert!(KvPort::<CpuBackend>::send(&mut a, &be, &src_cache, &[1, 2], &[3], 1, 9, deadline).is_err());
        let past = Instant::now();
        assert!(matches!(
            KvPort::<CpuBackend>::send(&mut a, &be, &src_cache, &[1], &[3], 1, 9, past),
            Err(EngineError::Timeout(_))
        ));
        assert!(matches!(b.poll_recv(&be, &mut dst_cache, &[3], 0, 9, past), Err(EngineError::Timeout(_))));
        KvPort::<CpuBackend>::send(&mut a, &be, &src_cache, &[1], &[3], 1, 10, deadline).unwrap();
        KvPort::<CpuBackend>::cancel(&mut b, 0, 10);
        assert_eq!(hub.pending(), 0);
    }
}
