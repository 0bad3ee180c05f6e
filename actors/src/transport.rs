//! What the KV-transfer actor tells both ranks of a transfer, and how a side fails. The moves
//! themselves run on the ranks' KV ports (`cleave_engine::kv_port`): the engine sends from the
//! sampling rank of the prefill group's DP rank to every TP rank of the decode group's DP rank,
//! each on its own thread, cache to cache.

use std::time::Instant;

use cleave_engine::EngineError;

use crate::request::ReqId;

/// One KV move, as the KV-transfer actor describes it to both ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferTicket {
    /// The request (and the engine sequence id on both ranks).
    pub req: ReqId,
    /// The groups' configured rank ids (their first ranks; device ordinals on GPUs).
    pub src_rank: usize,
    pub dst_rank: usize,
    /// The KV port that sends, and those that receive (a TP decode group's every rank).
    pub sender: usize,
    pub receivers: Vec<usize>,
    /// Prompt tokens whose KV moves.
    pub prompt_len: usize,
    /// The decode rank's reserved blocks (`blocks_for(prompt_len)` of them).
    pub blocks: Vec<u32>,
    /// Leading `blocks` that already hold the prompt's KV from the decode rank's prefix cache;
    /// only the rest move.
    pub cached_blocks: usize,
    /// The transfer has failed if not complete by then.
    pub deadline: Instant,
}

/// Why one side of a KV transfer failed; the message says which side and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The transfer's deadline passed.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The transfer was given up: the client left, or the other side abandoned it.
    #[error("abandoned: {0}")]
    Abandoned(String),
    /// The transport, a device or an engine failed.
    #[error("{0}")]
    Failed(String),
}

impl TransportError {
    /// The `reason` label of `cleave:kv_transfer_failures_total`.
    pub fn label(&self) -> &'static str {
        match self {
            TransportError::TimedOut(_) => "timeout",
            TransportError::Abandoned(_) | TransportError::Failed(_) => "error",
        }
    }

    /// An engine error raised by `what`; a missed deadline stays a timeout.
    pub fn from_engine(what: &str, e: EngineError) -> Self {
        match e {
            EngineError::Timeout(m) => TransportError::TimedOut(format!("{what}: {m}")),
            e => TransportError::Failed(format!("{what}: {e}")),
        }
    }
}

impl TransferTicket {
    /// The reserved blocks the KV moves into.
    pub fn moving(&self) -> &[u32] {
        &self.blocks[self.cached_blocks.min(self.blocks.len())..]
    }
}
