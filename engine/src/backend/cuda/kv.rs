//! The latent KV cache on the GPU: its layout, block export/import through the host (recompute
//! and tests), and block transfers over NCCL.

use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::nccl::{NcclComm, P2p};
use cleave_kernels::ptr;

use super::{kerr, CudaBackend};
use crate::backend::KvLayout;
use crate::error::{EngineError, Result};

/// The latent cache, block-major `[num_blocks, layers, block_size, width]` bf16: one block of
/// every layer is one contiguous region (what KV transfer moves).
pub struct CudaKvCache {
    pub(super) buf: CudaSlice<u16>,
    /// Reference precision: the cache in f32 instead.
    pub(super) f32: Option<CudaSlice<f32>>,
    pub layout: KvLayout,
}

impl CudaKvCache {
    pub(super) fn base(&self) -> u64 {
        self.f32.as_ref().map_or_else(|| ptr(&self.buf), ptr)
    }

    /// Device address and byte length of block `b` (all layers).
    pub fn block_region(&self, b: u32) -> (u64, usize) {
        let bytes = self.layout.block_values() * if self.f32.is_some() { 4 } else { 2 };
        (self.base() + b as u64 * bytes as u64, bytes)
    }
}

pub(super) fn export(be: &CudaBackend, cache: &CudaKvCache, blocks: &[u32]) -> Result<Vec<f32>> {
    let per = cache.layout.block_values();
    if let Some(&b) = blocks.iter().find(|&&b| b as usize >= cache.layout.num_blocks) {
        return Err(EngineError::Backend(format!("export_blocks: block {b} outside the cache")));
    }
    let out = be.alloc_f32(blocks.len() * per)?;
    let bp = be.upload_u32("blocks", blocks)?;
    match &cache.f32 {
        // SAFETY: the f32 cache holds every block listed in the uploaded block ids, and the output
        // holds that many whole blocks: live buffers of this GPU.
        Some(f) => unsafe { be.gpu.kv_gather_f32(ptr(f), bp, ptr(&out), blocks.len(), per) },
        // SAFETY: the cache holds every block listed in the uploaded block ids, and the output buffer
        // holds that many whole blocks: live buffers of this GPU.
        None => unsafe { be.gpu.kv_export(ptr(&cache.buf), bp, ptr(&out), blocks.len(), per) },
    }
    .map_err(kerr)?;
    let mut v = vec![0f32; blocks.len() * per];
    // SAFETY: the source is a live allocation of this GPU holding as many values of the
    // destination's plain numeric type.
    unsafe { be.gpu.dtoh(ptr(&out), &mut v) }.map_err(kerr)?;
    Ok(v)
}

pub(super) fn import(be: &CudaBackend, cache: &mut CudaKvCache, blocks: &[u32], data: &[f32]) -> Result<()> {
    let per = cache.layout.block_values();
    if data.len() != blocks.len() * per {
        return Err(EngineError::Backend(format!(
            "import_blocks: {} values for {} blocks of {per}",
            data.len(),
            blocks.len()
        )));
    }
    if let Some(&b) = blocks.iter().find(|&&b| b as usize >= cache.layout.num_blocks) {
        return Err(EngineError::Backend(format!("import_blocks: block {b} outside the cache")));
    }
    let src = be.buf::<f32>(data.len())?;
    // SAFETY: the destination is a live allocation of this GPU holding as many values as the
    // source.
    unsafe { be.gpu.htod(data, ptr(&src)) }.map_err(kerr)?;
    let bp = be.upload_u32("blocks", blocks)?;
    match &cache.f32 {
        // SAFETY: the f32 cache holds every block listed in the uploaded block ids, and the input
        // holds that many whole blocks: live buffers of this GPU.
        Some(f) => unsafe { be.gpu.kv_scatter_f32(ptr(&src), bp, ptr(f), blocks.len(), per) },
        // SAFETY: the cache holds every block listed in the uploaded block ids, and the input buffer
        // holds that many whole blocks: live buffers of this GPU.
        None => unsafe { be.gpu.kv_import(ptr(&src), bp, ptr(&cache.buf), blocks.len(), per) },
    }
    .map_err(kerr)
}

/// KV blocks over NCCL: every block is one contiguous region (all layers), so a transfer is one
/// group of point-to-point operations straight between the two caches (no staging). Both sides
/// list the same number of blocks in the same order (ids may differ) and derive the same
/// operations from both lists: each run of blocks consecutive on both sides is one operation.
impl CudaBackend {
    /// Queues sending `blocks` of `cache` into the peer's `theirs`. Complete with [`NcclComm::wait`].
    pub fn kv_send(
        &self,
        comm: &NcclComm,
        cache: &CudaKvCache,
        blocks: &[u32],
        theirs: &[u32],
        peer: usize,
    ) -> Result<()> {
        let sends = Self::regions(cache, blocks, theirs, peer)?;
        // SAFETY: every send and receive names a live buffer of this GPU of its byte count, kept
        // until the transfer completes (the caller waits on it before reusing them).
        unsafe { comm.transfer(&self.gpu, &sends, &[]) }.map_err(kerr)
    }

    /// Queues receiving the peer's `theirs` into `blocks` of `cache`.
    pub fn kv_recv(
        &self,
        comm: &NcclComm,
        cache: &mut CudaKvCache,
        blocks: &[u32],
        theirs: &[u32],
        peer: usize,
    ) -> Result<()> {
        let recvs = Self::regions(cache, blocks, theirs, peer)?;
        // SAFETY: every send and receive names a live buffer of this GPU of its byte count, kept
        // until the transfer completes (the caller waits on it before reusing them).
        unsafe { comm.transfer(&self.gpu, &[], &recvs) }.map_err(kerr)
    }

    /// The raw bf16 contents of `blocks` (tests and checksums).
    pub fn kv_raw(&self, cache: &CudaKvCache, blocks: &[u32]) -> Result<Vec<u16>> {
        let per = cache.layout.block_values() * if cache.f32.is_some() { 2 } else { 1 };
        let mut out = vec![0u16; blocks.len() * per];
        let mut at = 0;
        for p in Self::regions(cache, blocks, blocks, 0)? {
            let n = p.bytes / 2;
            // SAFETY: the source is a live allocation of this GPU holding as many values of the
            // destination's plain numeric type.
            unsafe { self.gpu.dtoh(p.ptr, &mut out[at..at + n]) }.map_err(kerr)?;
            at += n;
        }
        Ok(out)
    }

    /// This side's regions of a transfer between `mine` and the peer's `theirs`.
    pub(crate) fn regions(cache: &CudaKvCache, mine: &[u32], theirs: &[u32], peer: usize) -> Result<Vec<P2p>> {
        if mine.len() != theirs.len() {
            return Err(EngineError::Backend(format!(
                "KV transfer: {} blocks here, {} on the peer",
                mine.len(),
                theirs.len()
            )));
        }
        if let Some(&b) = mine.iter().find(|&&b| b as usize >= cache.layout.num_blocks) {
            return Err(EngineError::Backend(format!("KV transfer: block {b} outside the cache")));
        }
        Ok(paired_runs(mine, theirs)
            .into_iter()
            .map(|(start, len)| {
                let (ptr, bytes) = cache.block_region(start);
                P2p { ptr, bytes: bytes * len, peer }
            })
            .collect())
    }
}

/// `(first block of mine, blocks)` of each maximal run where both lists go up by one.
pub(crate) fn paired_runs(mine: &[u32], theirs: &[u32]) -> Vec<(u32, usize)> {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for i in 0..mine.len() {
        let extends = i > 0 && mine[i] == mine[i - 1].wrapping_add(1) && theirs[i] == theirs[i - 1].wrapping_add(1);
        match runs.last_mut() {
            Some(run) if extends => run.1 += 1,
            _ => runs.push((mine[i], 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::paired_runs;

    #[test]
    fn runs_break_where_either_side_breaks() {
        assert_eq!(paired_runs(&[4, 5, 6, 7], &[10, 11, 12, 13]), vec![(4, 4)]);
        assert_eq!(paired_runs(&[4, 5, 6, 7], &[10, 11, 20, 21]), vec![(4, 2), (6, 2)]);
        assert_eq!(paired_runs(&[4, 5, 9, 10], &[1, 2, 3, 4]), vec![(4, 2), (9, 2)]);
        assert_eq!(paired_runs(&[3, 2, 1], &[1, 2, 3]), vec![(3, 1), (2, 1), (1, 1)]);
        assert_eq!(paired_runs(&[], &[]), vec![]);
        // The peer computes the same cut points from the swapped lists.
        let (a, b) = ([0u32, 1, 2, 7, 8, 3], [5u32, 6, 9, 10, 11, 12]);
        let lens = |r: Vec<(u32, usize)>| r.into_iter().map(|x| x.1).collect::<Vec<_>>();
        assert_eq!(lens(paired_runs(&a, &b)), lens(paired_runs(&b, &a)));
    }
}
