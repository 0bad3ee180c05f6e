//! Block bookkeeping for the paged latent KV cache of one rank: an allocator with reference
//! counts and, on top, automatic prefix caching. The cache memory itself belongs to the backend.
//!
//! Prefix caching (vLLM v1's scheme): every full block of computed tokens is named by a hash of
//! its tokens chained to the hash of the block before it, so a hash stands for the whole prefix
//! up to the end of its block. A block released by its last sequence keeps its contents and its
//! hash and waits in LRU order; a new sequence whose prompt starts with the same blocks shares
//! them instead of computing them again. Blocks are evicted, oldest first, only when no free
//! block is left.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Names the tokens of one full block and every block before it. 128 bits: a collision would
/// silently attend over another prompt's KV, so it must be out of reach, not just unlikely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// The hash of the block holding `tokens` after the prefix named by `parent`.
    pub fn of(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        let half = |seed: u64| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            parent.hash(&mut h);
            tokens.hash(&mut h);
            h.finish() as u128
        };
        BlockHash(half(0x9e37_79b9_7f4a_7c15) << 64 | half(0xc2b2_ae3d_27d4_eb4f))
    }
}

/// Extends `hashes` (the chain of the first `hashes.len()` full blocks of `tokens`) to every
/// full block of `tokens[..upto]`.
pub fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], upto: usize, block_size: usize) {
    let full = upto.min(tokens.len()) / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        hashes.push(BlockHash::of(hashes.last().copied(), &tokens[i * block_size..(i + 1) * block_size]));
    }
}

/// The hash chain of every full block of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut h = Vec::new();
    extend_hashes(&mut h, tokens, tokens.len(), block_size);
    h
}

/// A change to the set of cached prefixes, for indexes kept outside the engine (the router's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheEvent {
    Stored(BlockHash),
    Evicted(BlockHash),
}

/// Counters of one pool's prefix cache (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up, and how many of them were found cached.
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    pub evicted_blocks: u64,
    /// Blocks holding a cached prefix now (in use or evictable).
    pub cached_blocks: usize,
}

/// Hands out physical block ids `0..num_blocks`, with reference counts and (when enabled) a
/// prefix cache over released blocks.
#[derive(Debug)]
pub struct BlockPool {
    /// Blocks with no reference and nothing cached.
    free: Vec<u32>,
    refs: Vec<u32>,
    caching: bool,
    hash_of: Vec<Option<BlockHash>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Cached blocks with no reference, by the tick of their release (oldest first).
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    tick: u64,
    stats: PrefixStats,
    events: Vec<CacheEvent>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks; `caching` turns prefix caching on.
    pub fn new(num_blocks: usize, caching: bool) -> Self {
        BlockPool {
            free: (0..num_blocks as u32).rev().collect(),
            refs: vec![0; num_blocks],
            caching,
            hash_of: vec![None; num_blocks],
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            released_at: vec![0; num_blocks],
            tick: 0,
            stats: PrefixStats::default(),
            events: Vec::new(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks a sequence can get: free ones plus cached ones nobody uses.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks referenced by a sequence or a reservation.
    pub fn num_used(&self) -> usize {
        self.refs.len() - self.num_free()
    }

    pub fn caching(&self) -> bool {
        self.caching
    }

    pub fn stats(&self) -> PrefixStats {
        PrefixStats { cached_blocks: self.by_hash.len(), ..self.stats }
    }

    /// Changes to the cached set since the last call.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// `n` blocks, all or nothing: free blocks first, then the least recently released cached
    /// blocks (their prefixes are forgotten).
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.num_free() {
            return None;
        }
        let mut blocks = self.free.split_off(self.free.len() - n.min(self.free.len()));
        while blocks.len() < n {
            let (_, b) = self.lru.pop_first().expect("counted above");
            self.forget(b);
            self.stats.evicted_blocks += 1;
            blocks.push(b);
        }
        for &b in &blocks {
            debug_assert_eq!(self.refs[b as usize], 0);
            self.refs[b as usize] = 1;
        }
        Some(blocks)
    }

    fn forget(&mut self, b: u32) {
        if let Some(h) = self.hash_of[b as usize].take() {
            self.by_hash.remove(&h);
            self.events.push(CacheEvent::Evicted(h));
        }
    }

    /// Adds a reference to a block in use or cached (a sequence sharing it).
    fn take_ref(&mut self, block: u32) {
        if self.refs[block as usize] == 0 {
            let removed = self.lru.remove(&self.released_at[block as usize]);
            assert_eq!(removed, Some(block), "block {block} is neither in use nor cached");
        }
        self.refs[block as usize] += 1;
    }

    /// Adds a reference to an allocated block (a second sequence sharing it).
    pub fn share(&mut self, block: u32) {
        assert!(self.refs[block as usize] > 0, "sharing free block {block}");
        self.take_ref(block);
    }

    /// Drops one reference to each block, last block first (so that a sequence's tail is
    /// evicted before its head); a block with none left is cached if it holds a prefix, else
    /// free.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            assert!(*r > 0, "double free of block {b}");
            *r -= 1;
            if *r > 0 {
                continue;
            }
            if self.hash_of[b as usize].is_some() {
                self.tick += 1;
                self.released_at[b as usize] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Takes a reference to each cached block of the longest cached prefix of `hashes`, at most
    /// `max_blocks` of them.
    pub fn lookup(&mut self, hashes: &[BlockHash], max_blocks: usize) -> Vec<u32> {
        let found = self.cached_prefix(hashes).min(max_blocks);
        let blocks: Vec<u32> = hashes[..found].iter().map(|h| self.by_hash[h]).collect();
        for &b in &blocks {
            self.take_ref(b);
        }
        blocks
    }

    /// Counts a lookup of `tokens` prompt tokens of which `hits` were found cached.
    pub fn note_query(&mut self, tokens: usize, hits: usize) {
        if self.caching {
            self.stats.queried_tokens += tokens as u64;
            self.stats.hit_tokens += hits as u64;
        }
    }

    /// How many leading blocks of `hashes` are cached, without taking them.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes.iter().take_while(|h| self.by_hash.contains_key(h)).count()
    }

    /// Records that `block` (in use, fully computed) holds the prefix named by `hash`. A prefix
    /// already cached in another block keeps that block.
    pub fn register(&mut self, block: u32, hash: BlockHash) {
        if !self.caching || self.hash_of[block as usize].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        debug_assert!(self.refs[block as usize] > 0);
        self.hash_of[block as usize] = Some(hash);
        self.by_hash.insert(hash, block);
        self.events.push(CacheEvent::Stored(hash));
    }
}

/// How much more load (sequences) than the least loaded candidate a rank may carry and still be
/// chosen for the prefix it caches.
pub const CACHE_LOAD_SLACK: usize = 16;

/// Cache-aware placement: among candidates `(load, cached blocks, key)`, the one with the most
/// cached blocks among those within [`CACHE_LOAD_SLACK`] of the least load, then the smallest
/// `key`. Returns its index.
pub fn pick_cached<K: Ord>(cands: &[(usize, usize, K)]) -> Option<usize> {
    let least = cands.iter().map(|c| c.0).min()?;
    (0..cands.len()).min_by_key(|&i| {
        let (load, cached, ref key) = cands[i];
        (std::cmp::Reverse(if load <= least + CACHE_LOAD_SLACK { cached } else { 0 }), key)
    })
}

/// Blocks needed to hold `tokens` tokens.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_all_or_nothing_and_refcounted() {
        let mut a = BlockPool::new(4, false);
        let x = a.alloc(3).unwrap();
        assert!(a.alloc(2).is_none());
        assert_eq!(a.num_free(), 1);
        a.share(x[0]);
        a.release(&x);
        assert_eq!(a.num_used(), 1, "the shared block stays");
        a.release(&x[..1]);
        assert_eq!(a.num_free(), 4);
        assert_eq!(blocks_for(65, 64), 2);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut a = BlockPool::new(2, false);
        let x = a.alloc(1).unwrap();
        a.release(&x);
        a.release(&x);
    }

    #[test]
    fn hashes_name_the_whole_prefix() {
        let a = block_hashes(&[1, 2, 3, 4, 5], 2);
        assert_eq!(a.len(), 2, "only full blocks are named");
        let b = block_hashes(&[9, 9, 3, 4], 2);
        assert_ne!(a[1], b[1], "same block after a different prefix");
        assert_eq!(a[..2], block_hashes(&[1, 2, 3, 4], 2)[..]);
    }

    #[test]
    fn released_prefixes_are_found_again_until_evicted_oldest_first() {
        let mut p = BlockPool::new(4, true);
        let h = block_hashes(&[1, 2, 3, 4, 5, 6], 2);
        let a = p.alloc(3).unwrap();
        for (b, h) in a.iter().zip(&h) {
            p.register(*b, *h);
        }
        p.release(&a);
        assert_eq!((p.num_free(), p.num_used(), p.stats().cached_blocks), (4, 0, 3));
        let again = p.lookup(&h[..2], 8);
        assert_eq!(again, a[..2]);
        p.note_query(5, 4);
        assert_eq!((p.stats().hit_tokens, p.stats().queried_tokens), (4, 5));
        p.release(&again);
        // Free block first, then the least recently released: the tail block a[2] (released
        // first, since release goes tail to head).
        let b = p.alloc(2).unwrap();
        assert!(b.contains(&a[2]), "{b:?} {a:?}");
        assert_eq!(p.stats().evicted_blocks, 1);
        assert_eq!(p.cached_prefix(&h), 2);
        let ev = p.take_events();
        assert_eq!(ev.iter().filter(|e| matches!(e, CacheEvent::Stored(_))).count(), 3);
        assert_eq!(ev.last(), Some(&CacheEvent::Evicted(h[2])));
    }

    #[test]
    fn a_disabled_cache_frees_and_finds_nothing() {
        let mut p = BlockPool::new(2, false);
        let h = block_hashes(&[1, 2], 2);
        let a = p.alloc(1).unwrap();
        p.register(a[0], h[0]);
        p.release(&a);
        assert!(p.lookup(&h, 1).is_empty());
        p.note_query(2, 0);
        assert_eq!(p.stats(), PrefixStats::default());
        assert!(p.take_events().is_empty());
    }

    #[test]
    fn placement_prefers_the_cache_within_the_load_slack() {
        // (load, cached, key): the cached rank wins unless it is far busier.
        assert_eq!(pick_cached(&[(0, 0, 0), (3, 5, 1)]), Some(1));
        assert_eq!(pick_cached(&[(0, 0, 0), (CACHE_LOAD_SLACK + 1, 5, 1)]), Some(0));
        assert_eq!(pick_cached(&[(2, 0, 7), (1, 0, 3)]), Some(1), "no cache: the key decides");
        assert_eq!(pick_cached::<u8>(&[]), None);
    }

    #[test]
    fn a_duplicate_prefix_keeps_the_first_block() {
        let mut p = BlockPool::new(3, true);
        let h = block_hashes(&[7, 7], 2);
        let a = p.alloc(2).unwrap();
        p.register(a[0], h[0]);
        p.register(a[1], h[0]);
        p.release(&a);
        assert_eq!(p.stats().cached_blocks, 1);
        assert_eq!(p.lookup(&h, 1), vec![a[0]]);
    }
}
