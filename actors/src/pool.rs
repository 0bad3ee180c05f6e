//! Pool actors (one for the prefill ranks, one for the decode ranks) start and supervise their
//! ranks. A rank that panics, fails a step or misses its heartbeat is retired and restarted; the
//! requests it held are recovered per `failure_policy`, and transfers from or to it fail fast.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext, Context, Handler};

use crate::config::SupervisorConfig;
use crate::error::ActorError;
use crate::events::{RankDown, RankEvents, RankExited, RankReady};
use crate::rank::{Launch, Spawner};
use crate::request::{ReqCtx, OWNER_NONE};
use crate::stats_line::StatsLine;
use crate::table::{RankStatus, RankTable, Role};
use crate::transfer::KvTransfer;

/// Supervisor of one pool's ranks.
pub(crate) struct Pool {
    role: Role,
    slots: Vec<usize>,
    table: Arc<RankTable>,
    spawner: Spawner,
    transfer: Addr<KvTransfer>,
    heartbeat: Duration,
    max_step: Duration,
    /// The stats line's period (none: no line).
    stats_every: Option<Duration>,
    stats: StatsLine,
}

impl Pool {
    pub fn new(
        role: Role,
        table: Arc<RankTable>,
        spawner: Spawner,
        transfer: Addr<KvTransfer>,
        sup: &SupervisorConfig,
    ) -> Self {
        let slots = (0..table.slots.len()).filter(|&i| table.slots[i].role == role).collect();
        let heartbeat = Duration::from_millis(sup.heartbeat_timeout_ms);
        let stats_every = (sup.log_stats_interval_ms > 0).then(|| Duration::from_millis(sup.log_stats_interval_ms));
        let max_step = Duration::from_millis(sup.max_step_ms);
        Pool { role, slots, table, spawner, transfer, heartbeat, max_step, stats_every, stats: StatsLine::new() }
    }

    fn launch(&self, slot: usize, me: Addr<Pool>) {
        let Some((shared, rx)) = self.table.take_launch(slot) else { return };
        let inc = shared.inc;
        let t = &self.transfer;
        let events = RankEvents {
            ready: me.clone().recipient(),
            exited: me.recipient(),
            prefilled: t.clone().recipient(),
            reserved: t.clone().recipient(),
            sent: t.clone().recipient(),
            received: t.clone().recipient(),
        };
        if let Err(e) = (self.spawner)(Launch { slot, shared, rx, events }) {
            self.table.set_status(slot, inc, RankStatus::Failed(format!("cannot start its thread: {e}")));
            self.recover_orphans(slot, inc, "its thread could not start");
        }
    }

    /// Recovers the requests the incarnation `inc` of `slot` held.
    fn recover_orphans(&self, slot: usize, inc: u64, why: &str) {
        let shared = self.table.shared(slot);
        let orphans: Vec<_> = if shared.inc == inc {
            std::mem::take(&mut *shared.tracked.lock().unwrap_or_else(|e| e.into_inner())).into_values().collect()
        } else {
            Vec::new()
        };
        self.recover(orphans, inc, slot, why);
    }

    fn recover(&self, orphans: Vec<Arc<ReqCtx>>, inc: u64, slot: usize, why: &str) {
        let rank = self.table.slots[slot].rank;
        for ctx in orphans {
            if ctx.claim(inc, OWNER_NONE) {
                let err = ActorError::RankFailed(format!("{} rank {rank} failed: {why}", self.role.as_str()));
                self.table.recover(ctx, err, None);
            }
        }
    }

    /// Retires the current incarnation of `slot`, starts a new one and recovers the requests.
    fn restart(&self, slot: usize, why: &str, me: Addr<Pool>) {
        let rank = self.table.slots[slot].rank;
        tracing::error!(rank, pool = self.role.as_str(), reason = why, "restarting rank");
        self.table.metrics.rank_restarts.with_label_values(&[self.role.as_str()]).inc();
        let old = self.table.replace(slot);
        self.transfer.do_send(RankDown { slot, inc: old.inc });
        let orphans: Vec<_> =
            std::mem::take(&mut *old.tracked.lock().unwrap_or_else(|e| e.into_inner())).into_values().collect();
        self.launch(slot, me);
        self.recover(orphans, old.inc, slot, why);
    }

    fn check_heartbeats(&self, me: Addr<Pool>) {
        for &slot in &self.slots {
            if self.table.status(slot) != RankStatus::Up {
                continue;
            }
            // A step is supervised by its own limit: it never beats, however long it is.
            let shared = self.table.shared(slot);
            match shared.step_time() {
                Some(t) if t > self.max_step => {
                    self.restart(slot, &format!("a step has run for {} ms", t.as_millis()), me.clone())
                }
                Some(_) => {}
                None if shared.silence() > self.heartbeat => {
                    let ms = shared.silence().as_millis();
                    self.restart(slot, &format!("no heartbeat for {ms} ms"), me.clone())
                }
                None => {}
            }
        }
    }
}

impl Actor for Pool {
    type Context = Context<Self>;

    fn started(&mut self, cx: &mut Context<Self>) {
        for &slot in &self.slots {
            self.launch(slot, cx.address());
        }
        let every = (self.heartbeat / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        cx.run_interval(every, |act, cx| {
            if !act.table.is_shutting_down() {
                act.check_heartbeats(cx.address());
            }
        });
        if let Some(every) = self.stats_every {
            cx.run_interval(every, |act, _| {
                if let Some(s) = act.stats.sample(&act.table, &act.slots) {
                    s.log(act.role);
                }
            });
        }
    }
}

impl Handler<RankReady> for Pool {
    type Result = ();

    fn handle(&mut self, m: RankReady, _: &mut Context<Self>) {
        self.table.set_status(m.slot, m.inc, RankStatus::Up);
    }
}

impl Handler<RankExited> for Pool {
    type Result = ();

    fn handle(&mut self, m: RankExited, cx: &mut Context<Self>) {
        if self.table.inc(m.slot) != m.inc {
            return; // an incarnation already replaced (e.g. after a missed heartbeat)
        }
        match m.error {
            None => {
                self.table.set_status(m.slot, m.inc, RankStatus::Stopped);
                self.recover_orphans(m.slot, m.inc, "it stopped");
            }
            Some(_) if self.table.is_shutting_down() => {
                self.table.set_status(m.slot, m.inc, RankStatus::Stopped);
            }
            Some(e) if !m.loaded => {
                // A model that does not load will not load on a retry either.
                self.table.set_status(m.slot, m.inc, RankStatus::Failed(e.clone()));
                self.recover_orphans(m.slot, m.inc, &e);
            }
            Some(e) => self.restart(m.slot, &e, cx.address()),
        }
    }
}
