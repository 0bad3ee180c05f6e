//! The scheduling core of one group (one copy of the model): requests in, tokens out. Each
//! `step` schedules a batch per DP rank, has the group's runners execute it, samples, detokenizes
//! and applies the stop conditions. Scheduling lives here, execution in [`crate::runner`].

mod blocks;
mod step;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::group::{RankGroup, RunnerFactory};
use crate::model::{LoadOptions, Model};
use crate::parallel::{InProcGroup, ParallelConfig};
use crate::request_check::RequestLimits;
use crate::runner::{CacheSize, ModelRunner};
use crate::sampler::{count_output, skip_samples, OutputCounts, Rng, SamplingParams};
use crate::scheduler::{Scheduler, SchedulerConfig, SeqId, Sequence};
use crate::stop::StopMatcher;
use crate::tokenizer::{IncrementalDecoder, Tokenizer};
use crate::weights::LoadFormat;

/// Limits of one group; `num_blocks` is per DP rank (each holds its own cache).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Longest prompt + output; `None`: the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Reuse the KV of cached prompt prefixes (on by default, as in vLLM).
    pub enable_prefix_caching: bool,
    /// Run every step eagerly: capture no CUDA graphs (vLLM's name). Off by default: a rank
    /// whose backend captures graphs and that has no collectives captures decode steps of
    /// [`crate::graphs::capture_sizes`]`(max_num_seqs)` rows at start-up.
    pub enforce_eager: bool,
    /// Where the weights come from (vLLM's `--load-format`).
    pub load_format: LoadFormat,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            block_size: 64,
            num_blocks: 512,
            max_model_len: None,
            enable_prefix_caching: true,
            enforce_eager: false,
            load_format: LoadFormat::Safetensors,
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
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Prompt tokens whose KV came from the prefix cache of the rank that computed the prompt
    /// (OpenAI's `usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
}

struct ReqState {
    params: SamplingParams,
    /// The structured-output constraint in progress.
    guide: Option<crate::structured::Guide>,
    rng: Rng,
    generated: usize,
    /// The output counted, for the presence and frequency penalties (empty without them).
    output_counts: OutputCounts,
    detok: Option<IncrementalDecoder>,
    stop: StopMatcher,
    prefill_only: bool,
}

/// Scheduler totals over a group's DP ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub held: usize,
    pub used_blocks: usize,
    pub free_blocks: usize,
    pub preemptions: u64,
    pub pending_prefill_tokens: usize,
    /// Prefix-cache counters summed over the DP ranks.
    pub prefix: crate::kv_cache::PrefixStats,
}

/// One copy of the model over its group's ranks, with a scheduler (and block space) per DP rank.
pub struct Engine<B: Backend> {
    group: RankGroup<B>,
    scheds: Vec<Scheduler>,
    /// The DP rank of each sequence.
    placed: HashMap<SeqId, usize>,
    reqs: HashMap<SeqId, ReqState>,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<u32>,
    max_len: usize,
    vocab: usize,
    cfg: EngineConfig,
    /// Sequences whose first chunk ran in the last step.
    started: Vec<SeqId>,
    /// Structured-output compiler, built at the first constrained request.
    guides: std::sync::OnceLock<Arc<crate::structured::GuideCompiler>>,
    /// Incoming KV transfers in progress: which TP ranks of the receiving DP rank have their copy.
    receiving: HashMap<u64, Vec<bool>>,
}

fn check_limits(cfg: &EngineConfig, max_len: usize) -> Result<()> {
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
    Ok(())
}

impl EngineConfig {
    /// The cache each rank allocates.
    pub fn cache_size(&self) -> CacheSize {
        CacheSize { block_size: self.block_size, num_blocks: self.num_blocks }
    }

    /// How each rank loads its part of the model.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions { max_len: self.max_model_len, format: self.load_format }
    }
}

impl<B: Backend + 'static> Engine<B> {
    /// Loads `dir` over a group of `par` ranks that are threads of this process, each with its
    /// backend from `backend(rank)` (called on that rank's thread) and in-process collectives.
    pub fn load_parallel(
        par: ParallelConfig,
        dir: &Path,
        cfg: EngineConfig,
        backend: impl Fn(usize) -> Result<B> + Send + Sync + 'static,
    ) -> Result<Self> {
        par.check()?;
        let tokenizer = Tokenizer::from_dir_if_present(dir)?;
        Self::start(par, Self::in_process_runners(par, dir, cfg, backend), tokenizer, cfg)
    }

    /// Runners for ranks that are threads of this process: each loads its part of `dir` onto
    /// `backend(rank)` (called on its thread) and joins the group's in-process collectives.
    pub fn in_process_runners(
        par: ParallelConfig,
        dir: &Path,
        cfg: EngineConfig,
        backend: impl Fn(usize) -> Result<B> + Send + Sync + 'static,
    ) -> Arc<RunnerFactory<B>> {
        let comms = InProcGroup::new(par);
        let path = dir.to_path_buf();
        Arc::new(move |coord: crate::parallel::RankCoord| {
            let comm: Box<dyn crate::parallel::Collectives<B>> = Box::new(comms.member(coord.rank()));
            let be = backend(coord.rank())?;
            ModelRunner::load(be, &path, cfg.load_options(), cfg.cache_size(), coord, Some(comm))
        })
    }

    /// Starts a group whose runners `make` builds (each on its rank's thread).
    pub fn start(
        par: ParallelConfig,
        make: Arc<RunnerFactory<B>>,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        par.check()?;
        let group = RankGroup::start(par, make)?;
        // Ranks that sized their caches from free memory (num_blocks 0) may differ: the group
        // schedules what every rank holds.
        let cfg = EngineConfig { num_blocks: group.num_blocks(), ..cfg };
        Self::from_group(group, tokenizer, cfg)
    }
}

impl<B: Backend> Engine<B> {
    /// Loads the checkpoint in `dir` (and its tokenizer when present) onto `be`: a group of one.
    pub fn load(be: B, dir: &Path, cfg: EngineConfig) -> Result<Self> {
        let model = Model::load(&be, dir, cfg.load_options())?;
        let tokenizer = Tokenizer::from_dir_if_present(dir)?;
        Self::new(be, model, tokenizer, cfg)
    }

    /// Wraps a loaded model: a group of one.
    pub fn new(be: B, model: Model<B>, tokenizer: Option<Arc<Tokenizer>>, cfg: EngineConfig) -> Result<Self> {
        let runner = ModelRunner::new(be, model, cfg.cache_size(), None)?;
        Self::from_group(RankGroup::single(runner), tokenizer, cfg)
    }

    fn from_group(mut group: RankGroup<B>, tokenizer: Option<Arc<Tokenizer>>, cfg: EngineConfig) -> Result<Self> {
        check_limits(&cfg, group.local().model().max_len())?;
        if !cfg.enforce_eager && group.can_capture() {
            let t0 = std::time::Instant::now();
            let world = group.parallel().world();
            match group.capture_graphs(&crate::graphs::capture_sizes(cfg.max_num_seqs)) {
                Ok(r) => tracing::info!(
                    graphs = r.sizes.len(),
                    largest = r.sizes.last().copied().unwrap_or(0),
                    ranks = world,
                    ms = t0.elapsed().as_millis() as u64,
                    "captured decode steps (CUDA graphs; enforce_eager turns them off)"
                ),
                // A group's collectives are out of step after a failed capture: it cannot serve.
                Err(e) if world > 1 => {
                    return Err(EngineError::Backend(format!(
                        "capturing CUDA graphs on the group failed ({e}); enforce_eager runs every step eagerly"
                    )))
                }
                Err(e) => tracing::warn!(error = %e, "CUDA graph capture failed: every step runs eagerly"),
            }
        }
        let model = group.local().model();
        let mc = model.config();
        let max_len = model.max_len();
        let mut eos = mc.eos_token_ids.clone();
        if let Some(id) = tokenizer.as_ref().and_then(|t| t.eos_token().and_then(|e| t.token_to_id(e))) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let vocab = mc.vocab_size;
        let sc = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
            num_blocks: cfg.num_blocks,
            enable_prefix_caching: cfg.enable_prefix_caching,
        };
        let scheds = (0..group.parallel().data_parallel_size).map(|_| Scheduler::new(sc)).collect();
        Ok(Engine {
            group,
            scheds,
            placed: HashMap::new(),
            reqs: HashMap::new(),
            tokenizer,
            eos,
            max_len,
            vocab,
            cfg,
            started: Vec::new(),
            guides: std::sync::OnceLock::new(),
            receiving: HashMap::new(),
        })
    }

    /// How the model is spread over this engine's ranks.
    pub fn parallel(&self) -> ParallelConfig {
        self.group.parallel()
    }
    /// Rank 0's runner: its backend, cache and model part (the whole model in a group of one;
    /// device transports read and write a group of one's cache through it).
    /// Fault injection (operators' drills, tests): group rank `rank` (1..) panics inside the next
    /// step; the step then fails on every rank.
    #[doc(hidden)]
    pub fn arm_rank_panic(&self, rank: usize) -> Result<()> {
        self.group.arm_panic(rank)
    }

    pub fn local_runner(&self) -> &ModelRunner<B> {
        self.group.local()
    }
    pub fn local_runner_mut(&mut self) -> &mut ModelRunner<B> {
        self.group.local_mut()
    }
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }
    /// The model's configuration.
    pub fn model_config(&self) -> &crate::model::ModelConfig {
        self.group.local().model().config()
    }
    /// The limits this engine was built with.
    pub fn config(&self) -> EngineConfig {
        self.cfg
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
        self.scheds.iter().any(Scheduler::has_work)
    }
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }
    /// A sequence's tokens and cache state (block ids local to its DP rank).
    /// Sequences whose first chunk (position 0) was computed in the last step: their wait in the
    /// queue ended there (a preempted sequence starts again from 0).
    pub fn last_started(&self) -> &[SeqId] {
        &self.started
    }

    pub fn sequence(&self, id: SeqId) -> Option<&Sequence> {
        self.scheds[*self.placed.get(&id)?].get(id)
    }
    /// Totals over the DP ranks' schedulers.
    pub fn stats(&self) -> EngineStats {
        let mut t = EngineStats::default();
        for s in &self.scheds {
            t.running += s.num_running();
            t.waiting += s.num_waiting();
            t.held += s.num_held();
            t.used_blocks += s.num_used_blocks();
            t.free_blocks += s.num_free_blocks();
            t.preemptions += s.preemptions();
            t.pending_prefill_tokens += s.pending_prefill_tokens();
            let p = s.prefix_stats();
            t.prefix.queried_tokens += p.queried_tokens;
            t.prefix.hit_tokens += p.hit_tokens;
            t.prefix.evicted_blocks += p.evicted_blocks;
            t.prefix.cached_blocks += p.cached_blocks;
        }
        t
    }

    /// Changes to the cached prefixes of every DP rank since the last call (a prefix cached on
    /// two DP ranks is stored twice).
    pub fn take_cache_events(&mut self) -> Vec<crate::kv_cache::CacheEvent> {
        self.scheds.iter_mut().flat_map(|s| s.take_cache_events()).collect()
    }

    fn validate(&self, r: &Request) -> Result<()> {
        let limits = RequestLimits { vocab_size: self.vocab, max_model_len: self.max_len };
        limits.check(&r.prompt, &r.params, "prompt").map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        if self.reqs.contains_key(&r.id) {
            return Err(EngineError::InvalidRequest(format!("request id {} is already in use", r.id)));
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
        let mut guide = match &r.params.guided {
            Some(g) => Some(self.guide_compiler()?.start(g)?),
            None => None,
        };
        if let Some(g) = guide.as_mut() {
            for &t in emitted {
                g.advance(t, self.eos.contains(&t));
            }
        }
        Ok(ReqState {
            rng,
            guide,
            params: r.params.clone(),
            generated: emitted.len(),
            output_counts: if r.params.counts_output() { count_output(emitted) } else { OutputCounts::new() },
            detok,
            stop,
            prefill_only: r.prefill_only,
        })
    }

    /// The block hashes of `tokens` (none when prefix caching is off).
    fn hashes(&self, tokens: &[u32]) -> Vec<crate::kv_cache::BlockHash> {
        if !self.cfg.enable_prefix_caching {
            return Vec::new();
        }
        crate::kv_cache::block_hashes(tokens, self.cfg.block_size)
    }

    fn guide_compiler(&self) -> Result<&Arc<crate::structured::GuideCompiler>> {
        if let Some(c) = self.guides.get() {
            return Ok(c);
        }
        let tok = self
            .tokenizer
            .clone()
            .ok_or_else(|| EngineError::InvalidRequest("structured outputs need the model's tokenizer".into()))?;
        let eos = self.eos.first().copied().unwrap_or(0);
        let c = crate::structured::GuideCompiler::new(tok, self.vocab, eos)?;
        Ok(self.guides.get_or_init(|| Arc::new(c)))
    }

    /// The DP rank a new sequence goes to: the one caching the longest prefix of `tokens`
    /// unless it is much busier ([`crate::kv_cache::pick_cached`]), then the fewest sequences,
    /// then the most free blocks.
    fn place(&self, tokens: &[u32]) -> usize {
        if self.scheds.len() == 1 {
            return 0;
        }
        let hashes = self.hashes(tokens);
        let cands: Vec<_> = self
            .scheds
            .iter()
            .map(|s| {
                let load = s.num_running() + s.num_waiting() + s.num_held();
                (load, s.cached_blocks(&hashes), (load, std::cmp::Reverse(s.num_free_blocks())))
            })
            .collect();
        crate::kv_cache::pick_cached(&cands).unwrap_or(0)
    }

    fn enqueue(&mut self, id: SeqId, tokens: Vec<u32>, prefill_only: bool, state: ReqState) {
        let dp = self.place(&tokens);
        self.scheds[dp].add(id, tokens, prefill_only);
        self.placed.insert(id, dp);
        self.reqs.insert(id, state);
    }

    /// Queues a request.
    pub fn add_request(&mut self, r: Request) -> Result<()> {
        self.validate(&r)?;
        let state = self.state_for(&r, &[])?;
        self.enqueue(r.id, r.prompt, r.prefill_only, state);
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
        self.enqueue(r.id, tokens, false, state);
        Ok(())
    }

    /// Removes a request wherever it is and frees its blocks. Returns whether it existed.
    pub fn abort(&mut self, id: SeqId) -> bool {
        let known = self.reqs.remove(&id).is_some();
        let scheduled = match self.placed.remove(&id) {
            Some(dp) => self.scheds[dp].remove(id),
            None => false,
        };
        scheduled || known
    }

    /// Aborts every request (after a failed step), returning their ids.
    pub fn abort_all(&mut self) -> Vec<SeqId> {
        let ids: Vec<SeqId> = self.reqs.keys().copied().collect();
        for &id in &ids {
            self.abort(id);
        }
        ids
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

    /// Greedy completions of `prompts` with EOS ignored, `lens[i]` tokens for prompt `i`, in
    /// prompt order (the references' checks: golden fixtures, parallel layouts).
    pub fn generate_greedy(&mut self, prompts: &[Vec<u32>], lens: &[usize]) -> Result<Vec<Vec<TokenOutput>>> {
        let requests = prompts
            .iter()
            .zip(lens)
            .enumerate()
            .map(|(i, (p, &n))| Request {
                id: i as u64,
                prompt: p.clone(),
                params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) },
                prefill_only: false,
            })
            .collect();
        let mut out = self.generate(requests)?;
        Ok((0..prompts.len()).map(|i| out.remove(&(i as u64)).unwrap_or_default()).collect())
    }
}
