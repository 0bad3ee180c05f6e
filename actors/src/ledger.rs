//! Load a dispatcher promised to a rank before the work arrives there. The router and the
//! KV-transfer actor place requests by free blocks and queued work, so what is on its way must
//! count as if it had arrived; a [`Ledger`] travels with the request and takes its share back
//! when dropped (the request arrived, finished its first token, or is gone).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What one rank has been promised and not yet received.
#[derive(Default)]
pub(crate) struct Promised {
    seqs: AtomicUsize,
    blocks: AtomicUsize,
    reqs: AtomicUsize,
    tokens: AtomicUsize,
}

impl Promised {
    /// Sequences on their way to this (decode) rank.
    pub fn seqs(&self) -> usize {
        self.seqs.load(Ordering::Relaxed)
    }

    /// KV blocks those sequences will take.
    pub fn blocks(&self) -> usize {
        self.blocks.load(Ordering::Relaxed)
    }

    /// Requests queued on this (prefill) rank whose first token is not sampled yet.
    pub fn reqs(&self) -> usize {
        self.reqs.load(Ordering::Relaxed)
    }

    /// Their prompt tokens.
    pub fn tokens(&self) -> usize {
        self.tokens.load(Ordering::Relaxed)
    }
}

/// One request's share of a rank's [`Promised`] load, returned on drop.
pub(crate) struct Ledger {
    on: Arc<Promised>,
    seqs: usize,
    blocks: usize,
    reqs: usize,
    tokens: usize,
}

impl Ledger {
    /// Decode side: one sequence needing `blocks` KV blocks.
    pub fn decode(on: &Arc<Promised>, blocks: usize) -> Self {
        Self::new(on, 1, blocks, 0, 0)
    }

    /// Prefill side: one request of `tokens` prompt tokens.
    pub fn prefill(on: &Arc<Promised>, tokens: usize) -> Self {
        Self::new(on, 0, 0, 1, tokens)
    }

    fn new(on: &Arc<Promised>, seqs: usize, blocks: usize, reqs: usize, tokens: usize) -> Self {
        on.seqs.fetch_add(seqs, Ordering::Relaxed);
        on.blocks.fetch_add(blocks, Ordering::Relaxed);
        on.reqs.fetch_add(reqs, Ordering::Relaxed);
        on.tokens.fetch_add(tokens, Ordering::Relaxed);
        Ledger { on: on.clone(), seqs, blocks, reqs, tokens }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let p = &self.on;
        p.seqs.fetch_sub(self.seqs, Ordering::Relaxed);
        p.blocks.fetch_sub(self.blocks, Ordering::Relaxed);
        p.reqs.fetch_sub(self.reqs, Ordering::Relaxed);
        p.tokens.fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_gives_its_share_back_when_dropped() {
        let p = Arc::new(Promised::default());
        let a = Ledger::decode(&p, 3);
        let b = Ledger::prefill(&p, 40);
        assert_eq!((p.seqs(), p.blocks(), p.reqs(), p.tokens()), (1, 3, 1, 40));
        drop(a);
        assert_eq!((p.seqs(), p.blocks(), p.reqs(), p.tokens()), (0, 0, 1, 40));
        drop(b);
        assert_eq!((p.seqs(), p.blocks(), p.reqs(), p.tokens()), (0, 0, 0, 0));
    }
}
