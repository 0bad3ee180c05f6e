//! What the control plane tells a rank to do ([`RankCmd`], over the rank's channel) and the
//! failures an operator or a test can inject into one ([`Fault`]).

use std::sync::Arc;
use std::time::Duration;

use crate::request::{ReqCtx, ReqId};
use crate::transport::TransferTicket;

/// What a rank is asked to do.
pub(crate) enum RankCmd {
    /// Prefill rank: prefill the prompt, send the first token, hold the KV for decode slot `dst`.
    Prefill { ctx: Arc<ReqCtx>, dst: usize },
    /// Decode rank: prefill locally (the prompt plus any tokens already sent) and decode.
    Generate { ctx: Arc<ReqCtx> },
    /// Decode rank: reserve blocks for an incoming transfer, then receive and admit it.
    Reserve { ctx: Arc<ReqCtx>, first: u32, ticket: TransferTicket },
    /// Prefill rank: send the held KV of `ticket.req`, then release it.
    SendKv { ticket: TransferTicket },
    /// Decode rank: abandon an incoming transfer and return its blocks.
    CancelRecv { id: ReqId },
    /// Prefill rank: drop the held KV of a request whose transfer was abandoned.
    Release { id: ReqId },
    /// Any rank: the client is gone; drop the request wherever it is here.
    Abort { id: ReqId },
    /// Wakes an idle rank (e.g. to notice an injected fault).
    Wake,
    /// End every request with an error and exit.
    Shutdown,
}

/// Failures a test can inject into a rank (see [`crate::Cluster::inject_fault`]). One-shot: the
/// restarted rank is healthy.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Panic at the next loop iteration.
    Panic,
    /// Panic when asked to send a KV transfer (after the decode rank reserved its blocks).
    PanicOnKvSend,
    /// Report a transport error on the next KV send.
    FailKvSend,
    /// The group's rank at this position (1.., a rank on its own thread) panics in the next step.
    PanicOnGroupRank(usize),
    /// The next step takes this much longer (a slow step, not a dead rank).
    SlowStep(Duration),
    /// Stop answering (no heartbeat, no steps) for this long.
    Hang(Duration),
}
