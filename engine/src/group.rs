//! A group's ranks: rank 0's runner on the calling thread (a group of one adds nothing to a
//! step), every other rank's runner on a thread of its own that creates it (device context,
//! streams, communicators) and never hands it over. The group steps in lockstep: each rank gets
//! the same plan, and a failure on any rank fails the step and abandons the group's collectives.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::graphs::CaptureReport;
use crate::kv_port::{KvPort, MemHub, PortMaker};
use crate::parallel::{ParallelConfig, RankCoord};
use crate::runner::{ModelRunner, RankOutput, StepPlan};

/// Builds rank `coord`'s runner; called on that rank's own thread.
pub type RunnerFactory<B> = dyn Fn(RankCoord) -> Result<ModelRunner<B>> + Send + Sync;

/// `make`, with each rank's KV port attached (made on the rank's thread, over its backend).
pub fn with_ports<B: Backend + 'static>(
    make: Arc<RunnerFactory<B>>,
    ports: Arc<PortMaker<B>>,
) -> Arc<RunnerFactory<B>> {
    Arc::new(move |coord: RankCoord| {
        let mut runner = make(coord)?;
        let port = ports(coord, runner.backend())?;
        runner.set_port(port);
        Ok(runner)
    })
}

/// A KV move on one rank's port (see [`crate::kv_port::KvPort`]).
enum KvCmd {
    Send { blocks: Vec<u32>, dst_blocks: Vec<u32>, dsts: Vec<usize>, req: u64, deadline: Instant },
    Poll { blocks: Vec<u32>, src: usize, req: u64, deadline: Instant },
    Cancel { src: usize, req: u64 },
}

impl KvCmd {
    fn run<B: Backend>(self, runner: &mut ModelRunner<B>) -> Result<Option<u64>> {
        match self {
            KvCmd::Send { blocks, dst_blocks, dsts, req, deadline } => {
                runner.send_kv(&blocks, &dst_blocks, &dsts, req, deadline).map(Some)
            }
            KvCmd::Poll { blocks, src, req, deadline } => runner.poll_kv(&blocks, src, req, deadline),
            KvCmd::Cancel { src, req } => {
                runner.cancel_kv(src, req);
                Ok(None)
            }
        }
    }
}

enum Cmd {
    Execute(Arc<StepPlan>),
    /// Gives the rank a port on an in-process hub, with this id.
    Link(MemHub, usize),
    Kv(KvCmd),
    /// Capture decode steps of these sizes (every rank at once).
    Capture(Vec<usize>),
    /// Fault injection: panic inside the next step.
    ArmPanic,
}

enum Reply {
    /// Loaded, with this many cache blocks and its KV port's rank id.
    Loaded(usize, Option<usize>),
    Output(Option<RankOutput>),
    Linked,
    Kv(Option<u64>),
    Captured,
    Armed,
}

struct Peer {
    coord: RankCoord,
    tx: Option<Sender<Cmd>>,
    rx: Receiver<Result<Reply>>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    fn reply(&self) -> Result<Reply> {
        self.rx.recv().map_err(|_| {
            EngineError::Backend(format!("rank {} of the group exited without answering", self.coord.rank()))
        })?
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        let gone = || EngineError::Backend(format!("rank {} of the group has exited", self.coord.rank()));
        self.tx.as_ref().ok_or_else(gone)?.send(cmd).map_err(|_| gone())
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// Catches a panic as an error naming the rank.
fn guarded<T>(rank: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(EngineError::Backend(format!("rank {rank} panicked: {}", panic_text(&*p)))))
}

fn serve<B: Backend>(make: &RunnerFactory<B>, coord: RankCoord, rx: Receiver<Cmd>, tx: Sender<Result<Reply>>) {
    let rank = coord.rank();
    let mut runner = match guarded(rank, || make(coord)) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    if tx.send(Ok(Reply::Loaded(runner.num_blocks(), runner.port_rank()))).is_err() {
        return;
    }
    let mut armed = false;
    while let Ok(cmd) = rx.recv() {
        // Only a failed step or capture leaves the group's collectives out of step; a failed KV
        // move does not.
        let step = matches!(cmd, Cmd::Execute(_) | Cmd::Capture(_));
        let r = guarded(rank, || match cmd {
            Cmd::Execute(_) if std::mem::take(&mut armed) => panic!("injected fault: rank {rank} panics in a step"),
            Cmd::Execute(plan) => runner.execute(&plan).map(Reply::Output),
            Cmd::ArmPanic => {
                armed = true;
                Ok(Reply::Armed)
            }
            Cmd::Link(hub, id) => {
                runner.set_port(Box::new(hub.port(id)));
                Ok(Reply::Linked)
            }
            Cmd::Kv(kv) => kv.run(&mut runner).map(Reply::Kv),
            Cmd::Capture(sizes) => runner.capture_graphs(&sizes).map(|_| Reply::Captured),
        });
        if let (Err(e), true) = (&r, step) {
            runner.abandon(&format!("rank {rank}: {e}"));
        }
        if tx.send(r).is_err() {
            return;
        }
    }
}

/// The runners of one group.
pub struct RankGroup<B: Backend> {
    local: ModelRunner<B>,
    peers: Vec<Peer>,
    /// The smallest cache of any rank (ranks sized from their free memory may differ).
    num_blocks: usize,
    /// Each rank's coordinate and KV port id (disaggregated pools), rank 0 first.
    ports: Vec<(RankCoord, Option<usize>)>,
}

impl<B: Backend + 'static> RankGroup<B> {
    /// Starts ranks 1.. on their own threads and builds rank 0 here, all at once (creating
    /// communicators is collective); fails if any rank fails to load.
    pub fn start(par: ParallelConfig, make: Arc<RunnerFactory<B>>) -> Result<Self> {
        let mut peers = Vec::new();
        for r in 1..par.world() {
            let coord = par.coord(r);
            let (cmd_tx, cmd_rx) = channel();
            let (rep_tx, rep_rx) = channel();
            let make = make.clone();
            let thread = std::thread::Builder::new()
                .name(format!("cleave-rank{r}"))
                .spawn(move || serve(&*make, coord, cmd_rx, rep_tx))
                .map_err(|e| EngineError::Backend(format!("starting rank {r}'s thread: {e}")))?;
            peers.push(Peer { coord, tx: Some(cmd_tx), rx: rep_rx, thread: Some(thread) });
        }
        let local = guarded(0, || make(par.coord(0)));
        let mut failure = local.as_ref().err().map(|e| e.to_string());
        let mut num_blocks = local.as_ref().map_or(0, ModelRunner::num_blocks);
        let mut ports = vec![(par.coord(0), local.as_ref().ok().and_then(ModelRunner::port_rank))];
        for p in &peers {
            match p.reply() {
                Ok(Reply::Loaded(n, port)) => {
                    num_blocks = num_blocks.min(n);
                    ports.push((p.coord, port));
                }
                Ok(_) => {}
                Err(e) if failure.is_none() => failure = Some(e.to_string()),
                Err(_) => {}
            }
        }
        match (local, failure) {
            (Ok(local), None) => Ok(RankGroup { local, peers, num_blocks, ports }),
            (Err(e), _) => Err(e),
            (Ok(_), Some(f)) => Err(EngineError::Backend(format!("loading the group failed: {f}"))),
        }
    }
}

impl<B: Backend> RankGroup<B> {
    /// A group of one around an already built runner.
    pub fn single(local: ModelRunner<B>) -> Self {
        let num_blocks = local.num_blocks();
        let ports = vec![(local.coord(), local.port_rank())];
        RankGroup { local, peers: Vec::new(), num_blocks, ports }
    }

    /// Gives rank 0 (a group of one's only rank) its KV port.
    pub fn set_local_port(&mut self, port: Box<dyn KvPort<B>>) {
        self.ports[0].1 = Some(port.rank());
        self.local.set_port(port);
    }

    /// The KV port ids of DP rank `dp`'s TP ranks, in TP order (`None` if any has no port).
    pub fn port_ranks(&self, dp: usize) -> Option<Vec<usize>> {
        let mut v: Vec<(usize, Option<usize>)> =
            self.ports.iter().filter(|(c, _)| c.dp == dp).map(|(c, p)| (c.tp, *p)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// Runs `cmd` on the port of the rank at (`dp`, `tp`).
    fn kv(&mut self, dp: usize, tp: usize, cmd: KvCmd) -> Result<Option<u64>> {
        let at = self.local.coord();
        if (at.dp, at.tp) == (dp, tp) {
            return guarded(0, || cmd.run(&mut self.local));
        }
        let p = self
            .peers
            .iter()
            .find(|p| (p.coord.dp, p.coord.tp) == (dp, tp))
            .ok_or_else(|| EngineError::Backend(format!("the group has no rank at DP {dp}, TP {tp}")))?;
        p.send(Cmd::Kv(cmd))?;
        match p.reply()? {
            Reply::Kv(r) => Ok(r),
            _ => Err(EngineError::Backend("a rank answered out of turn".into())),
        }
    }

    /// Sends `blocks` of DP rank `dp`'s cache from its sampling rank (TP rank 0) to each of `dsts`.
    pub fn send_kv(
        &mut self,
        dp: usize,
        blocks: &[u32],
        dst_blocks: &[u32],
        dsts: &[usize],
        req: u64,
        deadline: Instant,
    ) -> Result<u64> {
        let cmd = KvCmd::Send {
            blocks: blocks.to_vec(),
            dst_blocks: dst_blocks.to_vec(),
            dsts: dsts.to_vec(),
            req,
            deadline,
        };
        Ok(self.kv(dp, 0, cmd)?.unwrap_or(0))
    }

    /// Polls the receive of request `req`'s KV from `src` into `blocks` on the rank at (`dp`, `tp`).
    #[allow(clippy::too_many_arguments)]
    pub fn poll_kv(
        &mut self,
        dp: usize,
        tp: usize,
        blocks: &[u32],
        src: usize,
        req: u64,
        deadline: Instant,
    ) -> Result<Option<u64>> {
        self.kv(dp, tp, KvCmd::Poll { blocks: blocks.to_vec(), src, req, deadline })
    }

    /// Forgets an abandoned receive on every TP rank of DP rank `dp`.
    pub fn cancel_kv(&mut self, dp: usize, src: usize, req: u64) {
        for tp in 0..self.parallel().tensor_parallel_size {
            if let Err(e) = self.kv(dp, tp, KvCmd::Cancel { src, req }) {
                tracing::warn!(dp, tp, request_id = req, error = %e, "cancelling a KV receive failed");
            }
        }
    }

    pub fn parallel(&self) -> ParallelConfig {
        self.local.coord().par
    }

    /// Blocks every rank's cache holds.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Rank 0's runner (the whole model in a group of one).
    pub fn local(&self) -> &ModelRunner<B> {
        &self.local
    }
    pub fn local_mut(&mut self) -> &mut ModelRunner<B> {
        &mut self.local
    }

    /// Sends `cmd` to every peer (each, whatever failed before); the first failure to send.
    fn send_all(&self, cmd: impl Fn(RankCoord) -> Cmd) -> Option<EngineError> {
        let mut failure = None;
        for p in &self.peers {
            if let Err(e) = p.send(cmd(p.coord)) {
                failure.get_or_insert(e);
            }
        }
        failure
    }

    /// Reads every peer's answer, in rank order; `take` accepts one (false: out of turn). The
    /// first failure, or answer out of turn, goes to `failure` unless one is there.
    fn answers(&self, failure: &mut Option<EngineError>, mut take: impl FnMut(RankCoord, Reply) -> bool) {
        for p in &self.peers {
            let taken = p.reply().and_then(|r| {
                take(p.coord, r).then_some(()).ok_or_else(|| EngineError::Backend("a rank answered out of turn".into()))
            });
            if let Err(e) = taken {
                failure.get_or_insert(e);
            }
        }
    }

    /// Runs `cmd` on every peer and `local` on rank 0 at the same time, for work that runs the
    /// group's collectives: a failure anywhere abandons them, so that no rank waits for a peer
    /// that will not come. Rank 0's result, and the first failure.
    fn collective<T>(
        &mut self,
        cmd: impl Fn(RankCoord) -> Cmd,
        local: impl FnOnce(&mut ModelRunner<B>) -> Result<T>,
        take: impl FnMut(RankCoord, Reply) -> bool,
    ) -> (Option<T>, Option<EngineError>) {
        let mut failure = self.send_all(cmd);
        if let Some(e) = &failure {
            // A rank is gone: the others must not wait for it in the collectives.
            self.local.abandon(&e.to_string());
        }
        let mine = match guarded(0, || local(&mut self.local)) {
            Ok(t) => Some(t),
            Err(e) => {
                self.local.abandon(&format!("rank 0: {e}"));
                failure.get_or_insert(e);
                None
            }
        };
        self.answers(&mut failure, take);
        (mine, failure)
    }

    /// Runs `plan` on every rank; returns each DP rank's samples, in DP order.
    pub fn execute(&mut self, plan: StepPlan) -> Result<Vec<RankOutput>> {
        if self.peers.is_empty() {
            return Ok(self.local.execute(&plan)?.into_iter().collect());
        }
        let plan = Arc::new(plan);
        let mut outs = vec![None; self.parallel().data_parallel_size];
        let (mine, failure) = self.collective(
            |_| Cmd::Execute(plan.clone()),
            |r| r.execute(&plan),
            |c, r| match r {
                Reply::Output(o) => {
                    if o.is_some() {
                        outs[c.dp] = o;
                    }
                    true
                }
                _ => false,
            },
        );
        if let Some(e) = failure {
            return Err(e);
        }
        outs[0] = mine.flatten();
        outs.into_iter()
            .enumerate()
            .map(|(dp, o)| o.ok_or_else(|| EngineError::Backend(format!("DP rank {dp} returned no samples"))))
            .collect()
    }

    /// Whether every rank can capture decode steps (they share one layout and backend kind).
    pub fn can_capture(&self) -> bool {
        self.local.can_capture()
    }

    /// Captures decode steps of `sizes` rows on every rank at once (their warm-up steps run the
    /// group's collectives). A failure on any rank leaves the collectives out of step: the
    /// group's communicators are then abandoned and the error returned.
    pub fn capture_graphs(&mut self, sizes: &[usize]) -> Result<CaptureReport> {
        let (report, failure) = self.collective(
            |_| Cmd::Capture(sizes.to_vec()),
            |r| r.capture_graphs(sizes),
            |_, r| matches!(r, Reply::Captured),
        );
        match (failure, report) {
            (None, Some(r)) => Ok(r),
            (Some(e), _) => Err(e),
            (None, None) => Err(EngineError::Backend("rank 0 captured nothing".into())),
        }
    }

    /// Fault injection: group rank `rank` (1.., a rank on its own thread) panics inside the next
    /// step, which fails that step on every rank as a real failure would.
    pub fn arm_panic(&self, rank: usize) -> Result<()> {
        let p = self.peers.iter().find(|p| p.coord.rank() == rank).ok_or_else(|| {
            EngineError::InvalidRequest(format!("the group has no rank {rank} on a thread of its own"))
        })?;
        p.send(Cmd::ArmPanic)?;
        match p.reply()? {
            Reply::Armed => Ok(()),
            _ => Err(EngineError::Backend("a rank answered out of turn".into())),
        }
    }

    /// Gives every rank a port on the in-process hub `hub`, with id `base` + its group rank
    /// (ranks that are threads of this process: tests and checks).
    pub fn link_in_process(&mut self, hub: &MemHub, base: usize) -> Result<()> {
        let mut failure = self.send_all(|c| Cmd::Link(hub.clone(), base + c.rank()));
        self.local.set_port(Box::new(hub.port(base)));
        self.answers(&mut failure, |_, r| matches!(r, Reply::Linked));
        for (c, id) in &mut self.ports {
            *id = Some(base + c.rank());
        }
        failure.map_or(Ok(()), Err)
    }
}

impl<B: Backend> Drop for RankGroup<B> {
    fn drop(&mut self) {
        // A rank still inside a collective must not wait for ranks that are going away.
        if !self.peers.is_empty() {
            self.local.abandon("the group is shutting down");
        }
        for p in &mut self.peers {
            p.tx = None;
        }
        for p in &mut self.peers {
            if let Some(t) = p.thread.take() {
                let _ = t.join();
            }
        }
    }
}
