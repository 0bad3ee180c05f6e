//! The KV-transfer actor: after a prefill rank sampled a request's first token (and sent it to
//! the client), it has the decode rank reserve blocks, then the prefill rank send the prompt's
//! latent KV; the decode rank receives it, admits the sequence and confirms. A failure, a rank
//! death or the timeout ends the transfer, and `failure_policy` decides: recompute on a decode
//! rank (the stream continues) or end the stream with an error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler};

use crate::command::RankCmd;
use crate::error::ActorError;
use crate::events::{Prefilled, RankDown, RecvDone, Reserved, SendDone};
use crate::request::{ReqCtx, ReqId, OWNER_NONE, OWNER_TRANSFER};
use crate::table::{RankStatus, RankTable};
use crate::transport::TransferTicket;

struct Open {
    ctx: Arc<ReqCtx>,
    src: usize,
    src_inc: u64,
    dst: usize,
    dst_inc: u64,
    ticket: TransferTicket,
    /// The prefill rank finished sending: its death no longer matters.
    sent: bool,
    started: Instant,
}

/// Moves prefilled KV from prefill ranks to decode ranks.
pub(crate) struct KvTransfer {
    table: Arc<RankTable>,
    timeout: Duration,
    open: HashMap<ReqId, Open>,
}

impl KvTransfer {
    pub fn new(table: Arc<RankTable>, timeout: Duration) -> Self {
        KvTransfer { table, timeout, open: HashMap::new() }
    }

    /// Ends an open transfer as failed: both ranks drop their side, and the request is
    /// recovered per the failure policy.
    fn fail(&mut self, id: ReqId, label: &str, why: String) {
        let Some(o) = self.open.remove(&id) else { return };
        let _ = self.table.send_to(o.dst, o.dst_inc, RankCmd::CancelRecv { id });
        if !o.sent {
            let _ = self.table.send_to(o.src, o.src_inc, RankCmd::Release { id });
        }
        self.recover(o.ctx, o.dst, label, why);
    }

    fn recover(&self, ctx: Arc<ReqCtx>, dst: usize, label: &str, why: String) {
        if !ctx.is_cancelled() {
            tracing::warn!(request_id = ctx.id, reason = label, error = %why, "KV transfer failed");
            self.table.metrics.kv_transfer_failures.with_label_values(&[label]).inc();
        }
        if ctx.claim(OWNER_TRANSFER, OWNER_NONE) {
            self.table.recover(ctx, ActorError::TransferFailed(why), Some(dst));
        }
    }
}

impl Actor for KvTransfer {
    type Context = Context<Self>;
}

impl Handler<Prefilled> for KvTransfer {
    type Result = ();

    fn handle(&mut self, m: Prefilled, cx: &mut Context<Self>) {
        let id = m.ctx.id;
        if m.ctx.is_cancelled() {
            let _ = self.table.send_to(m.src, m.src_inc, RankCmd::Release { id });
            m.ctx.claim(OWNER_TRANSFER, OWNER_NONE);
            return;
        }
        let dst = if self.table.status(m.dst) == RankStatus::Up { Some(m.dst) } else { self.table.choose_decode() };
        let Some(dst) = dst else {
            let _ = self.table.send_to(m.src, m.src_inc, RankCmd::Release { id });
            return self.recover(m.ctx, m.dst, "rank_failed", "no decode rank is available".into());
        };
        let ticket = TransferTicket {
            req: id,
            src_rank: self.table.slots[m.src].rank,
            dst_rank: self.table.slots[dst].rank,
            sender: m.sender,
            receivers: Vec::new(),
            prompt_len: m.ctx.prompt.len(),
            blocks: Vec::new(),
            cached_blocks: 0,
            deadline: Instant::now() + self.timeout,
        };
        let dst_inc = self.table.inc(dst);
        tracing::debug!(request_id = id, from = ticket.src_rank, to = ticket.dst_rank, "KV transfer starts");
        let cmd = RankCmd::Reserve { ctx: m.ctx.clone(), first: m.first, ticket: ticket.clone() };
        self.open.insert(
            id,
            Open {
                ctx: m.ctx,
                src: m.src,
                src_inc: m.src_inc,
                dst,
                dst_inc,
                ticket,
                sent: false,
                started: Instant::now(),
            },
        );
        if !self.table.send_to(dst, dst_inc, cmd) {
            return self.fail(id, "rank_failed", "the decode rank is down".into());
        }
        // Backstop for a decode rank that never answers; it normally times out by itself.
        cx.run_later(self.timeout + Duration::from_millis(200), move |act, _| {
            act.fail(id, "timeout", "the transfer timed out".into());
        });
    }
}

impl Handler<Reserved> for KvTransfer {
    type Result = ();

    fn handle(&mut self, m: Reserved, _: &mut Context<Self>) {
        let Some(o) = self.open.get_mut(&m.id) else { return };
        if o.dst_inc != m.dst_inc {
            return;
        }
        o.ticket.blocks = m.blocks;
        o.ticket.cached_blocks = m.cached_blocks;
        o.ticket.receivers = m.receivers;
        let cmd = RankCmd::SendKv { ticket: o.ticket.clone() };
        if !self.table.send_to(o.src, o.src_inc, cmd) {
            self.fail(m.id, "rank_failed", "the prefill rank is gone".into());
        }
    }
}

impl Handler<SendDone> for KvTransfer {
    type Result = ();

    fn handle(&mut self, m: SendDone, _: &mut Context<Self>) {
        let Some(o) = self.open.get_mut(&m.id) else { return };
        if o.src_inc != m.src_inc {
            return;
        }
        o.sent = true;
        if let Err(e) = m.result {
            self.fail(m.id, e.label(), format!("send from the prefill rank failed: {e}"));
        }
    }
}

impl Handler<RecvDone> for KvTransfer {
    type Result = ();

    fn handle(&mut self, m: RecvDone, _: &mut Context<Self>) {
        match self.open.get(&m.id) {
            Some(o) if o.dst_inc == m.dst_inc => {}
            _ => return,
        }
        let o = self.open.remove(&m.id).expect("checked");
        match m.result {
            Ok(bytes) => {
                let metrics = &self.table.metrics;
                metrics.kv_transfers.inc();
                metrics.kv_transfer_bytes.inc_by(bytes);
                let secs = o.started.elapsed().as_secs_f64();
                metrics.kv_transfer_seconds.inc_by(secs);
                metrics.kv_transfer_latency.observe(secs);
                metrics.kv_transfer_size.observe(bytes as f64);
            }
            Err(e) => {
                if !o.sent {
                    let _ = self.table.send_to(o.src, o.src_inc, RankCmd::Release { id: m.id });
                }
                self.recover(o.ctx, o.dst, e.label(), format!("receive on the decode rank failed: {e}"));
            }
        }
    }
}

impl Handler<RankDown> for KvTransfer {
    type Result = ();

    fn handle(&mut self, m: RankDown, _: &mut Context<Self>) {
        let hit: Vec<ReqId> = self
            .open
            .iter()
            .filter(|(_, o)| {
                (o.src == m.slot && o.src_inc == m.inc && !o.sent) || (o.dst == m.slot && o.dst_inc == m.inc)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in hit {
            self.fail(id, "rank_failed", "a rank of the transfer failed".into());
        }
    }
}
