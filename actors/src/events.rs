//! The messages ranks send to the actors above them: life-cycle events to their pool, transfer
//! progress to the KV-transfer actor. Ranks hold only [`RankEvents`] (typed recipients), so they
//! depend on these messages, never on the actors that handle them.

use std::sync::Arc;

use actix::{Message, Recipient};

use crate::request::{ReqCtx, ReqId};
use crate::transport::TransportError;

/// A rank loaded its model and runs its loop.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RankReady {
    pub slot: usize,
    pub inc: u64,
}

/// A rank's thread ended: cleanly (`error: None`), failing to load (`loaded: false`), or failing
/// while serving.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RankExited {
    pub slot: usize,
    pub inc: u64,
    pub loaded: bool,
    pub error: Option<String>,
}

/// A prefill rank finished a prompt and handed the request (owner: transfer) over.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Prefilled {
    pub ctx: Arc<ReqCtx>,
    pub first: u32,
    pub src: usize,
    pub src_inc: u64,
    /// The KV port that sends (the sampling rank of the prefill group's DP rank holding it).
    pub sender: usize,
    /// The decode slot chosen up front.
    pub dst: usize,
}

/// The decode rank reserved blocks for a transfer.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Reserved {
    pub id: ReqId,
    pub dst_inc: u64,
    pub blocks: Vec<u32>,
    /// Leading blocks the decode rank already caches: the prefill rank does not send them.
    pub cached_blocks: usize,
    /// The KV ports that receive (every TP rank of the decode group's DP rank).
    pub receivers: Vec<usize>,
}

/// The prefill rank sent (or failed to send) a transfer's KV and released it.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct SendDone {
    pub id: ReqId,
    pub src_inc: u64,
    pub result: Result<u64, TransportError>,
}

/// The decode rank received and admitted a transfer (bytes), or gave it up.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RecvDone {
    pub id: ReqId,
    pub dst_inc: u64,
    pub result: Result<u64, TransportError>,
}

/// A rank incarnation died; transfers from or to it fail now rather than at their timeout.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RankDown {
    pub slot: usize,
    pub inc: u64,
}

/// Where a rank reports: its pool (life cycle) and the KV-transfer actor (transfers).
#[derive(Clone)]
pub(crate) struct RankEvents {
    pub ready: Recipient<RankReady>,
    pub exited: Recipient<RankExited>,
    pub prefilled: Recipient<Prefilled>,
    pub reserved: Recipient<Reserved>,
    pub sent: Recipient<SendDone>,
    pub received: Recipient<RecvDone>,
}
