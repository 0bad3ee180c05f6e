//! How a prompt's latent KV moves from a prefill rank to a decode rank.
//!
//! Both sides of a [`Transport`] run on the rank threads that own the caches: `send` on the
//! prefill rank's thread, `poll_recv` on the decode rank's thread (straight into the blocks it
//! reserved). Each rank gets its own endpoint from its [`crate::RankFactory`], created on its
//! thread, so a GPU transport can hold that thread's device context and NCCL communicator.
//! [`MemcpyHub`] is the transport between CPU ranks of one process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cleave_engine::backend::Backend;
use cleave_engine::{Engine, EngineError};

use crate::request::ReqId;

/// One KV move, as the KV-transfer actor describes it to both ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferTicket {
    /// The request (and the engine sequence id on both ranks).
    pub req: ReqId,
    /// Configured rank ids (device ordinals on GPUs).
    pub src_rank: usize,
    pub dst_rank: usize,
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

/// One rank's endpoint of the KV transport.
pub trait Transport<B: Backend> {
    /// On the prefill rank: sends the held prompt KV of `ticket.req`. Returns the bytes sent once
    /// the source blocks may be released.
    fn send(&mut self, engine: &Engine<B>, ticket: &TransferTicket) -> Result<u64, TransportError>;
    /// On the decode rank, called on every loop iteration until it returns `Some(bytes)` (the
    /// KV sits in `ticket.blocks`) or an error. Must not block for long: the rank keeps decoding
    /// its other sequences between calls.
    fn poll_recv(&mut self, engine: &mut Engine<B>, ticket: &TransferTicket) -> Result<Option<u64>, TransportError>;
    /// Drops whatever this side keeps for an abandoned transfer (timeout, abort, failure).
    fn cancel(&mut self, ticket: &TransferTicket);
}

/// How long unclaimed data stays in the hub after its deadline.
const GRACE: Duration = Duration::from_secs(5);

type Parcels = HashMap<ReqId, (Instant, Vec<f32>)>;

/// In-process mailbox for CPU ranks: the sender exports the blocks into it, the receiver imports
/// them from it.
#[derive(Clone, Default)]
pub struct MemcpyHub {
    parcels: Arc<Mutex<Parcels>>,
}

impl MemcpyHub {
    pub fn new() -> Self {
        Self::default()
    }

    /// An endpoint for one rank.
    pub fn endpoint(&self) -> MemcpyTransport {
        MemcpyTransport { parcels: self.parcels.clone() }
    }

    /// Parcels waiting to be received (tests check that nothing is left behind).
    pub fn pending(&self) -> usize {
        self.parcels.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A rank's endpoint of a [`MemcpyHub`].
pub struct MemcpyTransport {
    parcels: Arc<Mutex<Parcels>>,
}

impl MemcpyTransport {
    fn lock(&self) -> std::sync::MutexGuard<'_, Parcels> {
        self.parcels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: Backend> Transport<B> for MemcpyTransport {
    fn send(&mut self, engine: &Engine<B>, ticket: &TransferTicket) -> Result<u64, TransportError> {
        if Instant::now() >= ticket.deadline {
            // The receiver gives up at the deadline: a parcel now would never be collected.
            return Err(TransportError::TimedOut(format!(
                "rank {}: the transfer's deadline passed before the send",
                ticket.src_rank
            )));
        }
        let (len, data) = engine
            .export_kv(ticket.req, ticket.cached_blocks)
            .map_err(|e| TransportError::from_engine(&format!("export on rank {}", ticket.src_rank), e))?;
        if len != ticket.prompt_len {
            return Err(TransportError::Failed(format!(
                "rank {} holds {len} prompt tokens, the ticket says {}",
                ticket.src_rank, ticket.prompt_len
            )));
        }
        let bytes = (data.len() * std::mem::size_of::<f32>()) as u64;
        let now = Instant::now();
        let mut p = self.lock();
        p.retain(|_, (deadline, _)| *deadline + GRACE > now);
        p.insert(ticket.req, (ticket.deadline, data));
        Ok(bytes)
    }

    fn poll_recv(&mut self, engine: &mut Engine<B>, ticket: &TransferTicket) -> Result<Option<u64>, TransportError> {
        let Some((_, data)) = self.lock().remove(&ticket.req) else { return Ok(None) };
        engine
            .import_kv(ticket.moving(), &data)
            .map_err(|e| TransportError::from_engine(&format!("import on rank {}", ticket.dst_rank), e))?;
        Ok(Some((data.len() * std::mem::size_of::<f32>()) as u64))
    }

    fn cancel(&mut self, ticket: &TransferTicket) {
        self.lock().remove(&ticket.req);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_deadline_stays_a_timeout_through_the_layers() {
        let t = TransportError::from_engine("receive on rank 1", EngineError::Timeout("late".into()));
        assert_eq!(t, TransportError::TimedOut("receive on rank 1: late".into()));
        assert_eq!(t.label(), "timeout");
        let f = TransportError::from_engine("send from rank 0", EngineError::Backend("cuda: boom".into()));
        assert_eq!(f.label(), "error");
        assert!(f.to_string().contains("cuda: boom"), "{f}");
    }
}
