//! Collectives, the seam between a group's ranks: an in-process implementation for ranks that
//! are threads of this process (CPU ranks, and tests of several GPU ranks sharing one GPU), NCCL
//! for GPUs (`backend::cuda::collectives`). Every rank of an axis calls the same collectives in
//! the same order; a rank without tokens joins with zero rows.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{ParallelConfig, RankCoord};
use crate::backend::Backend;
use crate::error::{EngineError, Result};

/// The ranks a collective spans, seen from one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// The TP ranks of this rank's DP rank.
    Tp,
    /// The ranks of the same TP index across DP ranks.
    Dp,
    /// The whole group.
    World,
}

/// One rank's endpoints of its group's communicators.
pub trait Collectives<B: Backend> {
    /// Ranks along `axis`.
    fn size(&self, axis: Axis) -> usize;
    /// Sums `x` element-wise over the ranks of `axis`; every rank gets the sum.
    fn all_reduce(&self, be: &B, axis: Axis, x: &mut B::Tensor) -> Result<()>;
    /// The rows of every rank of `axis`, concatenated in rank order; `rows[i]` is rank i's count.
    fn all_gather_rows(&self, be: &B, axis: Axis, x: &B::Tensor, rows: &[usize]) -> Result<B::Tensor>;
    /// Waits, with a deadline, until this step's collectives completed (a no-op where they are
    /// synchronous).
    fn settle(&self, be: &B) -> Result<()> {
        let _ = be;
        Ok(())
    }
    /// Makes the group's pending and future collectives fail (this rank failed; its peers must
    /// not wait for it).
    fn abandon(&self, why: &str);
    /// Whether the collectives are device work on the backend's stream, which a CUDA graph can
    /// capture (not where they go through the host).
    fn capturable(&self) -> bool {
        false
    }
}

/// How long an in-process collective waits for the other ranks.
const DEADLINE: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Round {
    parts: Vec<Option<Vec<f32>>>,
    arrived: usize,
    /// Set when every part arrived; cleared when every rank took it.
    done: Option<Arc<Vec<Vec<f32>>>>,
    taken: usize,
}

/// A rendezvous of `n` ranks exchanging host buffers.
struct Rendezvous {
    n: usize,
    round: Mutex<Round>,
    cv: Condvar,
}

impl Rendezvous {
    fn new(n: usize) -> Self {
        Rendezvous { n, round: Mutex::new(Round { parts: vec![None; n], ..Round::default() }), cv: Condvar::new() }
    }

    /// Contributes `data` as member `me`; returns every member's contribution.
    fn exchange(&self, me: usize, data: Vec<f32>, failed: &Mutex<Option<String>>) -> Result<Arc<Vec<Vec<f32>>>> {
        let end = Instant::now() + DEADLINE;
        let mut g = self.round.lock().unwrap_or_else(|e| e.into_inner());
        // The previous round must be drained before this one starts.
        while g.done.is_some() {
            g = self.wait(g, end, failed)?;
        }
        g.parts[me] = Some(data);
        g.arrived += 1;
        if g.arrived == self.n {
            let parts = g.parts.iter_mut().map(|p| p.take().expect("every part arrived")).collect();
            g.done = Some(Arc::new(parts));
            g.arrived = 0;
            self.cv.notify_all();
        }
        while g.done.is_none() {
            g = self.wait(g, end, failed)?;
        }
        let out = g.done.clone().expect("checked");
        g.taken += 1;
        if g.taken == self.n {
            g.done = None;
            g.taken = 0;
            self.cv.notify_all();
        }
        Ok(out)
    }

    fn wait<'a>(
        &self,
        g: std::sync::MutexGuard<'a, Round>,
        end: Instant,
        failed: &Mutex<Option<String>>,
    ) -> Result<std::sync::MutexGuard<'a, Round>> {
        if let Some(why) = failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(EngineError::Backend(format!("collective abandoned: {why}")));
        }
        let now = Instant::now();
        if now >= end {
            return Err(EngineError::Timeout(format!(
                "collective waited {} s for the other ranks",
                DEADLINE.as_secs()
            )));
        }
        let wait = (end - now).min(Duration::from_millis(50));
        Ok(self.cv.wait_timeout(g, wait).unwrap_or_else(|e| e.into_inner()).0)
    }
}

/// The communicators of one group whose ranks are threads of this process.
#[derive(Clone)]
pub struct InProcGroup {
    par: ParallelConfig,
    /// One per TP line (indexed by DP rank), one per DP line (by TP rank), one for the world.
    tp: Arc<Vec<Rendezvous>>,
    dp: Arc<Vec<Rendezvous>>,
    world: Arc<Rendezvous>,
    failed: Arc<Mutex<Option<String>>>,
}

impl InProcGroup {
    pub fn new(par: ParallelConfig) -> Self {
        let (tp, dp) = (par.tensor_parallel_size, par.data_parallel_size);
        InProcGroup {
            par,
            tp: Arc::new((0..dp).map(|_| Rendezvous::new(tp)).collect()),
            dp: Arc::new((0..tp).map(|_| Rendezvous::new(dp)).collect()),
            world: Arc::new(Rendezvous::new(par.world())),
            failed: Arc::new(Mutex::new(None)),
        }
    }

    /// Rank `r`'s endpoints.
    pub fn member(&self, r: usize) -> InProcComm {
        InProcComm { group: self.clone(), coord: self.par.coord(r) }
    }

    /// Makes every pending and future collective of the group fail (a rank died).
    pub fn abandon(&self, why: &str) {
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
    }
}

/// One rank's endpoints of an [`InProcGroup`]; works over any backend by staging through the host.
pub struct InProcComm {
    group: InProcGroup,
    coord: RankCoord,
}

impl InProcComm {
    fn line(&self, axis: Axis) -> (&Rendezvous, usize) {
        let c = self.coord;
        match axis {
            Axis::Tp => (&self.group.tp[c.dp], c.tp),
            Axis::Dp => (&self.group.dp[c.tp], c.dp),
            Axis::World => (&self.group.world, c.rank()),
        }
    }
}

impl<B: Backend> Collectives<B> for InProcComm {
    fn size(&self, axis: Axis) -> usize {
        self.line(axis).0.n
    }

    fn all_reduce(&self, be: &B, axis: Axis, x: &mut B::Tensor) -> Result<()> {
        let (rv, me) = self.line(axis);
        if rv.n == 1 {
            return Ok(());
        }
        let (rows, cols) = be.dims(x);
        let parts = rv.exchange(me, be.download(x)?, &self.group.failed)?;
        let mut sum = vec![0f32; rows * cols];
        // Every rank adds in rank order, so all of them hold bit-identical sums.
        for p in parts.iter() {
            if p.len() != sum.len() {
                return Err(EngineError::Backend(format!("all_reduce: {} values against {}", p.len(), sum.len())));
            }
            sum.iter_mut().zip(p).for_each(|(s, v)| *s += v);
        }
        *x = be.upload(&sum, rows, cols)?;
        Ok(())
    }

    fn all_gather_rows(&self, be: &B, axis: Axis, x: &B::Tensor, rows: &[usize]) -> Result<B::Tensor> {
        let (rv, me) = self.line(axis);
        let (own, cols) = be.dims(x);
        if rows.len() != rv.n || rows[me] != own {
            return Err(EngineError::Backend(format!("all_gather_rows: counts {rows:?} for rank {me} of {own} rows")));
        }
        if rv.n == 1 {
            return be.upload(&be.download(x)?, own, cols);
        }
        let parts = rv.exchange(me, be.download(x)?, &self.group.failed)?;
        let total: usize = rows.iter().sum();
        let mut all = Vec::with_capacity(total * cols);
        for (p, &n) in parts.iter().zip(rows) {
            if p.len() != n * cols {
                return Err(EngineError::Backend(format!("all_gather_rows: {} values for {n} rows", p.len())));
            }
            all.extend_from_slice(p);
        }
        be.upload(&all, total, cols)
    }

    fn abandon(&self, why: &str) {
        self.group.abandon(why);
    }
}
