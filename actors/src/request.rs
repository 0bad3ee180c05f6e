//! A request's shared context (prompt, parameters, the sender of its token stream, who owns it
//! now) and the client-side [`TokenStream`].
//!
//! Ownership: at any time a request is owned by one rank incarnation, by the KV-transfer actor,
//! or by nobody (being recovered). Every hand-over is a compare-and-set under the context's lock,
//! and a rank may only send tokens while it owns the request, so a request is recovered exactly
//! once and a rank that was declared dead can never write into a stream again.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use cleave_engine::{Request, SamplingParams, TokenOutput};
use futures::Stream;

use crate::error::ActorError;
use crate::ledger::Ledger;
use crate::metrics::Metrics;

/// Cluster-wide request id (also the engine's sequence id on every rank).
pub type ReqId = u64;

/// Owner value: nobody (new, or being recovered).
pub(crate) const OWNER_NONE: u64 = 0;
/// Owner value: the KV-transfer actor.
pub(crate) const OWNER_TRANSFER: u64 = u64::MAX;

/// What requests need from the cluster that runs them (the rank table implements it).
pub(crate) trait Hub: Send + Sync {
    fn metrics(&self) -> &Metrics;
    /// Requests alive: from submission until no rank holds the request and its client has
    /// read the last event or dropped the stream (see [`InFlight`]).
    fn in_flight(&self) -> &AtomicUsize;
    /// Drops request `id` wherever it is.
    fn abort(&self, id: ReqId);
    fn is_shutting_down(&self) -> bool;
}

/// One request's place in the hub's in-flight count, held by its context (the ranks) and by
/// its stream (the client); given back when both are gone.
struct InFlight(Arc<dyn Hub>);

impl InFlight {
    fn new(hub: Arc<dyn Hub>) -> Arc<Self> {
        hub.in_flight().fetch_add(1, Ordering::SeqCst);
        Arc::new(InFlight(hub))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight().fetch_sub(1, Ordering::SeqCst);
    }
}

/// One event of a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A sampled token; the last one has `finish` set.
    Token(TokenOutput),
    /// The request failed; nothing follows.
    Error(ActorError),
}

struct CtxState {
    owner: u64,
    generated: Vec<u32>,
    last_token_at: Option<Instant>,
    /// When a rank first computed part of the request, and when its first token was sent.
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    /// A final token or an error was sent.
    done: bool,
    /// Times the request was recovered after a failure.
    recoveries: u32,
    /// Load the router put on the chosen decode rank until the request arrives there.
    decode_ledger: Option<Ledger>,
    /// Load the router put on the chosen prefill rank until its first token.
    prefill_ledger: Option<Ledger>,
}

/// What became of a token a rank tried to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Emit {
    Sent,
    /// The client dropped its stream.
    Gone,
    /// The sender does not own the request (any more).
    NotOwner,
}

/// Everything the ranks and actors share about one request.
pub(crate) struct ReqCtx {
    pub id: ReqId,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    tx: flume::Sender<StreamEvent>,
    cancelled: Arc<AtomicBool>,
    arrival: Instant,
    hub: Arc<dyn Hub>,
    _in_flight: Arc<InFlight>,
    state: Mutex<CtxState>,
}

impl ReqCtx {
    /// A new request, counted in flight until the last reference to it is dropped.
    pub fn new(id: ReqId, prompt: Vec<u32>, params: SamplingParams, hub: Arc<dyn Hub>) -> (Arc<ReqCtx>, TokenStream) {
        let (tx, rx) = flume::unbounded();
        let cancelled = Arc::new(AtomicBool::new(false));
        let in_flight = InFlight::new(hub.clone());
        let stream = TokenStream::new(id, rx, cancelled.clone(), hub.clone(), in_flight.clone());
        let state = CtxState {
            owner: OWNER_NONE,
            generated: Vec::new(),
            last_token_at: None,
            scheduled_at: None,
            first_token_at: None,
            done: false,
            recoveries: 0,
            decode_ledger: None,
            prefill_ledger: None,
        };
        let ctx = ReqCtx {
            id,
            prompt,
            params,
            tx,
            cancelled,
            arrival: Instant::now(),
            hub,
            _in_flight: in_flight,
            state: Mutex::new(state),
        };
        (Arc::new(ctx), stream)
    }

    fn lock(&self) -> MutexGuard<'_, CtxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn metrics(&self) -> &Metrics {
        self.hub.metrics()
    }

    /// Whether the client dropped its stream.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Moves ownership from `from` to `to`; false (and no change) when `from` is not the owner.
    pub fn claim(&self, from: u64, to: u64) -> bool {
        let mut st = self.lock();
        if st.owner != from || st.done {
            return false;
        }
        st.owner = to;
        true
    }

    /// Sends a token if `from` owns the request.
    pub fn emit(&self, from: u64, mut out: TokenOutput) -> Emit {
        let mut st = self.lock();
        if st.owner != from || st.done {
            return Emit::NotOwner;
        }
        out.prefilled = false;
        let (token, finish) = (out.token, out.finish);
        if self.tx.send(StreamEvent::Token(out)).is_err() {
            return Emit::Gone;
        }
        let now = Instant::now();
        let m = self.metrics();
        m.generation_tokens.inc();
        match st.last_token_at {
            None => {
                m.ttft.observe((now - self.arrival).as_secs_f64());
                let began = st.scheduled_at.unwrap_or(self.arrival);
                m.prefill_time.observe((now - began).as_secs_f64());
                st.first_token_at = Some(now);
            }
            Some(t) => m.itl.observe((now - t).as_secs_f64()),
        }
        st.last_token_at = Some(now);
        st.generated.push(token);
        if let Some(f) = finish {
            st.done = true;
            m.e2e.observe((now - self.arrival).as_secs_f64());
            m.decode_time.observe((now - st.first_token_at.unwrap_or(now)).as_secs_f64());
            m.requests_finished.with_label_values(&[f.as_str()]).inc();
        }
        Emit::Sent
    }

    /// Records that a rank computed the request's first chunk (its queue time ends); only the
    /// first time counts (not a recompute after a failure).
    pub fn mark_scheduled(&self) {
        let mut st = self.lock();
        if st.scheduled_at.is_none() {
            let now = Instant::now();
            st.scheduled_at = Some(now);
            self.metrics().queue_time.observe((now - self.arrival).as_secs_f64());
        }
    }

    /// Ends the stream with an error (unless it already ended or the client is gone).
    pub fn fail(&self, err: ActorError) {
        let mut st = self.lock();
        if st.done {
            return;
        }
        st.done = true;
        if !self.is_cancelled() {
            tracing::warn!(request_id = self.id, error = %err, "request failed");
            let _ = self.tx.send(StreamEvent::Error(err));
            self.metrics().requests_finished.with_label_values(&["error"]).inc();
        }
    }

    /// Tokens already sent to the client.
    pub fn generated_len(&self) -> usize {
        self.lock().generated.len()
    }

    /// Counts a recovery and returns how many there were, this one included.
    pub fn note_recovery(&self) -> u32 {
        let mut st = self.lock();
        st.recoveries += 1;
        st.recoveries
    }

    /// Tokens already sent to the client (a rank that takes the request over replays them).
    pub fn generated(&self) -> Vec<u32> {
        self.lock().generated.clone()
    }

    /// The original request (`prefill_only` as given).
    pub fn request(&self, prefill_only: bool) -> Request {
        Request { id: self.id, prompt: self.prompt.clone(), params: self.params.clone(), prefill_only }
    }

    pub fn set_decode_ledger(&self, l: Option<Ledger>) {
        self.lock().decode_ledger = l;
    }

    pub fn set_prefill_ledger(&self, l: Option<Ledger>) {
        self.lock().prefill_ledger = l;
    }
}

impl Drop for ReqCtx {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if !st.done {
            let reason = if self.cancelled.load(Ordering::SeqCst) { "abort" } else { "lost" };
            self.hub.metrics().requests_finished.with_label_values(&[reason]).inc();
        }
    }
}

/// The tokens of one request. Ends after a token with `finish` set or after an
/// [`StreamEvent::Error`]. Dropping it before the end aborts the request wherever it is and
/// frees its KV blocks on every rank.
pub struct TokenStream {
    id: ReqId,
    rx: flume::Receiver<StreamEvent>,
    stream: flume::r#async::RecvStream<'static, StreamEvent>,
    ended: bool,
    cancelled: Arc<AtomicBool>,
    hub: Arc<dyn Hub>,
    /// Given back with the last event.
    in_flight: Option<Arc<InFlight>>,
}

impl TokenStream {
    fn new(
        id: ReqId,
        rx: flume::Receiver<StreamEvent>,
        cancelled: Arc<AtomicBool>,
        hub: Arc<dyn Hub>,
        in_flight: Arc<InFlight>,
    ) -> Self {
        let stream = rx.clone().into_stream();
        TokenStream { id, rx, stream, ended: false, cancelled, hub, in_flight: Some(in_flight) }
    }

    /// The request id (as in logs).
    pub fn id(&self) -> ReqId {
        self.id
    }

    fn on(&mut self, r: Result<StreamEvent, flume::RecvError>) -> Option<StreamEvent> {
        if self.ended {
            return None;
        }
        let ev = match r {
            Ok(ev) => ev,
            // Every holder of the request is gone without a final event: never hang.
            Err(_) if self.hub.is_shutting_down() => StreamEvent::Error(ActorError::ShuttingDown),
            Err(_) => StreamEvent::Error(ActorError::Internal("the request was lost".into())),
        };
        if matches!(&ev, StreamEvent::Error(_) | StreamEvent::Token(TokenOutput { finish: Some(_), .. })) {
            self.ended = true;
            self.in_flight = None;
        }
        Some(ev)
    }

    /// The next event; `None` after the end.
    pub async fn recv_async(&mut self) -> Option<StreamEvent> {
        if self.ended {
            return None;
        }
        let r = self.rx.recv_async().await;
        self.on(r)
    }

    /// Blocking variant of [`TokenStream::recv_async`] (not for async contexts).
    pub fn recv(&mut self) -> Option<StreamEvent> {
        if self.ended {
            return None;
        }
        let r = self.rx.recv();
        self.on(r)
    }

    /// Marks the stream ended without aborting (the request never got queued).
    pub(crate) fn disarm(&mut self) {
        self.ended = true;
        self.in_flight = None;
    }

    /// Whether the final event was received.
    pub fn is_finished(&self) -> bool {
        self.ended
    }
}

impl Stream for TokenStream {
    type Item = StreamEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamEvent>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.stream).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(ev)) => Poll::Ready(self.on(Ok(ev))),
            Poll::Ready(None) => Poll::Ready(self.on(Err(flume::RecvError::Disconnected))),
        }
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        if !self.ended {
            self.cancelled.store(true, Ordering::SeqCst);
            tracing::debug!(request_id = self.id, "stream dropped: aborting");
            self.hub.abort(self.id);
        }
    }
}
