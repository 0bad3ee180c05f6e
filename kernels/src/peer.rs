//! The one-shot all-reduce over peer memory (`cu/peer.cu`): each rank's region of staging
//! buffers and flags, allocated with `cuMemAlloc` (not the stream-ordered pool, whose memory a
//! peer context may not map without pool access rules) and freed with it; peer access between
//! this rank's context and a peer GPU's; the launch.

use std::sync::Arc;

use cudarc::driver::{result as drv, sys as drv_sys, CudaContext};

use crate::{Arg, Gpu, KernelError, Result};

/// The most ranks one all-reduce spans (`PEER_MAX_RANKS` in peer.cu).
pub const PEER_MAX_RANKS: usize = 8;
/// Blocks of every call (`PEER_BLOCKS` in peer.cu).
const PEER_BLOCKS: usize = 32;
/// Bytes after the two staging buffers: two flag arrays, per-block call counters, the status word.
const PEER_TAIL: usize = (2 * PEER_BLOCKS * PEER_MAX_RANKS + PEER_BLOCKS + 1) * 4;

/// Device memory from `cuMemAlloc`, freed on drop in the context that allocated it.
pub struct PeerMem {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl PeerMem {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for PeerMem {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `malloc_sync` in this context and is freed once, here. No
            // kernel reads it afterwards: this rank's own stream is past its last step (the
            // owner settles every step), and the peers' are too, since the engine drops a
            // line's regions only after every rank of the line reached teardown
            // (`PeerLine`'s board).
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

/// One rank's endpoint of a peer all-reduce: its region, the device table of every rank's region
/// (by rank in the group), its rank.
pub struct PeerAllReduce {
    region: PeerMem,
    table: PeerMem,
    rank: usize,
    ranks: usize,
    cap: usize,
}

impl Gpu {
    /// Whether kernels on GPU `a` can read memory of GPU `b` (`cuDeviceCanAccessPeer`; any pair
    /// can be asked from any thread).
    pub fn can_access(a: usize, b: usize) -> Result<bool> {
        if a == b {
            return Ok(true);
        }
        let (da, db) = (drv::device::get(a as i32)?, drv::device::get(b as i32)?);
        let mut can = 0;
        // SAFETY: plain out-parameter query of two valid device handles.
        unsafe { drv_sys::cuDeviceCanAccessPeer(&mut can, da, db) }.result()?;
        Ok(can != 0)
    }

    /// Lets this GPU's context map memory that GPU `peer`'s primary context allocated. The
    /// peer's context is only named here (retained for the call, then released): it stays made,
    /// current and used on its own rank's thread.
    pub fn enable_peer_access(&self, peer: usize) -> Result<()> {
        if peer == self.ctx.ordinal() {
            return Ok(());
        }
        let peer_dev = drv::device::get(peer as i32)?;
        let mut peer_ctx: drv_sys::CUcontext = std::ptr::null_mut();
        self.ctx.bind_to_thread()?;
        // SAFETY: `peer_ctx` is a plain out-parameter; `peer_dev` is a valid device. Retaining
        // adds a reference to the primary context that the peer's rank already made (the
        // board is only passed once every rank has its GPU open), so nothing is created here.
        unsafe { drv_sys::cuDevicePrimaryCtxRetain(&mut peer_ctx, peer_dev) }.result()?;
        // SAFETY: `peer_ctx` was just retained and stays alive until the release below; the
        // current context is this rank's (bound above), the one that gains the mapping.
        let r = unsafe { drv_sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        // SAFETY: releases exactly the reference retained above; `peer_ctx` is not used after.
        unsafe { drv_sys::cuDevicePrimaryCtxRelease_v2(peer_dev) }.result()?;
        match r {
            drv_sys::CUresult::CUDA_SUCCESS | drv_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            e => Err(e.result().unwrap_err().into()),
        }
    }

    /// Zeroed device memory of `bytes` from `cuMemAlloc`.
    pub fn peer_mem(&self, bytes: usize) -> Result<PeerMem> {
        self.no_capture("allocate peer memory")?;
        self.ctx.bind_to_thread()?;
        // SAFETY: a fresh allocation of `bytes`, owned by the returned PeerMem.
        let ptr = unsafe { drv::malloc_sync(bytes) }?;
        let mem = PeerMem { ptr, bytes, ctx: self.ctx.clone() };
        // SAFETY: `ptr` addresses `bytes` bytes just allocated in this context.
        unsafe { drv::memset_d8_sync(ptr, 0, bytes) }?;
        Ok(mem)
    }
}

impl PeerAllReduce {
    /// This rank's region for sums of up to `max_f32` values (a multiple of 4); publish its
    /// [`PeerMem::ptr`] to the peers, then [`PeerAllReduce::connect`].
    pub fn region(gpu: &Gpu, max_f32: usize) -> Result<PeerMem> {
        if max_f32 == 0 || !max_f32.is_multiple_of(4) {
            return Err(KernelError::Invalid(format!(
                "peer all-reduce of {max_f32} values (a positive multiple of 4)"
            )));
        }
        gpu.peer_mem(2 * max_f32 * 4 + PEER_TAIL)
    }

    /// This rank's endpoint: `region` from [`PeerAllReduce::region`], `bases` every rank's region
    /// pointer in rank order (peer access to their GPUs already enabled).
    ///
    /// # Safety
    /// Each of `bases` is the [`PeerMem::ptr`] of that rank's region, made by
    /// [`PeerAllReduce::region`] for the same `max_f32`: [`PeerAllReduce::all_reduce_f32`] writes
    /// into them.
    pub unsafe fn connect(gpu: &Gpu, region: PeerMem, bases: &[u64], rank: usize) -> Result<Self> {
        let ranks = bases.len();
        if !(2..=PEER_MAX_RANKS).contains(&ranks) || rank >= ranks || bases[rank] != region.ptr {
            return Err(KernelError::Invalid(format!("peer all-reduce: rank {rank} of {ranks} (2 to 8)")));
        }
        let cap = (region.bytes - PEER_TAIL) / 2;
        let table = gpu.peer_mem(ranks * 8)?;
        // SAFETY: `table` was just allocated with one u64 per rank.
        unsafe { gpu.htod(bases, table.ptr) }?;
        Ok(PeerAllReduce { region, table, rank, ranks, cap })
    }

    /// The most f32 values one call sums.
    pub fn max_f32(&self) -> usize {
        self.cap / 4
    }

    /// Queues the sum of `count` f32 values at `x` over the ranks, in place, on `gpu`'s stream:
    /// one-shot (every rank reads every peer's whole buffer) or, with `two_shot`, each rank
    /// reducing its chunk and then gathering the others' (fewer bytes over the links, one more
    /// wait). Every rank must make the same calls in the same order.
    ///
    /// # Safety
    /// `x` must address `count` f32 values of `gpu`'s memory that stay allocated until the
    /// stream passes the kernel; the peers' regions must stay allocated while any rank may run it.
    pub unsafe fn all_reduce_f32(&self, gpu: &Gpu, x: u64, count: usize, two_shot: bool) -> Result<()> {
        if count > self.max_f32() || !count.is_multiple_of(4) {
            return Err(KernelError::Invalid(format!(
                "peer all-reduce of {count} values (a multiple of 4, at most {})",
                self.max_f32()
            )));
        }
        let args = [
            Arg::Ptr(self.table.ptr),
            Arg::Ptr(x),
            Arg::I32(count as i32),
            Arg::I32(self.rank as i32),
            Arg::I32(self.ranks as i32),
            Arg::U64(self.cap as u64),
            Arg::I32(two_shot as i32),
        ];
        gpu.launch("peer_all_reduce_f32", (PEER_BLOCKS as u32, 1, 1), 512, 0, &args)
    }

    /// Whether a wait of an earlier call timed out (a peer never came): its sums are wrong.
    /// Reads the status word (synchronizes the stream).
    pub fn timed_out(&self, gpu: &Gpu) -> Result<bool> {
        let mut s = [0u32];
        // SAFETY: the region's last word (inside its `2 cap + PEER_TAIL` bytes) is the u32 status.
        unsafe { gpu.dtoh(self.region.ptr + (2 * self.cap + PEER_TAIL - 4) as u64, &mut s) }?;
        Ok(s[0] != 0)
    }
}
