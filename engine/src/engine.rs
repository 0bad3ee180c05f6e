//! One rank's engine: requests in, tokens out. Each `step` schedules a batch, runs the model on
//! the backend, samples, detokenizes and applies the stop conditions.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::backend::{AttnSeq, Backend, KvLayout};
use crate::error::{EngineError, Result};
use crate::kv_cache::blocks_for;
use crate::model::{Model, StepInput};
use crate::sampler::{sample, skip_samples, Rng, SampleRow, Sampled, SamplingParams};
use crate::scheduler::{Scheduler, SchedulerConfig, SeqId};
use crate::stop::StopMatcher;
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// Limits of one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Longest prompt + output; `None`: the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            block_size: 64,
            num_blocks: 512,
            max_model_len: None,
        }
    }
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: SeqId,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Prefill, sample the first token, then hold the KV for a transfer.
    pub prefill_only: bool,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One sampled token of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    pub id: SeqId,
    pub token: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
    /// Newly completed text (empty without a tokenizer); never part of a stop string.
    pub text: String,
    pub finish: Option<FinishReason>,
    /// A prefill-only request's prompt KV is complete and held for transfer.
    pub prefilled: bool,
}

struct ReqState {
    params: SamplingParams,
    rng: Rng,
    generated: usize,
    detok: Option<IncrementalDecoder>,
    stop: StopMatcher,
    prefill_only: bool,
}

/// A model, its KV cache and its scheduler on one backend.
pub struct Engine<B: Backend> {
    be: B,
    model: Model<B>,
    cache: B::KvCache,
    sched: Scheduler,
    reqs: HashMap<SeqId, ReqState>,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
    max_len: usize,
}

impl<B: Backend> Engine<B> {
    /// Loads the checkpoint in `dir` (and its tokenizer when present) onto `be`.
    pub fn load(be: B, dir: &Path, cfg: EngineConfig) -> Result<Self> {
        let model = Model::load(&be, dir, cfg.max_model_len)?;
        let tokenizer =
            if dir.join("tokenizer.json").exists() { Some(Arc::new(Tokenizer::from_dir(dir)?)) } else { None };
        Self::new(be, model, tokenizer, cfg)
    }

    /// Wraps a loaded model.
    pub fn new(be: B, model: Model<B>, tokenizer: Option<Arc<Tokenizer>>, cfg: EngineConfig) -> Result<Self> {
        let mc = model.config();
        let max_len = model.max_len();
        for (name, v) in [
            ("max_num_seqs", cfg.max_num_seqs),
            ("max_num_batched_tokens", cfg.max_num_batched_tokens),
            ("block_size", cfg.block_size),
            ("num_blocks", cfg.num_blocks),
        ] {
            if v == 0 {
                return Err(EngineError::Config(format!("{name} must be positive")));
            }
        }
        if cfg.num_blocks * cfg.block_size < max_len {
            return Err(EngineError::CacheCapacity(format!(
                "{} blocks of {} tokens hold {} tokens, less than max_model_len {max_len}; raise num_blocks or lower max_model_len",
                cfg.num_blocks,
                cfg.block_size,
                cfg.num_blocks * cfg.block_size
            )));
        }
        let layout = KvLayout {
            layers: mc.num_hidden_layers,
            num_blocks: cfg.num_blocks,
            block_size: cfg.block_size,
            width: mc.latent_dim(),
        };
        let cache = be.alloc_kv_cache(layout)?;
        let mut eos = mc.eos_token_ids.clone();
        if let Some(id) = tokenizer.as_ref().and_then(|t| t.eos_token().and_then(|e| t.token_to_id(e))) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let sched = Scheduler::new(SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
            num_blocks: cfg.num_blocks,
        });
        Ok(Engine { be, model, cache, sched, reqs: HashMap::new(), tokenizer, eos, max_len })
    }

    pub fn backend(&self) -> &B {
        &self.be
    }
    /// The paged KV cache (device transports read a held request's blocks straight from it).
    pub fn kv_cache(&self) -> &B::KvCache {
        &self.cache
    }
    /// The backend and the KV cache at once, the cache writable (device transports receive
    /// straight into reserved blocks, through the backend that owns the cache).
    pub fn backend_and_kv_cache_mut(&mut self) -> (&B, &mut B::KvCache) {
        (&self.be, &mut self.cache)
    }
    pub fn model(&self) -> &Model<B> {
        &self.model
    }
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
    /// Longest prompt + output this engine serves.
    pub fn max_model_len(&self) -> usize {
        self.max_len
    }
    /// Token ids that end a sequence unless `ignore_eos`.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }
    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    fn validate(&self, r: &Request) -> Result<()> {
        let vocab = self.model.config().vocab_size;
        if r.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!("token id {t} is outside the vocabulary of {vocab}")));
        }
        if self.reqs.contains_key(&r.id) {
            return Err(EngineError::InvalidRequest(format!("request id {} is already in use", r.id)));
        }
        if r.params.max_tokens == 0 {
            return Err(EngineError::InvalidRequest("max_tokens must be at least 1".into()));
        }
        if r.prompt.len() + r.params.max_tokens > self.max_len {
            return Err(EngineError::InvalidRequest(format!(
                "this model's maximum context length is {} tokens; the prompt has {} and max_tokens is {}",
                self.max_len,
                r.prompt.len(),
                r.params.max_tokens
            )));
        }
        if !r.params.stop.is_empty() && self.tokenizer.is_none() {
            return Err(EngineError::InvalidRequest("stop strings need a tokenizer".into()));
        }
        Ok(())
    }

    /// Per-request state. `emitted` are tokens another rank already sampled and sent: they are
    /// replayed through the detokenizer and the stop matcher (their text discarded) so that text
    /// held back there (an incomplete character, a possible stop string) comes out here exactly
    /// as it would have without the move, and a seeded random stream continues after their draws.
    fn state_for(&self, r: &Request, emitted: &[u32]) -> Result<ReqState> {
        let mut detok =
            self.tokenizer.as_ref().map(|_| IncrementalDecoder::with_prompt(&r.prompt, r.params.skip_special_tokens));
        let mut stop = StopMatcher::new(&r.params.stop);
        if let (Some(tok), Some(detok)) = (&self.tokenizer, detok.as_mut()) {
            for &t in emitted {
                let delta = detok.push(tok, t)?;
                stop.push(&delta);
            }
        }
        let mut rng = r.params.seed.map_or_else(Rng::entropy, Rng::new);
        skip_samples(&mut rng, &r.params, emitted.len());
        Ok(ReqState {
            rng,
            params: r.params.clone(),
            generated: emitted.len(),
            detok,
            stop,
            prefill_only: r.prefill_only,
        })
    }

    /// Queues a request.
    pub fn add_request(&mut self, r: Request) -> Result<()> {
        self.validate(&r)?;
        let state = self.state_for(&r, &[])?;
        self.sched.add(r.id, r.prompt, r.prefill_only);
        self.reqs.insert(r.id, state);
        Ok(())
    }

    /// Queues a request that another rank started and that must continue here: `emitted` tokens
    /// were already sampled and sent to the client (the first token of a failed KV transfer, or
    /// the output of a rank that died). The prompt and those tokens are prefilled here, then
    /// sampling continues with `max_tokens`, `min_tokens` and the text exactly as if the request
    /// had never moved (a seeded random stream included).
    pub fn add_resumed(&mut self, r: Request, emitted: &[u32]) -> Result<()> {
        self.validate(&r)?;
        if emitted.len() >= r.params.max_tokens {
            return Err(EngineError::InvalidRequest(format!(
                "{} of max_tokens {} were already generated",
                emitted.len(),
                r.params.max_tokens
            )));
        }
        let state = self.state_for(&r, emitted)?;
        let mut tokens = r.prompt;
        tokens.extend_from_slice(emitted);
        self.sched.add(r.id, tokens, false);
        self.reqs.insert(r.id, state);
        Ok(())
    }

    /// Removes a request wherever it is and frees its blocks. Returns whether it existed.
    pub fn abort(&mut self, id: SeqId) -> bool {
        let known = self.reqs.remove(&id).is_some();
        self.sched.remove(id) || known
    }

    /// Aborts every request (after a failed step), returning their ids.
    pub fn abort_all(&mut self) -> Vec<SeqId> {
        let ids: Vec<SeqId> = self.reqs.keys().copied().collect();
        for &id in &ids {
            self.abort(id);
        }
        ids
    }

    /// Runs one batch. Returns the tokens sampled in it (none while only prefill chunks ran).
    pub fn step(&mut self) -> Result<Vec<TokenOutput>> {
        let work = self.sched.schedule();
        if work.is_empty() {
            return Ok(Vec::new());
        }
        let mut input = StepInput::default();
        let bs = self.sched.config().block_size;
        let mut samplers = Vec::new();
        for w in &work {
            let seq = self.sched.get(w.id).expect("scheduled sequence exists");
            let q_start = input.ids.len();
            for pos in w.start..w.start + w.len {
                input.ids.push(seq.tokens[pos]);
                input.positions.push(pos as u32);
                input.slots.push(seq.blocks[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            input.attn.seqs.push(AttnSeq {
                q_start,
                q_len: w.len,
                ctx_len: w.start + w.len,
                block_table: seq.blocks.clone(),
            });
            if w.sample {
                input.sample_rows.push((input.ids.len() - 1) as u32);
                samplers.push(w.id);
            }
        }
        let logits = self.model.forward(&self.be, &mut self.cache, &input)?;
        self.sched.commit(&work);
        let picked = self.pick(&logits, &samplers)?;
        let mut out = Vec::with_capacity(samplers.len());
        for (id, s) in samplers.into_iter().zip(picked) {
            out.push(self.on_token(id, s)?);
        }
        Ok(out)
    }

    /// Tokens suppressed for `id` now: EOS and stop ids before `min_tokens`.
    fn banned(&self, st: &ReqState) -> Vec<u32> {
        let p = &st.params;
        let mut banned: Vec<u32> = Vec::new();
        if st.generated < p.min_tokens {
            banned.extend(p.stop_token_ids.iter().copied());
            if !p.ignore_eos {
                banned.extend(self.eos.iter().copied());
            }
        }
        banned
    }

    /// Chooses the next token of each sampling sequence (row `i` of `logits` is `ids[i]`). Rows
    /// whose settings need no history are sampled where the logits are; only the others (repetition
    /// penalty, top logprobs, suppressed tokens) bring their logits to the host.
    fn pick(&mut self, logits: &B::Tensor, ids: &[SeqId]) -> Result<Vec<Sampled>> {
        let mut on_device = Vec::new();
        let mut on_host = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let banned = self.banned(&self.reqs[id]);
            let st = self.reqs.get_mut(id).expect("scheduled request has state");
            if SampleRow::fits(&st.params, !banned.is_empty()) {
                on_device.push(SampleRow::new(i as u32, &st.params, &mut st.rng));
            } else {
                on_host.push((i, banned));
            }
        }
        let mut out: Vec<Option<Sampled>> = vec![None; ids.len()];
        for (r, (token, logprob)) in on_device.iter().zip(self.be.sample(logits, &on_device)?) {
            out[r.row as usize] = Some(Sampled { token, logprob, top: Vec::new() });
        }
        if !on_host.is_empty() {
            let rows: Vec<u32> = on_host.iter().map(|(i, _)| *i as u32).collect();
            let host = self.be.download(&self.be.gather_rows(logits, &rows)?)?;
            let vocab = self.model.config().vocab_size;
            for (j, (i, banned)) in on_host.into_iter().enumerate() {
                let st = self.reqs.get_mut(&ids[i]).expect("scheduled request has state");
                let seq = self.sched.get(ids[i]).expect("scheduled sequence exists");
                let p = &st.params;
                let history = if p.repetition_penalty != 1.0 { &seq.tokens[..] } else { &[] };
                out[i] = Some(sample(&host[j * vocab..(j + 1) * vocab], p, &mut st.rng, history, &banned));
            }
        }
        Ok(out.into_iter().map(|s| s.expect("every row sampled")).collect())
    }

    fn on_token(&mut self, id: SeqId, s: Sampled) -> Result<TokenOutput> {
        let st = self.reqs.get_mut(&id).expect("scheduled request has state");
        let seq = self.sched.get(id).expect("scheduled sequence exists");
        let p = &st.params;
        let total_len = seq.tokens.len() + 1;
        st.generated += 1;
        let mut finish = None;
        if (!p.ignore_eos && self.eos.contains(&s.token)) || p.stop_token_ids.contains(&s.token) {
            finish = Some(FinishReason::Stop);
        }
        let mut text = String::new();
        let mut hit_stop_string = false;
        if let (Some(tok), Some(detok)) = (&self.tokenizer, st.detok.as_mut()) {
            let delta = if finish.is_none() { detok.push(tok, s.token)? } else { String::new() };
            (text, hit_stop_string) = st.stop.push(&delta);
        }
        if hit_stop_string {
            finish = Some(FinishReason::Stop);
        } else if finish.is_none() && (st.generated >= p.max_tokens || total_len >= self.max_len) {
            finish = Some(FinishReason::Length);
        }
        if let (true, false, Some(tok), Some(detok)) =
            (finish.is_some(), hit_stop_string, &self.tokenizer, st.detok.as_mut())
        {
            // Ended by EOS, a stop token or a limit: release the text still held back (an
            // incomplete character, a possible start of a stop string), unless it completes one.
            let (emit, hit) = st.stop.push(&detok.finish(tok)?);
            text.push_str(&emit);
            if !hit {
                text.push_str(&st.stop.flush());
            }
        }
        let prefill_only = st.prefill_only;
        self.sched.push_token(id, s.token);
        let mut prefilled = false;
        if finish.is_some() {
            self.reqs.remove(&id);
            self.sched.remove(id);
        } else if prefill_only {
            self.sched.hold(id);
            prefilled = true;
        }
        Ok(TokenOutput { id, token: s.token, logprob: s.logprob, top_logprobs: s.top, text, finish, prefilled })
    }

    /// The held prompt KV of a prefilled request: its blocks' contents, covering `prompt_len`
    /// tokens, in block order.
    pub fn export_kv(&self, id: SeqId) -> Result<(usize, Vec<f32>)> {
        let seq =
            self.sched.get(id).ok_or_else(|| EngineError::InvalidRequest(format!("no sequence {id} to export")))?;
        let n = blocks_for(seq.prompt_len, self.sched.config().block_size);
        Ok((seq.prompt_len, self.be.export_blocks(&self.cache, &seq.blocks[..n])?))
    }

    /// Frees a held (transferred) request.
    pub fn release(&mut self, id: SeqId) -> bool {
        self.abort(id)
    }

    /// Reserves blocks for an incoming transfer of `tokens` tokens.
    pub fn reserve_blocks(&mut self, tokens: usize) -> Option<Vec<u32>> {
        self.sched.reserve(blocks_for(tokens, self.sched.config().block_size))
    }

    /// Returns reserved blocks after a failed transfer.
    pub fn unreserve_blocks(&mut self, blocks: &[u32]) {
        self.sched.unreserve(blocks);
    }

    /// Writes transferred KV into reserved blocks.
    pub fn import_kv(&mut self, blocks: &[u32], data: &[f32]) -> Result<()> {
        self.be.import_blocks(&mut self.cache, blocks, data)
    }

    /// Admits a request whose prompt KV was imported into `blocks` and whose first token was
    /// already sampled (and sent to the client) by a prefill rank.
    pub fn admit_prefilled(&mut self, r: Request, first_token: u32, blocks: Vec<u32>) -> Result<()> {
        self.validate(&r)?;
        let state = self.state_for(&r, &[first_token])?;
        let prompt_len = r.prompt.len();
        let mut tokens = r.prompt;
        tokens.push(first_token);
        self.sched.add_computed(r.id, tokens, prompt_len, prompt_len, blocks);
        self.reqs.insert(r.id, state);
        Ok(())
    }

    /// Runs `requests` to completion and returns each one's outputs (a convenience for the CLI
    /// and tests).
    pub fn generate(&mut self, requests: Vec<Request>) -> Result<HashMap<SeqId, Vec<TokenOutput>>> {
        let mut out: HashMap<SeqId, Vec<TokenOutput>> = HashMap::new();
        for r in requests {
            out.insert(r.id, Vec::new());
            self.add_request(r)?;
        }
        while self.has_work() {
            for t in self.step()? {
                out.entry(t.id).or_default().push(t);
            }
        }
        Ok(out)
    }
}
