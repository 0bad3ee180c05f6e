//! The CUDA backend's workspace: a caching pool of device buffers, so that a decode step of a
//! batch shape already seen makes no device allocation at all.
//!
//! A [`Buf`] is a device buffer borrowed from the pool; dropping it hands it back (RAII). Buffers
//! are kept by (element type, size class), a class being the request rounded up to one of eight
//! steps per power of two (under 12.5% slack, see [`class_bytes`]), so that nearby shapes (batch
//! 63 and 64, prefill chunks of similar length) share buffers. A request takes the most recently
//! returned buffer of its class (warm in L2) or allocates a new one. Idle buffers are bounded by a
//! byte cap: returning one over the cap first evicts the least recently returned idle buffers.
//!
//! Safety of reuse rests on one fact: every kernel, copy and GEMM of the backend runs on its one
//! compute stream, so a buffer handed back while a queued kernel still reads it is only written
//! again by work queued after that kernel. (KV transfers on the transfer stream touch the KV cache
//! only, never pooled buffers.)
//!
//! The pool lives with its backend on the rank thread (`Rc`, not `Send`). A buffer keeps only a
//! weak reference to it: one dropped after the backend frees its memory directly (`CudaSlice`
//! holds its stream, and so the context, alive until then).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Deref;
use std::rc::{Rc, Weak};

use cleave_kernels::cudarc::driver::{CudaSlice, DeviceRepr};

/// Smallest size class in bytes (the driver's allocation granularity is 256 bytes anyway).
pub const MIN_CLASS: usize = 256;

/// Default bound on the bytes of idle (cached, unused) buffers.
pub const DEFAULT_IDLE_CAP: usize = 4 << 30;

/// The size class of a request of `bytes`: at least [`MIN_CLASS`], else `bytes` rounded up to a
/// multiple of 1/16 of the power of two 2^k at or above it (9, 10, ..., 16 x 2^(k-4)), so classes
/// are few (8 per power of two) and a buffer wastes less than 12.5% of its request. Always a
/// multiple of 32 bytes, so it holds a whole number of elements of every pooled type.
pub fn class_bytes(bytes: usize) -> usize {
    if bytes <= MIN_CLASS {
        return MIN_CLASS;
    }
    let step = bytes.next_power_of_two() / 16;
    bytes.div_ceil(step) * step
}

/// Idle buffers by key (element kind, size class in bytes), bounded by a byte cap with least
/// recently returned eviction. Generic over the buffer so that the bookkeeping is tested on the
/// host; dropping a `B` is what frees its memory.
pub struct SizePool<B> {
    /// Per key, idle buffers in the order they came back (oldest first) with their return tick.
    free: HashMap<(u8, usize), Vec<(u64, B)>>,
    idle_bytes: usize,
    cap: usize,
    tick: u64,
    stats: PoolStats,
}

/// What the pool has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from idle buffers.
    pub hits: u64,
    /// Requests that needed a new buffer.
    pub misses: u64,
    /// Idle buffers freed to stay under the cap (or by `SizePool::clear`).
    pub evicted: u64,
    /// Bytes of idle buffers now.
    pub idle_bytes: usize,
    /// Idle buffers now.
    pub idle_buffers: usize,
}

impl<B> SizePool<B> {
    pub fn new(cap: usize) -> Self {
        SizePool { free: HashMap::new(), idle_bytes: 0, cap, tick: 0, stats: PoolStats::default() }
    }

    /// An idle buffer of `kind` and size class `class` (the most recently returned), if any.
    pub fn take(&mut self, kind: u8, class: usize) -> Option<B> {
        let list = self.free.get_mut(&(kind, class));
        let got = list.and_then(|l| l.pop()).map(|(_, b)| b);
        match got {
            Some(b) => {
                self.idle_bytes -= class;
                self.stats.hits += 1;
                Some(b)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Keeps `b` (of `class` bytes) for reuse, evicting the least recently returned idle buffers
    /// while the idle bytes would exceed the cap; a buffer larger than the cap is freed instead.
    pub fn give(&mut self, kind: u8, class: usize, b: B) {
        if class > self.cap {
            self.stats.evicted += 1;
            drop(b);
            return;
        }
        while self.idle_bytes + class > self.cap && self.evict_oldest() {}
        self.tick += 1;
        self.free.entry((kind, class)).or_default().push((self.tick, b));
        self.idle_bytes += class;
    }

    /// Frees the idle buffer that came back longest ago; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self.free.iter().filter_map(|(k, l)| l.first().map(|(t, _)| (*t, *k))).min();
        let Some((_, key)) = oldest else {
            return false;
        };
        let list = self.free.get_mut(&key).expect("listed");
        drop(list.remove(0));
        if list.is_empty() {
            self.free.remove(&key);
        }
        self.idle_bytes -= key.1;
        self.stats.evicted += 1;
        true
    }

    /// Frees every idle buffer; returns the bytes freed.
    pub fn clear(&mut self) -> usize {
        let bytes = self.idle_bytes;
        self.stats.evicted += self.free.values().map(|l| l.len() as u64).sum::<u64>();
        self.free.clear();
        self.idle_bytes = 0;
        bytes
    }

    /// Sets the idle cap, evicting down to it.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
        while self.idle_bytes > self.cap && self.evict_oldest() {}
    }

    #[cfg(test)]
    pub fn idle_bytes(&self) -> usize {
        self.idle_bytes
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats { idle_bytes: self.idle_bytes, idle_buffers: self.free.values().map(Vec::len).sum(), ..self.stats }
    }
}

/// A device buffer of any element type the backend pools.
pub enum AnyBuf {
    F32(CudaSlice<f32>),
    U16(CudaSlice<u16>),
    U32(CudaSlice<u32>),
    I32(CudaSlice<i32>),
}

/// Element types with a pool of their own.
pub trait Elem: DeviceRepr + Sized + 'static {
    const KIND: u8;
    fn wrap(s: CudaSlice<Self>) -> AnyBuf;
    fn unwrap(b: AnyBuf) -> Option<CudaSlice<Self>>;
}

macro_rules! elem {
    ($t:ty, $v:ident, $k:expr) => {
        impl Elem for $t {
            const KIND: u8 = $k;
            fn wrap(s: CudaSlice<Self>) -> AnyBuf {
                AnyBuf::$v(s)
            }
            fn unwrap(b: AnyBuf) -> Option<CudaSlice<Self>> {
                match b {
                    AnyBuf::$v(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
elem!(f32, F32, 0);
elem!(u16, U16, 1);
elem!(u32, U32, 2);
elem!(i32, I32, 3);

/// The backend's pool of idle device buffers.
pub struct Workspace {
    pool: RefCell<SizePool<AnyBuf>>,
}

impl Workspace {
    pub fn new() -> Rc<Self> {
        Rc::new(Workspace { pool: RefCell::new(SizePool::new(DEFAULT_IDLE_CAP)) })
    }

    /// An idle buffer of `class` bytes of `T`, if one is cached.
    pub fn take<T: Elem>(&self, class: usize) -> Option<CudaSlice<T>> {
        self.pool.borrow_mut().take(T::KIND, class).and_then(T::unwrap)
    }

    fn give<T: Elem>(&self, class: usize, s: CudaSlice<T>) {
        match self.pool.try_borrow_mut() {
            Ok(mut p) => p.give(T::KIND, class, T::wrap(s)),
            // Not reached (the pool never drops a `Buf` while borrowed); freeing is always safe.
            Err(_) => drop(s),
        }
    }

    pub fn clear(&self) -> usize {
        self.pool.borrow_mut().clear()
    }

    pub fn set_cap(&self, cap: usize) {
        self.pool.borrow_mut().set_cap(cap)
    }

    pub fn stats(&self) -> PoolStats {
        self.pool.borrow().stats()
    }
}

/// A device buffer of at least the requested length (`len()` is its class capacity), handed
/// back to its workspace on drop. Derefs to the `CudaSlice`, so `ptr(&buf)` works as before.
pub struct Buf<T: Elem> {
    slice: Option<CudaSlice<T>>,
    class: usize,
    home: Weak<Workspace>,
}

impl<T: Elem> Buf<T> {
    /// A buffer of `class` bytes that goes back to `home` when dropped.
    pub fn pooled(slice: CudaSlice<T>, class: usize, home: &Rc<Workspace>) -> Self {
        Buf { slice: Some(slice), class, home: Rc::downgrade(home) }
    }

    /// A buffer outside the pool (weights and other long-lived uploads, exact size): freed on drop.
    pub fn unpooled(slice: CudaSlice<T>) -> Self {
        let class = slice.len() * std::mem::size_of::<T>();
        Buf { slice: Some(slice), class, home: Weak::new() }
    }
}

impl<T: Elem> Deref for Buf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("a Buf holds its slice until dropped")
    }
}

impl<T: Elem> Drop for Buf<T> {
    fn drop(&mut self) {
        if let (Some(s), Some(home)) = (self.slice.take(), self.home.upgrade()) {
            home.give(self.class, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        assert_eq!(class_bytes(0), MIN_CLASS);
        assert_eq!(class_bytes(256), 256);
        assert_eq!(class_bytes(257), 288);
        assert_eq!(class_bytes(1024), 1024);
        assert_eq!(class_bytes(1025), 1152);
        assert_eq!(class_bytes(1 << 30), 1 << 30);
        let mut prev = 0;
        for b in (1..5_000_000usize).step_by(997).chain([usize::MAX >> 8]) {
            let c = class_bytes(b);
            assert!(c >= b && c.is_multiple_of(32), "{b} -> {c}");
            assert!(b <= MIN_CLASS || (c - b) * 8 <= b, "{b} -> {c}: over 12.5%");
            assert!(c >= prev, "classes are monotone");
            prev = c;
        }
        // 8 classes per power of two
        let n = (1usize << 20) + 1..=(1 << 21);
        let mut cs: Vec<usize> = n.step_by(61).map(class_bytes).collect();
        cs.dedup();
        assert_eq!(cs.len(), 8);
    }

    /// A buffer that counts its drops (frees).
    struct Fake(u32, Rc<Cell<u32>>);
    impl Drop for Fake {
        fn drop(&mut self) {
            self.1.set(self.1.get() + 1);
        }
    }

    #[test]
    fn reuse_is_lifo_per_kind_and_class() {
        let freed = Rc::new(Cell::new(0));
        let mut p = SizePool::new(1 << 20);
        assert!(p.take(0, 256).is_none());
        p.give(0, 256, Fake(1, freed.clone()));
        p.give(0, 256, Fake(2, freed.clone()));
        p.give(1, 256, Fake(3, freed.clone()));
        p.give(0, 512, Fake(4, freed.clone()));
        assert_eq!(p.idle_bytes(), 3 * 256 + 512);
        assert_eq!(p.take(0, 256).map(|f| f.0), Some(2));
        assert_eq!(p.take(0, 256).map(|f| f.0), Some(1));
        assert!(p.take(0, 256).is_none());
        assert_eq!(p.take(1, 256).map(|f| f.0), Some(3));
        assert_eq!(p.idle_bytes(), 512);
        assert_eq!(freed.get(), 3, "taken buffers were dropped by the test, none by the pool");
        let s = p.stats();
        assert_eq!((s.hits, s.misses, s.evicted, s.idle_buffers), (3, 2, 0, 1));
        assert_eq!(p.clear(), 512);
        assert_eq!(freed.get(), 4);
        assert_eq!(p.idle_bytes(), 0);
    }

    #[test]
    fn cap_evicts_least_recently_returned() {
        let freed = Rc::new(Cell::new(0));
        let mut p = SizePool::new(1024);
        p.give(0, 256, Fake(1, freed.clone()));
        p.give(0, 512, Fake(2, freed.clone()));
        p.give(0, 256, Fake(3, freed.clone()));
        assert_eq!((p.idle_bytes(), freed.get()), (1024, 0));
        // 512 more: the oldest (1, 256 bytes) then the next oldest (2, 512) go
        p.give(1, 512, Fake(4, freed.clone()));
        assert_eq!((p.idle_bytes(), freed.get()), (768, 2));
        assert_eq!(p.take(0, 256).map(|f| f.0), Some(3));
        assert!(p.take(0, 512).is_none());
        // over the cap alone: freed at once, nothing else evicted
        p.give(0, 4096, Fake(5, freed.clone()));
        assert_eq!((p.idle_bytes(), freed.get()), (512, 4));
        p.set_cap(0);
        assert_eq!((p.idle_bytes(), freed.get()), (0, 5));
        assert_eq!(p.stats().evicted, 4);
    }

    /// The property the decode step relies on: a repeated sequence of takes and gives of the same
    /// shapes misses only in its first round.
    #[test]
    fn a_repeated_step_misses_only_once() {
        let freed = Rc::new(Cell::new(0));
        let mut p: SizePool<Fake> = SizePool::new(1 << 30);
        let sizes = [4096usize, 300, 4096, 70_000, 300, 4096, 12, 9_000_000];
        let mut misses = Vec::new();
        for _ in 0..4 {
            let before = p.stats().misses;
            let mut live = Vec::new();
            for (i, &s) in sizes.iter().enumerate() {
                let c = class_bytes(s);
                let b = p.take(0, c).unwrap_or_else(|| Fake(i as u32, freed.clone()));
                live.push((c, b));
                if i % 3 == 2 {
                    // some buffers die mid-step
                    let (c, b) = live.remove(0);
                    p.give(0, c, b);
                }
            }
            for (c, b) in live {
                p.give(0, c, b);
            }
            misses.push(p.stats().misses - before);
        }
        assert!(misses[0] > 0);
        assert_eq!(&misses[1..], &[0, 0, 0]);
        assert_eq!(freed.get(), 0);
    }
}
