//! Continuous batching: every step takes the running sequences' next tokens (decodes and the
//! rest of chunked prefills) under a token budget, then admits waiting sequences while slots,
//! budget and KV blocks allow. When blocks run out, the newest running sequence is preempted
//! and later recomputed from its tokens. A sequence admitted from the queue starts after the
//! longest prefix of its tokens found in the prefix cache; every block it fills is cached.

use std::collections::{HashMap, VecDeque};

use crate::kv_cache::{blocks_for, extend_hashes, BlockHash, BlockPool, CacheEvent, PrefixStats};

/// Identifies a request on this rank.
pub type SeqId = u64;

/// Batching limits of one rank.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Reuse the KV of cached prompt prefixes (vLLM's `enable_prefix_caching`).
    pub enable_prefix_caching: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    /// Prefilled, KV kept for a transfer, not scheduled.
    Held,
}

/// A sequence's tokens and cache state.
#[derive(Debug)]
pub struct Sequence {
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose KV is in the cache.
    pub num_computed: usize,
    pub blocks: Vec<u32>,
    /// Stop after the prompt is prefilled and the first token sampled; keep the KV.
    pub prefill_only: bool,
    /// Prompt tokens found in the prefix cache when the sequence was first admitted.
    pub cached_tokens: usize,
    state: State,
    arrival: u64,
    admitted: bool,
    /// The hash chain of the full blocks of `tokens` computed so far.
    hashes: Vec<BlockHash>,
    /// Leading blocks registered in the prefix cache.
    registered: usize,
}

impl Sequence {
    fn new(tokens: Vec<u32>, prompt_len: usize, prefill_only: bool, state: State, arrival: u64) -> Self {
        Sequence {
            tokens,
            prompt_len,
            num_computed: 0,
            blocks: Vec::new(),
            prefill_only,
            cached_tokens: 0,
            state,
            arrival,
            admitted: false,
            hashes: Vec::new(),
            registered: 0,
        }
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub id: SeqId,
    /// First position computed this step.
    pub start: usize,
    pub len: usize,
    /// Whether this chunk reaches the end of the known tokens, so a token is sampled.
    pub sample: bool,
}

/// The continuous-batching scheduler of one rank.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    alloc: BlockPool,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    next_arrival: u64,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler {
            alloc: BlockPool::new(cfg.num_blocks, cfg.enable_prefix_caching),
            cfg,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            preemptions: 0,
        }
    }

    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }

    /// Queues a sequence whose tokens are all uncomputed.
    pub fn add(&mut self, id: SeqId, tokens: Vec<u32>, prefill_only: bool) {
        let arrival = self.bump();
        let prompt_len = tokens.len();
        self.seqs.insert(id, Sequence::new(tokens, prompt_len, prefill_only, State::Waiting, arrival));
        self.waiting.push_back(id);
    }

    /// Admits a sequence whose first `computed` tokens already sit in `blocks` (a KV transfer;
    /// the first `cached_blocks` were this rank's own cached prefix).
    pub fn add_computed(
        &mut self,
        id: SeqId,
        tokens: Vec<u32>,
        prompt_len: usize,
        computed: usize,
        blocks: Vec<u32>,
        cached_blocks: usize,
    ) {
        let arrival = self.bump();
        let mut s = Sequence::new(tokens, prompt_len, false, State::Running, arrival);
        s.num_computed = computed;
        s.blocks = blocks;
        s.cached_tokens = (cached_blocks * self.cfg.block_size).min(prompt_len);
        s.admitted = true;
        self.alloc.note_query(prompt_len, s.cached_tokens);
        self.seqs.insert(id, s);
        self.running.push(id);
        self.register(id);
    }

    fn bump(&mut self) -> u64 {
        self.next_arrival += 1;
        self.next_arrival
    }

    /// Reserves blocks that belong to no sequence yet for the KV of a prompt of `prompt_len`
    /// tokens whose block hashes are `hashes` (the receiving side of a transfer): its longest
    /// cached prefix, shared, and new blocks for the rest (at least one, so that something always
    /// moves). Returns the blocks and how many of them were cached.
    pub fn reserve(&mut self, prompt_len: usize, hashes: &[BlockHash]) -> Option<(Vec<u32>, usize)> {
        let n = blocks_for(prompt_len, self.cfg.block_size);
        let mut blocks = self.alloc.lookup(hashes, n.saturating_sub(1));
        let cached = blocks.len();
        match self.alloc.alloc(n - cached) {
            Some(fresh) => {
                blocks.extend(fresh);
                Some((blocks, cached))
            }
            None => {
                self.alloc.release(&blocks);
                None
            }
        }
    }

    /// How many leading blocks of a token sequence with block hashes `hashes` this rank's
    /// prefix cache holds.
    pub fn cached_blocks(&self, hashes: &[BlockHash]) -> usize {
        self.alloc.cached_prefix(hashes)
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.alloc.stats()
    }

    /// Changes to the cached prefixes since the last call.
    pub fn take_cache_events(&mut self) -> Vec<CacheEvent> {
        self.alloc.take_events()
    }

    /// Returns reserved blocks that were never admitted.
    pub fn unreserve(&mut self, blocks: &[u32]) {
        self.alloc.release(blocks);
    }

    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// Appends a sampled token.
    pub fn push_token(&mut self, id: SeqId, token: u32) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    /// Stops scheduling a prefill-only sequence, keeping its blocks for a transfer.
    pub fn hold(&mut self, id: SeqId) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.state = State::Held;
            self.running.retain(|&x| x != id);
        }
    }

    /// Removes a sequence wherever it is and frees its blocks. Returns whether it existed.
    pub fn remove(&mut self, id: SeqId) -> bool {
        let Some(s) = self.seqs.remove(&id) else { return false };
        self.alloc.release(&s.blocks);
        match s.state {
            State::Waiting => self.waiting.retain(|&x| x != id),
            State::Running => self.running.retain(|&x| x != id),
            State::Held => {}
        }
        true
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn num_held(&self) -> usize {
        self.seqs.values().filter(|s| s.state == State::Held).count()
    }
    pub fn num_free_blocks(&self) -> usize {
        self.alloc.num_free()
    }
    pub fn num_used_blocks(&self) -> usize {
        self.alloc.num_used()
    }
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }
    /// Prompt tokens not yet computed, over waiting and running sequences.
    pub fn pending_prefill_tokens(&self) -> usize {
        self.seqs.values().filter(|s| s.state != State::Held).map(|s| s.prompt_len.saturating_sub(s.num_computed)).sum()
    }
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    fn grow(&mut self, id: SeqId, upto: usize) -> bool {
        let s = self.seqs.get_mut(&id).expect("scheduled sequence exists");
        let need = blocks_for(upto, self.cfg.block_size).saturating_sub(s.blocks.len());
        match self.alloc.alloc(need) {
            Some(b) => {
                s.blocks.extend(b);
                true
            }
            None => false,
        }
    }

    fn preempt(&mut self, id: SeqId) {
        let s = self.seqs.get_mut(&id).expect("preempted sequence exists");
        self.alloc.release(&s.blocks);
        s.blocks.clear();
        s.num_computed = 0;
        s.registered = 0;
        s.state = State::Waiting;
        self.running.retain(|&x| x != id);
        self.waiting.push_front(id);
        self.preemptions += 1;
    }

    /// Picks this step's work and reserves the blocks it writes. The caller runs the step and
    /// then calls [`Scheduler::commit`].
    pub fn schedule(&mut self) -> Vec<Scheduled> {
        let mut out = Vec::new();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;
        let mut order = self.running.clone();
        order.sort_by_key(|id| self.seqs[id].arrival);
        let mut i = 0;
        while i < order.len() && budget > 0 {
            let id = order[i];
            let (start, len) = {
                let s = &self.seqs[&id];
                (s.num_computed, (s.tokens.len() - s.num_computed).min(budget))
            };
            if len == 0 {
                i += 1;
                continue;
            }
            let mut fits = self.grow(id, start + len);
            while !fits {
                // Preempt the newest running sequence not yet scheduled (possibly this one).
                let victim = *order.last().expect("order holds at least this sequence");
                order.pop();
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    break;
                }
                fits = self.grow(id, start + len);
            }
            if !fits {
                break;
            }
            let sample = start + len == self.seqs[&id].tokens.len();
            out.push(Scheduled { id, start, len, sample });
            budget -= len;
            i += 1;
        }
        if preempted {
            return out;
        }
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else { break };
            self.start_from_cache(id);
            let (start, len, total) = {
                let s = &self.seqs[&id];
                (s.num_computed, (s.tokens.len() - s.num_computed).min(budget), s.tokens.len())
            };
            if !self.grow(id, start + len) {
                let s = self.seqs.get_mut(&id).expect("exists");
                self.alloc.release(&s.blocks);
                s.blocks.clear();
                s.num_computed = 0;
                break;
            }
            self.waiting.pop_front();
            self.seqs.get_mut(&id).expect("exists").state = State::Running;
            self.running.push(id);
            out.push(Scheduled { id, start, len, sample: start + len == total });
            budget -= len;
        }
        out
    }

    /// A sequence about to leave the queue with nothing computed starts after its longest
    /// cached prefix, leaving at least one token to compute (its logits give the next token).
    fn start_from_cache(&mut self, id: SeqId) {
        let bs = self.cfg.block_size;
        let s = self.seqs.get_mut(&id).expect("waiting sequence exists");
        if s.num_computed > 0 || !s.blocks.is_empty() || !self.alloc.caching() {
            return;
        }
        extend_hashes(&mut s.hashes, &s.tokens, s.tokens.len(), bs);
        let max = (s.tokens.len() - 1) / bs;
        s.blocks = self.alloc.lookup(&s.hashes, max);
        s.num_computed = s.blocks.len() * bs;
        s.registered = s.blocks.len();
        // A recomputation after preemption finds its own blocks: no hit for the prompt.
        if !s.admitted {
            s.cached_tokens = s.num_computed.min(s.prompt_len);
        }
    }

    /// Caches the full blocks of computed tokens not cached yet.
    fn register(&mut self, id: SeqId) {
        let bs = self.cfg.block_size;
        let Some(s) = self.seqs.get_mut(&id) else { return };
        if !self.alloc.caching() {
            return;
        }
        extend_hashes(&mut s.hashes, &s.tokens, s.num_computed, bs);
        let full = s.num_computed.min(s.tokens.len()) / bs;
        for i in s.registered..full.min(s.blocks.len()) {
            self.alloc.register(s.blocks[i], s.hashes[i]);
        }
        s.registered = s.registered.max(full.min(s.blocks.len()));
    }

    /// Marks the scheduled tokens as computed and caches the blocks they filled.
    pub fn commit(&mut self, work: &[Scheduled]) {
        for w in work {
            if let Some(s) = self.seqs.get_mut(&w.id) {
                s.num_computed = s.num_computed.max(w.start + w.len);
                if !s.admitted {
                    s.admitted = true;
                    self.alloc.note_query(s.prompt_len, s.cached_tokens);
                }
            }
            self.register(w.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(blocks: usize, budget: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: budget,
            block_size: 4,
            num_blocks: blocks,
            enable_prefix_caching: false,
        }
    }

    #[test]
    fn long_prompt_is_chunked_under_the_budget() {
        let mut s = Scheduler::new(cfg(100, 128));
        s.add(1, vec![7; 300], false);
        let mut chunks = Vec::new();
        loop {
            let w = s.schedule();
            s.commit(&w);
            chunks.push((w[0].start, w[0].len, w[0].sample));
            if w[0].sample {
                break;
            }
        }
        assert_eq!(chunks, vec![(0, 128, false), (128, 128, false), (256, 44, true)]);
        assert_eq!(s.get(1).unwrap().blocks.len(), 75);
    }

    #[test]
    fn decodes_go_first_and_new_prompts_fill_the_budget() {
        let mut s = Scheduler::new(cfg(100, 10));
        s.add(1, vec![1; 3], false);
        let w = s.schedule();
        s.commit(&w);
        s.push_token(1, 5);
        s.add(2, vec![1; 20], false);
        let w = s.schedule();
        assert_eq!(w[0], Scheduled { id: 1, start: 3, len: 1, sample: true });
        assert_eq!(w[1], Scheduled { id: 2, start: 0, len: 9, sample: false });
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_recomputes() {
        let mut s = Scheduler::new(cfg(3, 64));
        s.add(1, vec![1; 4], false);
        s.add(2, vec![1; 4], false);
        let w = s.schedule();
        assert_eq!(w.len(), 2);
        s.commit(&w);
        s.push_token(1, 9);
        s.push_token(2, 9);
        // Both need a second block; only one is free: sequence 2 (newest) is preempted.
        let w = s.schedule();
        assert_eq!(w, vec![Scheduled { id: 1, start: 4, len: 1, sample: true }]);
        assert_eq!(s.preemptions(), 1);
        assert_eq!(s.get(2).unwrap().num_computed, 0);
        s.commit(&w);
        s.remove(1);
        let w = s.schedule();
        assert_eq!(w, vec![Scheduled { id: 2, start: 0, len: 5, sample: true }]);
        s.commit(&w);
        s.remove(2);
        assert_eq!(s.num_used_blocks(), 0);
    }

    #[test]
    fn max_num_seqs_limits_admission_and_remove_frees_everything() {
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_seqs: 2,
            max_num_batched_tokens: 100,
            block_size: 4,
            num_blocks: 50,
            enable_prefix_caching: false,
        });
        for id in 0..5 {
            s.add(id, vec![3; 5], false);
        }
        let w = s.schedule();
        assert_eq!(w.len(), 2);
        assert_eq!(s.num_waiting(), 3);
        for id in 0..5 {
            assert!(s.remove(id));
        }
        assert_eq!(s.num_used_blocks(), 0);
        assert!(!s.has_work());
    }
}
