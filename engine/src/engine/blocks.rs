//! KV blocks across a group's DP ranks, for transfers: the group's block ids number the DP ranks'
//! caches one after another (`dp * num_blocks + block`), so a reservation names its DP rank. A
//! transfer between groups runs on the ranks' KV ports (`crate::kv_port`): the sampling rank of
//! the sending DP rank sends to every TP rank of the receiving DP rank.

use std::time::{Duration, Instant};

use super::{Engine, ReqState, Request};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::kv_cache::blocks_for;
use crate::kv_port::{KvPort, MemHub};
use crate::scheduler::SeqId;

/// How long an in-process move may take (the send and the receive are host copies).
const IN_PROCESS_MOVE: Duration = Duration::from_secs(60);

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

    /// Gives a group of one its KV port (a group's ranks get theirs from its runner factory).
    pub fn set_port(&mut self, port: Box<dyn KvPort<B>>) -> Result<()> {
        if self.group.parallel().world() > 1 {
            return Err(EngineError::Config("a group's KV ports come from its runner factory".into()));
        }
        self.group.set_local_port(port);
        Ok(())
    }

    /// The KV port id of the rank that sends held request `id`'s KV (the sampling rank of its DP
    /// rank).
    pub fn kv_sender(&self, id: SeqId) -> Option<usize> {
        let dp = *self.placed.get(&id)?;
        self.group.port_ranks(dp)?.first().copied()
    }

    /// The KV port ids of the ranks that receive into `blocks` (group ids, as reserved): every
    /// TP rank of their DP rank.
    pub fn kv_receivers(&self, blocks: &[u32]) -> Result<Vec<usize>> {
        let (dp, _) = self.to_local(blocks)?;
        self.group.port_ranks(dp).ok_or_else(|| EngineError::Config(format!("DP rank {dp}'s ranks have no KV ports")))
    }

    /// Sends held request `id`'s prompt KV from its block `skip` on into `dst_blocks` (the
    /// receiver's reserved blocks it does not cache) of each rank of `dsts`. `prompt_len` is the
    /// sender's view of the prompt, checked against what this group holds.
    pub fn send_kv(
        &mut self,
        id: SeqId,
        prompt_len: usize,
        skip: usize,
        dst_blocks: &[u32],
        dsts: &[usize],
        deadline: Instant,
    ) -> Result<u64> {
        let missing = || EngineError::InvalidRequest(format!("no sequence {id} to send"));
        let dp = *self.placed.get(&id).ok_or_else(missing)?;
        let seq = self.scheds[dp].get(id).ok_or_else(missing)?;
        let n = blocks_for(seq.prompt_len, self.cfg.block_size);
        if seq.prompt_len != prompt_len || skip >= n.max(1) || n - skip != dst_blocks.len() || seq.blocks.len() < n {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {id} holds {} prompt tokens in {} blocks; the transfer names {prompt_len} tokens, skips {skip} \
                 blocks and reserved {}",
                seq.prompt_len,
                seq.blocks.len(),
                dst_blocks.len()
            )));
        }
        let blocks = seq.blocks[skip..n].to_vec();
        self.group.send_kv(dp, &blocks, dst_blocks, dsts, id, deadline)
    }

    /// Polls an incoming transfer into `blocks` (group ids, the reserved ones the sender does not
    /// skip) from port `src`: `Some(bytes)` once every TP rank of their DP rank holds its copy.
    pub fn poll_kv(&mut self, blocks: &[u32], src: usize, req: u64, deadline: Instant) -> Result<Option<u64>> {
        let (dp, local) = self.to_local(blocks)?;
        let tp_size = self.group.parallel().tensor_parallel_size;
        let mut done = self.receiving.remove(&req).unwrap_or_else(|| vec![false; tp_size]);
        let mut bytes = None;
        for (tp, d) in done.iter_mut().enumerate().filter(|(_, d)| !**d) {
            match self.group.poll_kv(dp, tp, &local, src, req, deadline) {
                Ok(Some(b)) => {
                    *d = true;
                    bytes = Some(b);
                }
                Ok(None) => {}
                Err(e) => {
                    self.group.cancel_kv(dp, src, req);
                    return Err(e);
                }
            }
        }
        if done.iter().all(|&d| d) {
            return Ok(Some(bytes.unwrap_or(0)));
        }
        self.receiving.insert(req, done);
        Ok(None)
    }

    /// Forgets an abandoned incoming transfer into `blocks` from port `src` on every rank.
    pub fn cancel_kv(&mut self, blocks: &[u32], src: usize, req: u64) {
        self.receiving.remove(&req);
        if let Ok((dp, _)) = self.to_local(blocks) {
            self.group.cancel_kv(dp, src, req);
        }
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

    /// Gives every rank of this group a port on the in-process hub `hub` (ids `base` + group
    /// rank), for moves between groups of one process ([`Engine::move_prefilled`]).
    pub fn link_in_process(&mut self, hub: &MemHub, base: usize) -> Result<()> {
        self.group.link_in_process(hub, base)
    }

    /// Moves held prefilled request `r` (first token `first`) to `dst` over the two groups' ports,
    /// as a KV transfer between pools does, on this thread: `dst` reserves blocks (sharing its
    /// cached prefix), the blocks it does not cache are sent and received, `dst` admits the request
    /// and this engine releases it. Both groups need ports on one in-process hub
    /// ([`Engine::link_in_process`]; an NCCL send would wait for a receive this thread cannot
    /// post). Returns the bytes moved to each receiving rank.
    pub fn move_prefilled(&mut self, dst: &mut Engine<B>, r: Request, first: u32) -> Result<usize> {
        let id = r.id;
        let (blocks, cached) = dst
            .reserve_blocks(&r.prompt)
            .ok_or_else(|| EngineError::CacheCapacity(format!("no room for the KV of request {id}")))?;
        let deadline = Instant::now() + IN_PROCESS_MOVE;
        let no_port = || EngineError::Config(format!("request {id}'s group has no KV ports"));
        let moved = (|| {
            let sender = self.kv_sender(id).ok_or_else(no_port)?;
            let receivers = dst.kv_receivers(&blocks)?;
            let bytes = self.send_kv(id, r.prompt.len(), cached, &blocks[cached..], &receivers, deadline)?;
            loop {
                if dst.poll_kv(&blocks[cached..], sender, id, deadline)?.is_some() {
                    return Ok(bytes as usize);
                }
            }
        })();
        let admitted = moved.and_then(|bytes| dst.admit_prefilled(r, first, blocks.clone(), cached).map(|()| bytes));
        if admitted.is_err() {
            dst.unreserve_blocks(&blocks);
        }
        self.release(id);
        admitted
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
