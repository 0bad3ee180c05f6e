//! A rank's loop: drain commands (blocking only when idle), advance incoming transfers, run one
//! engine step, send the sampled tokens, publish state. Any error or panic ends it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cleave_engine::backend::Backend;
use cleave_engine::{Engine, TokenOutput};
use flume::RecvTimeoutError;

use super::RankInfo;
use crate::command::{Fault, RankCmd};
use crate::error::ActorError;
use crate::events::{Prefilled, RankEvents, RecvDone, Reserved, SendDone};
use crate::request::{Emit, ReqCtx, ReqId, OWNER_TRANSFER};
use crate::table::{RankShared, Role};
use crate::transport::{TransferTicket, TransportError};

/// How long an idle rank blocks on its channel (and so how often it beats).
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// How long an idle rank with incoming transfers waits between polls.
const POLL_WAIT: Duration = Duration::from_millis(1);

/// A request computed on this rank.
struct Local {
    ctx: Arc<ReqCtx>,
    /// Prefill ranks: the decode slot the KV goes to.
    dst: Option<usize>,
    /// Prompt tokens this rank computes for it, counted at its first output.
    prompt: usize,
}

/// A transfer into this (decode) rank.
struct Incoming {
    ctx: Arc<ReqCtx>,
    first: u32,
    ticket: TransferTicket,
    reserved: bool,
}

pub(crate) struct Worker<B: Backend> {
    slot: usize,
    rank: usize,
    role: Role,
    inc: u64,
    engine: Engine<B>,
    shared: Arc<RankShared>,
    events: RankEvents,
    reqs: HashMap<ReqId, Local>,
    incoming: HashMap<ReqId, Incoming>,
    /// A fault that fires at the next KV send.
    armed: Option<Fault>,
}

impl<B: Backend> Worker<B> {
    pub fn new(slot: usize, info: &RankInfo, engine: Engine<B>, shared: Arc<RankShared>, events: RankEvents) -> Self {
        Worker {
            slot,
            rank: info.rank,
            role: info.role,
            inc: shared.inc,
            engine,
            shared,
            events,
            reqs: HashMap::new(),
            incoming: HashMap::new(),
            armed: None,
        }
    }

    /// Runs until shutdown (Ok), retirement (Ok) or a failure (Err; panics unwind out).
    pub fn run(&mut self, rx: &flume::Receiver<RankCmd>) -> Result<(), ActorError> {
        loop {
            self.shared.beat();
            if self.shared.retired.load(Ordering::SeqCst) {
                tracing::warn!(rank = self.rank, "retired by its pool; exiting");
                return Ok(());
            }
            self.check_fault();
            if !self.engine.has_work() {
                let wait = if self.incoming.is_empty() { IDLE_WAIT } else { POLL_WAIT };
                match rx.recv_timeout(wait) {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return Ok(());
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                if !self.handle(cmd) {
                    return Ok(());
                }
            }
            self.poll_incoming();
            if self.engine.has_work() {
                self.shared.in_step(true);
                if let Some(Fault::SlowStep(d)) = self.armed {
                    self.armed = None;
                    std::thread::sleep(d);
                }
                let outs = self.engine.step().map_err(|e| {
                    ActorError::Internal(format!("{} rank {}: step failed: {e}", self.role.as_str(), self.rank))
                })?;
                self.shared.in_step(false);
                for id in self.engine.last_started() {
                    if let Some(l) = self.reqs.get(id) {
                        l.ctx.mark_scheduled();
                    }
                }
                for o in outs {
                    self.on_output(o);
                }
            }
            self.publish();
        }
    }

    /// Publishes the scheduler's state and cached prefixes for the router, the stats and the
    /// metrics.
    pub fn publish(&mut self) {
        self.shared.prefix.apply(&self.engine.take_cache_events());
        let s = self.engine.stats();
        let sh = &self.shared;
        sh.running.store(s.running, Ordering::Relaxed);
        sh.waiting.store(s.waiting, Ordering::Relaxed);
        sh.held.store(s.held, Ordering::Relaxed);
        sh.blocks_used.store(s.used_blocks, Ordering::Relaxed);
        sh.blocks_total.store(s.used_blocks + s.free_blocks, Ordering::Relaxed);
        sh.preemptions.set(s.preemptions);
        sh.prefix_queries.set(s.prefix.queried_tokens);
        sh.prefix_hits.set(s.prefix.hit_tokens);
        sh.prefix_evictions.set(s.prefix.evicted_blocks);
        sh.cached_blocks.store(s.prefix.cached_blocks, Ordering::Relaxed);
    }

    fn check_fault(&mut self) {
        let fault = self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()).take();
        match fault {
            Some(Fault::Panic) => panic!("injected fault: {} rank {} panics", self.role.as_str(), self.rank),
            Some(Fault::Hang(d)) => {
                tracing::warn!(rank = self.rank, ms = d.as_millis() as u64, "injected fault: hanging");
                std::thread::sleep(d);
            }
            Some(Fault::PanicOnGroupRank(r)) => {
                if let Err(e) = self.engine.arm_rank_panic(r) {
                    tracing::warn!(rank = self.rank, error = %e, "injected fault not armed");
                }
            }
            Some(f) => self.armed = Some(f),
            None => {}
        }
    }

    /// Handles one command; false means exit.
    fn handle(&mut self, cmd: RankCmd) -> bool {
        match cmd {
            RankCmd::Prefill { ctx, dst } => self.add(ctx, Some(dst)),
            RankCmd::Generate { ctx } => {
                ctx.set_decode_ledger(None);
                self.add(ctx, None)
            }
            RankCmd::Reserve { ctx, first, ticket } => {
                ctx.set_decode_ledger(None);
                let id = ctx.id;
                if ctx.is_cancelled() {
                    self.report_recv(id, Err(TransportError::Abandoned("the client went away".into())));
                } else {
                    tracing::debug!(request_id = id, rank = self.rank, "incoming KV transfer");
                    self.incoming.insert(id, Incoming { ctx, first, ticket, reserved: false });
                }
            }
            RankCmd::SendKv { ticket } => self.send_kv(ticket),
            RankCmd::CancelRecv { id } => {
                if let Some(i) = self.incoming.remove(&id) {
                    self.drop_incoming(&i);
                }
            }
            RankCmd::Release { id } => {
                self.engine.release(id);
            }
            RankCmd::Abort { id } => {
                if self.engine.abort(id) {
                    tracing::debug!(request_id = id, rank = self.rank, "aborted");
                }
                self.forget(id);
                if let Some(i) = self.incoming.remove(&id) {
                    self.drop_incoming(&i);
                    self.report_recv(id, Err(TransportError::Abandoned("the client went away".into())));
                }
            }
            RankCmd::Wake => {}
            RankCmd::Shutdown => {
                for (_, l) in self.reqs.drain() {
                    l.ctx.fail(ActorError::ShuttingDown);
                }
                return false;
            }
        }
        true
    }

    /// Starts computing a request here (prefill-only on prefill ranks).
    fn add(&mut self, ctx: Arc<ReqCtx>, dst: Option<usize>) {
        let id = ctx.id;
        if ctx.is_cancelled() {
            self.shared.untrack(id);
            return;
        }
        let sent = if dst.is_some() { Vec::new() } else { ctx.generated() };
        let added = if dst.is_some() {
            self.engine.add_request(ctx.request(true))
        } else if sent.is_empty() {
            self.engine.add_request(ctx.request(false))
        } else {
            // Taken over after a failure: continue after the tokens the client already has.
            self.engine.add_resumed(ctx.request(false), &sent)
        };
        match added {
            Ok(()) => {
                let prompt = ctx.prompt.len() + sent.len();
                self.reqs.insert(id, Local { ctx, dst, prompt });
            }
            Err(e) => {
                self.shared.untrack(id);
                ctx.fail(ActorError::from_engine(e));
            }
        }
    }

    /// Forgets a request that left this rank (finished, handed over, aborted).
    fn forget(&mut self, id: ReqId) {
        self.reqs.remove(&id);
        if let Some(ctx) = self.shared.untrack(id) {
            ctx.set_prefill_ledger(None);
        }
    }

    fn on_output(&mut self, o: TokenOutput) {
        let id = o.id;
        let Some(local) = self.reqs.get_mut(&id) else {
            self.engine.abort(id);
            return;
        };
        let computed = std::mem::take(&mut local.prompt) as u64;
        self.shared.prompt_tokens.fetch_add(computed, Ordering::Relaxed);
        let (ctx, dst) = (local.ctx.clone(), local.dst);
        let (finish, prefilled, token) = (o.finish, o.prefilled, o.token);
        let emitted = ctx.emit(self.inc, o);
        if emitted == Emit::Sent {
            self.shared.generated.fetch_add(1, Ordering::Relaxed);
        }
        match emitted {
            Emit::Sent if finish.is_some() => self.forget(id),
            Emit::Sent if prefilled => {
                self.forget(id);
                match dst {
                    Some(dst) if ctx.claim(self.inc, OWNER_TRANSFER) => {
                        let sender = self.engine.kv_sender(id).unwrap_or(self.rank);
                        self.events.prefilled.do_send(Prefilled {
                            ctx,
                            first: token,
                            src: self.slot,
                            src_inc: self.inc,
                            sender,
                            dst,
                        });
                    }
                    _ => {
                        self.engine.release(id);
                    }
                }
            }
            Emit::Sent => {}
            Emit::Gone | Emit::NotOwner => {
                self.engine.abort(id);
                self.forget(id);
            }
        }
    }

    fn send_kv(&mut self, ticket: TransferTicket) {
        let id = ticket.req;
        let result = match self.armed.take() {
            Some(Fault::PanicOnKvSend) => {
                panic!("injected fault: {} rank {} panics in a KV send", self.role.as_str(), self.rank)
            }
            Some(Fault::FailKvSend) => Err(TransportError::Failed("injected transport failure".into())),
            _ => self.send_kv_now(&ticket),
        };
        self.engine.release(id);
        if let Err(e) = &result {
            tracing::warn!(request_id = id, rank = self.rank, error = %e, "KV send failed");
        }
        self.events.sent.do_send(SendDone { id, src_inc: self.inc, result });
    }

    fn send_kv_now(&mut self, t: &TransferTicket) -> Result<u64, TransportError> {
        if Instant::now() >= t.deadline {
            return Err(TransportError::TimedOut(format!(
                "rank {}: the transfer's deadline passed before the send",
                self.rank
            )));
        }
        let t0 = Instant::now();
        let bytes = self
            .engine
            .send_kv(t.req, t.prompt_len, t.cached_blocks, t.moving(), &t.receivers, t.deadline)
            .map_err(|e| TransportError::from_engine(&format!("send from rank {}", self.rank), e))?;
        tracing::debug!(
            request_id = t.req,
            sender = t.sender,
            receivers = ?t.receivers,
            bytes,
            us = t0.elapsed().as_micros() as u64,
            "KV sent"
        );
        Ok(bytes)
    }

    fn report_recv(&self, id: ReqId, result: Result<u64, TransportError>) {
        self.events.received.do_send(RecvDone { id, dst_inc: self.inc, result });
    }

    fn drop_incoming(&mut self, i: &Incoming) {
        if i.reserved {
            self.engine.cancel_kv(i.ticket.moving(), i.ticket.sender, i.ticket.req);
            self.engine.unreserve_blocks(&i.ticket.blocks);
        }
    }

    /// Reserves blocks for, and receives, incoming transfers.
    fn poll_incoming(&mut self) {
        if self.incoming.is_empty() {
            return;
        }
        let now = Instant::now();
        let ids: Vec<ReqId> = self.incoming.keys().copied().collect();
        for id in ids {
            let i = self.incoming.get_mut(&id).expect("listed id");
            let failure = if i.ctx.is_cancelled() {
                TransportError::Abandoned("the client went away".into())
            } else if now >= i.ticket.deadline {
                TransportError::TimedOut("the decode rank did not receive the KV by the deadline".into())
            } else if !i.reserved {
                if let Some((blocks, cached_blocks)) = self.engine.reserve_blocks(&i.ctx.prompt) {
                    i.reserved = true;
                    i.ticket.blocks = blocks.clone();
                    i.ticket.cached_blocks = cached_blocks;
                    match self.engine.kv_receivers(&blocks) {
                        Ok(receivers) => {
                            let r = Reserved { id, dst_inc: self.inc, blocks, cached_blocks, receivers };
                            self.events.reserved.do_send(r);
                            continue;
                        }
                        Err(e) => TransportError::Failed(format!("rank {}: {e}", self.rank)),
                    }
                } else {
                    continue;
                }
            } else {
                let t = &i.ticket;
                let polled = self.engine.poll_kv(t.moving(), t.sender, t.req, t.deadline);
                match polled.map_err(|e| TransportError::from_engine(&format!("receive on rank {}", self.rank), e)) {
                    Ok(None) => continue,
                    Ok(Some(bytes)) => {
                        let i = self.incoming.remove(&id).expect("listed id");
                        self.admit(i, bytes);
                        continue;
                    }
                    Err(e) => e,
                }
            };
            let i = self.incoming.remove(&id).expect("listed id");
            self.drop_incoming(&i);
            self.report_recv(id, Err(failure));
        }
    }

    /// Takes over a request whose KV arrived and starts decoding it.
    fn admit(&mut self, i: Incoming, bytes: u64) {
        let id = i.ctx.id;
        // Track before claiming, so that a rank death right after is recovered by the pool.
        self.shared.track(i.ctx.clone());
        if !i.ctx.claim(OWNER_TRANSFER, self.inc) {
            self.shared.untrack(id);
            self.engine.unreserve_blocks(&i.ticket.blocks);
            self.report_recv(id, Err(TransportError::Abandoned("the transfer actor gave it up".into())));
            return;
        }
        let (blocks, cached) = (i.ticket.blocks.clone(), i.ticket.cached_blocks);
        match self.engine.admit_prefilled(i.ctx.request(false), i.first, blocks, cached) {
            Ok(()) => {
                tracing::debug!(request_id = id, rank = self.rank, bytes, "KV received; decoding");
                self.reqs.insert(id, Local { ctx: i.ctx, dst: None, prompt: 0 });
                self.report_recv(id, Ok(bytes));
            }
            Err(e) => {
                self.shared.untrack(id);
                self.engine.unreserve_blocks(&i.ticket.blocks);
                i.ctx.fail(ActorError::Internal(format!("admitting a transferred request failed: {e}")));
                self.report_recv(id, Err(TransportError::Failed(e.to_string())));
            }
        }
    }
}
