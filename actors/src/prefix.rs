//! What each rank's prefix cache holds, as the router sees it: the rank's thread applies its
//! engine's store/evict events after every step (a few hashes per step), and the router asks how
//! many leading blocks of a prompt a rank caches (NVIDIA Dynamo's KV-event indexer, per rank).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cleave_engine::kv_cache::{BlockHash, CacheEvent};

/// The cached prefixes of one rank (of its group's DP ranks together).
#[derive(Default)]
pub(crate) struct PrefixIndex {
    /// Hash -> how many DP ranks of the group cache it.
    copies: Mutex<HashMap<BlockHash, u32>>,
}

impl PrefixIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<BlockHash, u32>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn apply(&self, events: &[CacheEvent]) {
        if events.is_empty() {
            return;
        }
        let mut m = self.lock();
        for e in events {
            match *e {
                CacheEvent::Stored(h) => *m.entry(h).or_default() += 1,
                CacheEvent::Evicted(h) => {
                    if let Some(n) = m.get_mut(&h) {
                        *n -= 1;
                        if *n == 0 {
                            m.remove(&h);
                        }
                    }
                }
            }
        }
    }

    /// Leading blocks of `hashes` cached here.
    pub fn matched(&self, hashes: &[BlockHash]) -> usize {
        if hashes.is_empty() {
            return 0;
        }
        let m = self.lock();
        hashes.iter().take_while(|h| m.contains_key(h)).count()
    }
}

/// A total a rank publishes, and how much of it a Prometheus counter has taken.
#[derive(Default)]
pub(crate) struct Tally {
    total: AtomicU64,
    counted: AtomicU64,
}

impl Tally {
    pub fn set(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// What was published since the last call (for a counter that never goes back).
    pub fn take_new(&self) -> u64 {
        let now = self.get();
        now.saturating_sub(self.counted.swap(now, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cleave_engine::kv_cache::block_hashes;

    #[test]
    fn the_index_follows_stores_and_evictions_per_copy() {
        let h = block_hashes(&[1, 2, 3, 4, 5, 6], 2);
        let ix = PrefixIndex::default();
        ix.apply(&[CacheEvent::Stored(h[0]), CacheEvent::Stored(h[1]), CacheEvent::Stored(h[0])]);
        assert_eq!(ix.matched(&h), 2);
        ix.apply(&[CacheEvent::Evicted(h[0])]);
        assert_eq!(ix.matched(&h), 2, "another DP rank still caches it");
        ix.apply(&[CacheEvent::Evicted(h[0])]);
        assert_eq!(ix.matched(&h), 0, "a prefix without its first block is no prefix");
        assert_eq!(ix.matched(&h[1..]), 1);
        let t = Tally::default();
        t.set(5);
        assert_eq!((t.take_new(), t.take_new()), (5, 0));
    }
}
