//! Block bookkeeping for the paged latent KV cache: an O(1) allocator with reference counts
//! (ready for prefix sharing). The cache memory itself belongs to the backend.

/// Hands out physical block ids `0..num_blocks`.
#[derive(Debug)]
pub struct BlockAllocator {
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize) -> Self {
        BlockAllocator { free: (0..num_blocks as u32).rev().collect(), refs: vec![0; num_blocks] }
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// `n` blocks, all or nothing.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let blocks = self.free.split_off(self.free.len() - n);
        for &b in &blocks {
            debug_assert_eq!(self.refs[b as usize], 0);
            self.refs[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Adds a reference to an allocated block (a second sequence sharing it).
    pub fn share(&mut self, block: u32) {
        assert!(self.refs[block as usize] > 0, "sharing free block {block}");
        self.refs[block as usize] += 1;
    }

    /// Drops one reference to each block; a block with none left is free again.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks {
            let r = &mut self.refs[b as usize];
            assert!(*r > 0, "double free of block {b}");
            *r -= 1;
            if *r == 0 {
                self.free.push(b);
            }
        }
    }
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
        let mut a = BlockAllocator::new(4);
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
        let mut a = BlockAllocator::new(2);
        let x = a.alloc(1).unwrap();
        a.release(&x);
        a.release(&x);
    }
}
