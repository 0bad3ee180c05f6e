//! The table of ranks every actor shares: each slot's command channel, its state as the rank
//! publishes it, the load the router has promised it, and the requests it holds. Choosing a rank
//! and dispatching a request to it live here, so that the router, the pools and the KV-transfer
//! actor place work the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use cleave_engine::kv_cache::{blocks_for, pick_cached, BlockHash};

use crate::command::{Fault, RankCmd};
use crate::config::FailurePolicy;
use crate::error::ActorError;
use crate::ledger::{Ledger, Promised};
use crate::metrics::Metrics;
use crate::prefix::{PrefixIndex, Tally};
use crate::request::{Hub, ReqCtx, ReqId, OWNER_NONE};

/// Recoveries of one request before it is failed instead.
pub(crate) const MAX_RECOVERIES: u32 = 3;

/// Which pool a rank belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    /// `prefill` | `decode` (metric labels, thread names).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// Life cycle of a rank slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankStatus {
    /// Loading its model (at start or after a restart).
    Starting,
    Up,
    /// Could not load its model; not restarted again.
    Failed(String),
    /// Shut down.
    Stopped,
}

/// State of one rank incarnation: published by its thread, promised load from dispatchers, and
/// the requests it holds (what its pool recovers if it dies).
pub(crate) struct RankShared {
    pub inc: u64,
    epoch: Instant,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub held: AtomicUsize,
    pub blocks_used: AtomicUsize,
    pub blocks_total: AtomicUsize,
    /// Prompt tokens computed and tokens sent by this incarnation (the pools' stats lines).
    pub prompt_tokens: AtomicU64,
    pub generated: AtomicU64,
    /// Totals of this incarnation: preemptions, prompt tokens looked up in the prefix cache and
    /// found there, cached blocks evicted.
    pub preemptions: Tally,
    pub prefix_queries: Tally,
    pub prefix_hits: Tally,
    pub prefix_evictions: Tally,
    /// Blocks holding a cached prefix.
    pub cached_blocks: AtomicUsize,
    /// The prefixes this rank caches.
    pub prefix: PrefixIndex,
    last_beat_ms: AtomicU64,
    /// When the step now running began (ms since the epoch, plus 1); 0 between steps.
    step_since_ms: AtomicU64,
    /// Set when the pool gave up on this incarnation; its thread exits when it sees it.
    pub retired: AtomicBool,
    promised: Arc<Promised>,
    pub tracked: Mutex<HashMap<ReqId, Arc<ReqCtx>>>,
    pub fault: Mutex<Option<Fault>>,
}

impl RankShared {
    fn new(inc: u64, epoch: Instant) -> Self {
        let z = || AtomicUsize::new(0);
        RankShared {
            inc,
            epoch,
            running: z(),
            waiting: z(),
            held: z(),
            blocks_used: z(),
            blocks_total: z(),
            prompt_tokens: AtomicU64::new(0),
            generated: AtomicU64::new(0),
            preemptions: Tally::default(),
            prefix_queries: Tally::default(),
            prefix_hits: Tally::default(),
            prefix_evictions: Tally::default(),
            cached_blocks: z(),
            prefix: PrefixIndex::default(),
            last_beat_ms: AtomicU64::new(epoch.elapsed().as_millis() as u64),
            step_since_ms: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            promised: Arc::default(),
            tracked: Mutex::new(HashMap::new()),
            fault: Mutex::new(None),
        }
    }

    /// Records that the rank's loop is alive.
    pub fn beat(&self) {
        self.last_beat_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Marks the start (`true`) or the end of a step; the end is a beat.
    pub fn in_step(&self, running: bool) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.step_since_ms.store(if running { now + 1 } else { 0 }, Ordering::Relaxed);
        if !running {
            self.beat();
        }
    }

    /// How long the step now running has taken, if one is.
    pub fn step_time(&self) -> Option<Duration> {
        let since = self.step_since_ms.load(Ordering::Relaxed).checked_sub(1)?;
        Some(Duration::from_millis((self.epoch.elapsed().as_millis() as u64).saturating_sub(since)))
    }

    /// Time since the last beat.
    pub fn silence(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_beat_ms.load(Ordering::Relaxed)))
    }

    pub fn track(&self, ctx: Arc<ReqCtx>) {
        self.tracked.lock().unwrap_or_else(|e| e.into_inner()).insert(ctx.id, ctx);
    }

    pub fn untrack(&self, id: ReqId) -> Option<Arc<ReqCtx>> {
        self.tracked.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)
    }

    fn free_blocks(&self) -> i64 {
        let total = self.blocks_total.load(Ordering::Relaxed) as i64;
        total - self.blocks_used.load(Ordering::Relaxed) as i64 - self.promised.blocks() as i64
    }

    fn decode_load(&self) -> usize {
        self.running.load(Ordering::Relaxed) + self.waiting.load(Ordering::Relaxed) + self.promised.seqs()
    }
}

struct SlotState {
    tx: flume::Sender<RankCmd>,
    shared: Arc<RankShared>,
    status: RankStatus,
}

/// One configured rank; its incarnations come and go.
pub(crate) struct Slot {
    pub rank: usize,
    pub role: Role,
    state: RwLock<SlotState>,
    /// The receiver of the current incarnation until its thread is spawned.
    pending_rx: Mutex<Option<flume::Receiver<RankCmd>>>,
    pub restarts: AtomicUsize,
}

/// A snapshot of one rank for [`crate::ClusterStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStats {
    /// The rank id of the configuration.
    pub rank: usize,
    pub role: Role,
    pub status: RankStatus,
    pub running: usize,
    pub waiting: usize,
    /// Prefilled sequences holding KV for a transfer.
    pub held: usize,
    pub blocks_in_use: usize,
    pub blocks_total: usize,
    /// Requests assigned to the pool and not yet on the rank (prefill: first token not sampled).
    pub queued: usize,
    pub restarts: usize,
}

/// Every rank of the cluster, shared by the actors, the ranks' streams and the cluster handle.
pub(crate) struct RankTable {
    pub slots: Vec<Slot>,
    pub metrics: Arc<Metrics>,
    pub policy: FailurePolicy,
    pub block_size: usize,
    pub in_flight: AtomicUsize,
    epoch: Instant,
    next_inc: AtomicU64,
    shutting_down: AtomicBool,
    changed: (Mutex<()>, Condvar),
}

impl RankTable {
    /// Slots for `ranks` (prefill first, then decode), each with a fresh incarnation.
    pub fn new(ranks: &[(usize, Role)], metrics: Arc<Metrics>, policy: FailurePolicy, block_size: usize) -> Self {
        let mut t = RankTable {
            slots: Vec::new(),
            metrics,
            policy,
            block_size,
            in_flight: AtomicUsize::new(0),
            epoch: Instant::now(),
            next_inc: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            changed: (Mutex::new(()), Condvar::new()),
        };
        for &(rank, role) in ranks {
            let (tx, rx) = flume::unbounded();
            let shared = Arc::new(RankShared::new(t.next_inc.fetch_add(1, Ordering::SeqCst), t.epoch));
            t.slots.push(Slot {
                rank,
                role,
                state: RwLock::new(SlotState { tx, shared, status: RankStatus::Starting }),
                pending_rx: Mutex::new(Some(rx)),
                restarts: AtomicUsize::new(0),
            });
        }
        t
    }

    fn state(&self, slot: usize) -> std::sync::RwLockReadGuard<'_, SlotState> {
        self.slots[slot].state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The current incarnation of `slot`: its shared state and the receiver its thread must
    /// take (once).
    pub fn take_launch(&self, slot: usize) -> Option<(Arc<RankShared>, flume::Receiver<RankCmd>)> {
        let rx = self.slots[slot].pending_rx.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        Some((self.state(slot).shared.clone(), rx))
    }

    /// Replaces `slot`'s incarnation with a fresh one (status Starting) and returns the old
    /// shared state, retired. Dispatchers see either the old or the new incarnation, never a mix.
    pub fn replace(&self, slot: usize) -> Arc<RankShared> {
        let (tx, rx) = flume::unbounded();
        let shared = Arc::new(RankShared::new(self.next_inc.fetch_add(1, Ordering::SeqCst), self.epoch));
        let old = {
            let mut st = self.slots[slot].state.write().unwrap_or_else(|e| e.into_inner());
            *self.slots[slot].pending_rx.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
            std::mem::replace(&mut *st, SlotState { tx, shared, status: RankStatus::Starting })
        };
        old.shared.retired.store(true, Ordering::SeqCst);
        self.slots[slot].restarts.fetch_add(1, Ordering::Relaxed);
        self.notify();
        old.shared
    }

    pub fn inc(&self, slot: usize) -> u64 {
        self.state(slot).shared.inc
    }

    pub fn shared(&self, slot: usize) -> Arc<RankShared> {
        self.state(slot).shared.clone()
    }

    pub fn status(&self, slot: usize) -> RankStatus {
        self.state(slot).status.clone()
    }

    /// Sets the status of `slot` if `inc` is still its incarnation.
    pub fn set_status(&self, slot: usize, inc: u64, status: RankStatus) -> bool {
        let mut st = self.slots[slot].state.write().unwrap_or_else(|e| e.into_inner());
        if st.shared.inc != inc {
            return false;
        }
        st.status = status;
        drop(st);
        self.notify();
        true
    }

    fn notify(&self) {
        let _g = self.changed.0.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.1.notify_all();
    }

    /// Blocks until every slot is up; the first failure's message otherwise.
    pub fn wait_all_up(&self) -> Result<(), String> {
        let mut g = self.changed.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let mut all_up = true;
            for (i, s) in self.slots.iter().enumerate() {
                match self.status(i) {
                    RankStatus::Up => {}
                    RankStatus::Failed(m) => return Err(format!("{} rank {}: {m}", s.role.as_str(), s.rank)),
                    _ => all_up = false,
                }
            }
            if all_up {
                return Ok(());
            }
            g = self.changed.1.wait_timeout(g, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Sends a command to the current incarnation of `slot`; false if its thread is gone.
    pub fn send(&self, slot: usize, cmd: RankCmd) -> bool {
        self.state(slot).tx.send(cmd).is_ok()
    }

    /// Sends a command only if `inc` is still the incarnation of `slot`.
    pub fn send_to(&self, slot: usize, inc: u64, cmd: RankCmd) -> bool {
        let st = self.state(slot);
        st.shared.inc == inc && st.tx.send(cmd).is_ok()
    }

    /// Tells every rank to drop request `id` wherever it is.
    pub fn broadcast_abort(&self, id: ReqId) {
        for i in 0..self.slots.len() {
            let _ = self.send(i, RankCmd::Abort { id });
        }
    }

    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for i in 0..self.slots.len() {
            let _ = self.send(i, RankCmd::Shutdown);
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn usable(&self, role: Role) -> impl Iterator<Item = (usize, RankStatus)> + '_ {
        self.slots.iter().enumerate().filter(move |(_, s)| s.role == role).map(|(i, _)| (i, self.status(i)))
    }

    /// The decode rank for a new sequence: most free KV blocks (after promised ones), then
    /// fewest sequences. Ranks that are up are preferred to ranks still loading.
    pub fn choose_decode(&self) -> Option<usize> {
        self.choose_decode_for(&[]).map(|(slot, _)| slot)
    }

    /// The decode rank for a prompt whose block hashes are `hashes`: the one caching the longest
    /// prefix of it unless it is much busier ([`pick_cached`]), else as [`Self::choose_decode`].
    /// Returns the slot and the prompt's blocks cached there.
    pub fn choose_decode_for(&self, hashes: &[BlockHash]) -> Option<(usize, usize)> {
        let pick = |want: RankStatus| {
            let slots: Vec<usize> = self.usable(Role::Decode).filter(|(_, st)| *st == want).map(|(i, _)| i).collect();
            let cands: Vec<_> = slots
                .iter()
                .map(|&i| {
                    let s = self.shared(i);
                    let load = s.decode_load();
                    (load, s.prefix.matched(hashes), (std::cmp::Reverse(s.free_blocks()), load, i))
                })
                .collect();
            pick_cached(&cands).map(|k| (slots[k], cands[k].1))
        };
        pick(RankStatus::Up).or_else(|| pick(RankStatus::Starting))
    }

    /// The prefill rank, among those up, that finishes a prompt of `prompt_len` tokens with
    /// block hashes `hashes` first: fewest queued prompt tokens plus the prompt's tokens it does
    /// not cache.
    pub fn choose_prefill_for(&self, hashes: &[BlockHash], prompt_len: usize) -> Option<usize> {
        self.usable(Role::Prefill).filter(|(_, st)| *st == RankStatus::Up).map(|(i, _)| i).min_by_key(|&i| {
            let s = self.shared(i);
            let uncached = prompt_len.saturating_sub(s.prefix.matched(hashes) * self.block_size);
            (s.promised.tokens() + uncached, i)
        })
    }

    /// Requests assigned to the prefill pool whose first token is not sampled yet.
    pub fn prefill_queue(&self) -> usize {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.role == Role::Prefill)
            .map(|(i, _)| self.shared(i).promised.reqs())
            .sum()
    }

    /// Hands `ctx` (owned by nobody) to `slot`: claims it for the slot's incarnation, records
    /// it there (so the slot's pool recovers it if the rank dies) and sends `cmd`.
    fn hand_over(&self, slot: usize, ctx: &Arc<ReqCtx>, cmd: RankCmd) -> Result<(), ActorError> {
        let st = self.state(slot);
        if !ctx.claim(OWNER_NONE, st.shared.inc) {
            return Err(ActorError::Internal(format!("request {} is owned elsewhere", ctx.id)));
        }
        st.shared.track(ctx.clone());
        // A closed channel means the rank died; its pool recovers the tracked request.
        let _ = st.tx.send(cmd);
        Ok(())
    }

    /// Puts the load of `ctx` on decode rank `slot` until it arrives there.
    pub fn promise_decode(&self, slot: usize, ctx: &ReqCtx) {
        let blocks = blocks_for(ctx.prompt.len() + ctx.generated_len() + 1, self.block_size);
        ctx.set_decode_ledger(Some(Ledger::decode(&self.shared(slot).promised, blocks)));
    }

    /// Queues `ctx` on a decode rank that prefills it locally (resuming after the tokens already
    /// sent) and decodes it. `prefer` is used when it is up.
    pub fn dispatch_generate(&self, ctx: Arc<ReqCtx>, prefer: Option<usize>) -> Result<usize, ActorError> {
        let slot = prefer
            .filter(|&s| self.slots[s].role == Role::Decode && self.status(s) == RankStatus::Up)
            .or_else(|| self.choose_decode())
            .ok_or_else(|| ActorError::Overloaded("no decode rank is available".into()))?;
        self.promise_decode(slot, &ctx);
        tracing::debug!(request_id = ctx.id, rank = self.slots[slot].rank, "dispatch to decode rank");
        self.hand_over(slot, &ctx.clone(), RankCmd::Generate { ctx })?;
        Ok(slot)
    }

    /// Queues `ctx` on prefill rank `p`; its KV then moves to decode rank `d`.
    pub fn dispatch_prefill(&self, ctx: Arc<ReqCtx>, p: usize, d: usize) -> Result<(), ActorError> {
        self.promise_decode(d, &ctx);
        ctx.set_prefill_ledger(Some(Ledger::prefill(&self.shared(p).promised, ctx.prompt.len())));
        tracing::debug!(
            request_id = ctx.id,
            prefill = self.slots[p].rank,
            decode = self.slots[d].rank,
            "dispatch to prefill rank"
        );
        self.hand_over(p, &ctx.clone(), RankCmd::Prefill { ctx, dst: d })
    }

    /// Recovers a request owned by nobody after a failure: dropped if its client is gone,
    /// re-run on a decode rank under `recompute`, ended with `err` under `fail`.
    pub fn recover(&self, ctx: Arc<ReqCtx>, err: ActorError, prefer: Option<usize>) {
        if ctx.is_cancelled() {
            return;
        }
        if ctx.note_recovery() > MAX_RECOVERIES {
            // A request that keeps failing ranks (e.g. one whose step panics) is not retried
            // forever: it would crash-loop every rank it lands on.
            return ctx.fail(ActorError::RankFailed(format!(
                "given up after {MAX_RECOVERIES} recoveries; last failure: {err}"
            )));
        }
        match self.policy {
            FailurePolicy::Fail => ctx.fail(err),
            FailurePolicy::Recompute => {
                tracing::info!(request_id = ctx.id, sent = ctx.generated_len(), reason = %err, "recomputing request");
                self.metrics.recomputes.inc();
                if let Err(e) = self.dispatch_generate(ctx.clone(), prefer) {
                    ctx.fail(e);
                }
            }
        }
    }

    /// Snapshot of every rank.
    pub fn stats(&self) -> Vec<RankStats> {
        (0..self.slots.len())
            .map(|i| {
                let st = self.state(i);
                let s = &st.shared;
                let l = |a: &AtomicUsize| a.load(Ordering::Relaxed);
                RankStats {
                    rank: self.slots[i].rank,
                    role: self.slots[i].role,
                    status: st.status.clone(),
                    running: l(&s.running),
                    waiting: l(&s.waiting),
                    held: l(&s.held),
                    blocks_in_use: l(&s.blocks_used),
                    blocks_total: l(&s.blocks_total),
                    queued: s.promised.reqs() + s.promised.seqs(),
                    restarts: l(&self.slots[i].restarts),
                }
            })
            .collect()
    }
}

impl Hub for RankTable {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn in_flight(&self) -> &AtomicUsize {
        &self.in_flight
    }

    fn abort(&self, id: ReqId) {
        self.broadcast_abort(id);
    }

    fn is_shutting_down(&self) -> bool {
        RankTable::is_shutting_down(self)
    }
}
