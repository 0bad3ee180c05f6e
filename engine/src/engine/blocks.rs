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

    /// The held prompt KV of a prefilled request: its blocks' contents, covering `prompt_len`
    /// tokens, in block order.
    pub fn export_kv(&self, id: SeqId) -> Result<(usize, Vec<f32>)> {
        let missing = || EngineError::InvalidRequest(format!("no sequence {id} to export"));
        let dp = *self.placed.get(&id).ok_or_else(missing)?;
        let seq = self.scheds[dp].get(id).ok_or_else(missing)?;
        let n = blocks_for(seq.prompt_len, self.cfg.block_size);
        Ok((seq.prompt_len, self.group.export_blocks(dp, &seq.blocks[..n])?))
    }

    /// Frees a held (transferred) request.
    pub fn release(&mut self, id: SeqId) -> bool {
        self.abort(id)
    }

    /// Reserves blocks for an incoming transfer of `tokens` tokens on the DP rank with the most
    /// free blocks; returns their group ids.
    pub fn reserve_blocks(&mut self, tokens: usize) -> Option<Vec<u32>> {
        let n = blocks_for(tokens, self.cfg.block_size);
        let dp = (0..self.scheds.len()).max_by_key(|&d| (self.scheds[d].num_free_blocks(), usize::MAX - d))?;
        let local = self.scheds[dp].reserve(n)?;
        Some(self.to_group(dp, &local))
    }

    /// Returns reserved blocks after a failed transfer.
    pub fn unreserve_blocks(&mut self, blocks: &[u32]) {
        if let Ok((dp, local)) = self.to_local(blocks) {
            self.scheds[dp].unreserve(&local);
        }
    }

    /// Writes transferred KV into reserved blocks (on every TP rank of their DP rank).
    pub fn import_kv(&mut self, blocks: &[u32], data: &[f32]) -> Result<()> {
        let (dp, local) = self.to_local(blocks)?;
        self.group.import_blocks(dp, &local, data)
    }

    /// Admits a request whose prompt KV was imported into `blocks` and whose first token was
    /// already sampled (and sent to the client) by a prefill rank.
    pub fn admit_prefilled(&mut self, r: Request, first_token: u32, blocks: Vec<u32>) -> Result<()> {
        self.validate(&r)?;
        let (dp, local) = self.to_local(&blocks)?;
        let state: ReqState = self.state_for(&r, &[first_token])?;
        let prompt_len = r.prompt.len();
        let mut tokens = r.prompt;
        tokens.push(first_token);
        self.scheds[dp].add_computed(r.id, tokens, prompt_len, prompt_len, local);
        self.placed.insert(r.id, dp);
        self.reqs.insert(r.id, state);
        Ok(())
    }
}
