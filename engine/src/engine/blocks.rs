//! KV blocks across a group's DP ranks, for transfers: the group's block ids number the DP ranks'
//! caches one after another (`dp * num_blocks + block`), so a reservation names its DP rank.

use super::{Engine, ReqState, Request};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::kv_cache::blocks_for;
use crate::scheduler::SeqId;

impl<B: Backend> Engine<B> {
    fn to_group(&self, dp: usize, blocks: &[u32]) -> Vec<u32> {
        let base = (dp * self.cfg.num_blocks) as u32;
        blocks.iter().map(|b| base + b).collect()
    }

    /// The DP rank of group block ids (all on one rank) and their ids in its cache.
    fn to_local(&self, blocks: &[u32]) -> Result<(usize, Vec<u32>)> {
        let nb = self.cfg.num_blocks as u32;
        let dp = blocks.first().map_or(0, |b| (b / nb) as usize);
        if dp >= self.scheds.len() || blocks.iter().any(|b| (b / nb) as usize != dp) {
            return Err(EngineError::InvalidRequest(format!("blocks {blocks:?} are not of one DP rank of this group")));
        }
        Ok((dp, blocks.iter().map(|b| b % nb).collect()))
    }

    /// The held prompt KV of a prefilled request from its block `skip` on (the receiver caches
    /// the blocks before): their contents in block order, and the prompt length.
    pub fn export_kv(&self, id: SeqId, skip: usize) -> Result<(usize, Vec<f32>)> {
        let missing = || EngineError::InvalidRequest(format!("no sequence {id} to export"));
        let dp = *self.placed.get(&id).ok_or_else(missing)?;
        let seq = self.scheds[dp].get(id).ok_or_else(missing)?;
        let n = blocks_for(seq.prompt_len, self.cfg.block_size);
        if skip >= n.max(1) {
            return Err(EngineError::InvalidRequest(format!("skipping {skip} of the {n} blocks of sequence {id}")));
        }
        Ok((seq.prompt_len, self.group.export_blocks(dp, &seq.blocks[skip..n])?))
    }

    /// Frees a held (transferred) request.
    pub fn release(&mut self, id: SeqId) -> bool {
        self.abort(id)
    }

    /// Reserves blocks for the incoming KV of `prompt` on the DP rank caching the longest prefix
    /// of it, then with the most free blocks; returns their group ids and how many leading ones
    /// already hold the prompt's KV (cached: the sender skips them).
    pub fn reserve_blocks(&mut self, prompt: &[u32]) -> Option<(Vec<u32>, usize)> {
        let hashes = self.hashes(prompt);
        let dp = (0..self.scheds.len()).max_by_key(|&d| {
            let s = &self.scheds[d];
            (s.cached_blocks(&hashes), s.num_free_blocks(), usize::MAX - d)
        })?;
        let (local, cached) = self.scheds[dp].reserve(prompt.len(), &hashes)?;
        Some((self.to_group(dp, &local), cached))
    }

    /// Returns reserved blocks after a failed transfer.
    pub fn unreserve_blocks(&mut self, blocks: &[u32]) {
        if let Ok((dp, local)) = self.to_local(blocks) {
            self.scheds[dp].unreserve(&local);
        }
    }

    /// Moves held prefilled request `r` (first token `first`) to `dst` through host memory, as a
    /// host-staged transfer does: `dst` reserves blocks (sharing its cached prefix), the blocks
    /// it does not cache are copied, `dst` admits the request and this engine releases it.
    /// Returns the bytes copied.
    pub fn move_prefilled(&mut self, dst: &mut Engine<B>, r: Request, first: u32) -> Result<usize> {
        let id = r.id;
        let (blocks, cached) = dst
            .reserve_blocks(&r.prompt)
            .ok_or_else(|| EngineError::CacheCapacity(format!("no room for the KV of request {id}")))?;
        let moved = self.export_kv(id, cached).and_then(|(_, data)| {
            dst.import_kv(&blocks[cached..], &data)?;
            Ok(data.len() * std::mem::size_of::<f32>())
        });
        let admitted = moved.and_then(|bytes| dst.admit_prefilled(r, first, blocks.clone(), cached).map(|()| bytes));
        if admitted.is_err() {
            dst.unreserve_blocks(&blocks);
        }
        self.release(id);
        admitted
    }

    /// Writes transferred KV into reserved blocks (on every TP rank of their DP rank); `blocks`
    /// are the reserved ones the sender did not skip.
    pub fn import_kv(&mut self, blocks: &[u32], data: &[f32]) -> Result<()> {
        let (dp, local) = self.to_local(blocks)?;
        self.group.import_blocks(dp, &local, data)
    }

    /// Admits a request whose prompt KV sits in `blocks` (the first `cached` from this rank's
    /// prefix cache, the rest imported) and whose first token was already sampled (and sent to
    /// the client) by a prefill rank.
    pub fn admit_prefilled(&mut self, r: Request, first_token: u32, blocks: Vec<u32>, cached: usize) -> Result<()> {
        self.validate(&r)?;
        let (dp, local) = self.to_local(&blocks)?;
        let state: ReqState = self.state_for(&r, &[first_token])?;
        let prompt_len = r.prompt.len();
        let mut tokens = r.prompt;
        tokens.push(first_token);
        self.scheds[dp].add_computed(r.id, tokens, prompt_len, prompt_len, local, cached);
        self.placed.insert(r.id, dp);
        self.reqs.insert(r.id, state);
        Ok(())
    }
}
