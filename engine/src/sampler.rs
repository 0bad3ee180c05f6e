//! Token sampling: greedy, temperature, top-k, top-p, min-p, the repetition, presence and
//! frequency penalties, logit bias, seeded randomness, and the logprob of the chosen token under
//! the unmodified model distribution.

/// How to pick tokens and when to stop, per request (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub top_k: usize,
    /// In [0, 1]; 0 disables.
    pub min_p: f32,
    /// 1 disables; > 1 discourages tokens already in the prompt or output.
    pub repetition_penalty: f32,
    /// In [-2, 2]; 0 disables. Subtracted from the logit of every token the output holds.
    pub presence_penalty: f32,
    /// In [-2, 2]; 0 disables. Subtracted from a token's logit once per time the output holds it.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens (values in [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
    pub max_tokens: usize,
    /// EOS and stop token ids are suppressed until this many tokens exist.
    pub min_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    /// Stop strings; the output ends before them and never contains them.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// How many top alternatives to return with each token (0: none).
    pub top_logprobs: usize,
    pub skip_special_tokens: bool,
    /// What the output must match (structured outputs), enforced with token masks.
    pub guided: Option<crate::structured::Guided>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            top_logprobs: 0,
            skip_special_tokens: true,
            guided: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_tokens, ..Default::default() }
    }

    /// Whether picking a token needs the sequence's tokens so far (a penalty is set).
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 1.0 || self.counts_output()
    }

    /// Whether the presence or frequency penalty is set (they read [`OutputCounts`]).
    pub fn counts_output(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// How many times a sequence's output holds each token.
pub type OutputCounts = std::collections::HashMap<u32, u32>;

/// `tokens` counted.
pub fn count_output(tokens: &[u32]) -> OutputCounts {
    let mut counts = OutputCounts::new();
    for &t in tokens {
        *counts.entry(t).or_default() += 1;
    }
    counts
}

/// A sequence's tokens so far, for the penalties, as vLLM reads them: the repetition penalty
/// the prompt and the output (`tokens`), the presence and frequency penalties the output alone
/// (`output_counts`, which the engine keeps as tokens arrive, so a pick makes no pass over the
/// output).
#[derive(Debug, Clone, Copy, Default)]
pub struct History<'a> {
    pub tokens: &'a [u32],
    pub output_counts: Option<&'a OutputCounts>,
}

/// A sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Natural-log probability under the unmodified distribution.
    pub logprob: f32,
    /// The most likely tokens and their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same stream for the same seed.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e3779b97f4a7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    /// A seed from the clock and a counter, for requests without one.
    pub fn entropy() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `log_softmax(logits)[i]` for every i.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + logits.iter().map(|x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
    logits.iter().map(|x| x - lse).collect()
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

fn is_greedy(p: &SamplingParams) -> bool {
    p.temperature <= 1e-5
}

/// Advances `rng` past the random draws of `n` tokens sampled under `p` (one per non-greedy
/// token), so that a request resumed on another rank continues its seeded stream.
pub fn skip_samples(rng: &mut Rng, p: &SamplingParams, n: usize) {
    if !is_greedy(p) {
        for _ in 0..n {
            rng.next_f64();
        }
    }
}

/// Picks the next token. The logits are biased (`logit_bias`), then penalized for the tokens of
/// `history` (repetition: prompt and output, dividing positive logits and multiplying negative
/// ones; presence and frequency: the output, subtracted), as vLLM orders them. `banned` tokens
/// are never chosen (EOS before `min_tokens`); with `allowed` (one bit per token, see
/// [`crate::structured::allows`]) only its tokens are.
pub fn sample(
    logits: &[f32],
    p: &SamplingParams,
    rng: &mut Rng,
    history: History<'_>,
    banned: &[u32],
    allowed: Option<&[u32]>,
) -> Sampled {
    let logprobs = log_softmax(logits);
    let mut l = logits.to_vec();
    for &(t, b) in &p.logit_bias {
        if let Some(x) = l.get_mut(t as usize) {
            *x += b;
        }
    }
    penalize(&mut l, p, history);
    for &b in banned {
        if let Some(x) = l.get_mut(b as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
    if let Some(mask) = allowed {
        apply_mask(&mut l, mask);
    }
    let token = if is_greedy(p) { argmax(&l) } else { draw(&l, &SampleRow::new(0, p, rng)) };
    let top = if p.top_logprobs > 0 {
        let mut idx: Vec<usize> = (0..logprobs.len()).collect();
        let k = p.top_logprobs.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logprobs[b].total_cmp(&logprobs[a]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]).then(a.cmp(&b)));
        idx.into_iter().map(|i| (i as u32, logprobs[i])).collect()
    } else {
        Vec::new()
    };
    Sampled { token: token as u32, logprob: logprobs[token], top }
}

/// The repetition, presence and frequency penalties of `p` over `history`, applied to `l`.
fn penalize(l: &mut [f32], p: &SamplingParams, history: History<'_>) {
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; l.len()];
        for &t in history.tokens {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (x, s) in l.iter_mut().zip(seen) {
            if s {
                *x = if *x > 0.0 { *x / p.repetition_penalty } else { *x * p.repetition_penalty };
            }
        }
    }
    if p.counts_output() {
        for (&t, &n) in history.output_counts.into_iter().flatten() {
            if let Some(x) = l.get_mut(t as usize) {
                *x -= p.presence_penalty + p.frequency_penalty * n as f32;
            }
        }
    }
}

/// One row for device-side sampling: which row of the logits, the settings that need no history
/// (temperature, top-k, top-p, min-p) and the uniform draw `u` in [0, 1) taken from the request's
/// generator (unused when greedy), so that a seeded request gets the same tokens on every backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRow {
    pub row: u32,
    /// 0 (or below 1e-5) means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub u: f32,
    /// Index of the row's allowed-token mask among the masks passed with the rows
    /// ([`SampleRow::NO_MASK`]: unconstrained).
    pub mask: u32,
}

impl SampleRow {
    /// [`SampleRow::mask`] of an unconstrained row.
    pub const NO_MASK: u32 = u32::MAX;

    /// Whether `p` can be applied without the token history, a bias or a banned list (no
    /// penalty, no logit bias, no top logprobs); `banned` says whether any token must be
    /// suppressed now.
    pub fn fits(p: &SamplingParams, banned: bool) -> bool {
        !p.needs_history() && p.logit_bias.is_empty() && p.top_logprobs == 0 && !banned
    }

    /// The row's settings from `p`, drawing `u` from `rng` when the choice is random.
    pub fn new(row: u32, p: &SamplingParams, rng: &mut Rng) -> Self {
        let u = if is_greedy(p) { 0.0 } else { rng.next_f64() as f32 };
        SampleRow {
            row,
            temperature: p.temperature,
            top_k: p.top_k as u32,
            top_p: p.top_p,
            min_p: p.min_p,
            u,
            mask: Self::NO_MASK,
        }
    }
}

/// Sets the logits of the tokens `mask` disallows to -inf (one bit per token, see
/// [`crate::structured::allows`]). A mask that allows nothing changes nothing: the pick is then
/// unconstrained and the engine rejects it (the CUDA sampler does the same).
fn apply_mask(l: &mut [f32], mask: &[u32]) {
    if !(0..l.len()).any(|i| crate::structured::allows(mask, i as u32)) {
        return;
    }
    for (i, x) in l.iter_mut().enumerate() {
        if !crate::structured::allows(mask, i as u32) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// The reference for every backend's [`crate::backend::Backend::sample`]: the token for `row`'s
/// settings and its logprob under the unmodified distribution.
pub fn pick(logits: &[f32], row: &SampleRow, allowed: Option<&[u32]>) -> (u32, f32) {
    let mut masked = Vec::new();
    let l = match allowed {
        Some(mask) => {
            masked.extend_from_slice(logits);
            apply_mask(&mut masked, mask);
            &masked[..]
        }
        None => logits,
    };
    let token = if row.temperature <= 1e-5 { argmax(l) } else { draw(l, row) };
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + logits.iter().map(|x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
    (token as u32, logits[token] - lse)
}

/// Weights `w = exp((l - max) / T)` in (0, 1], cut at one threshold `tau` (the largest of the
/// top-k, top-p and min-p cuts, ties at the cut all kept), then the token whose cumulative
/// weight in vocabulary order first passes `u * sum(kept)`. The threshold form (rather than a
/// sort) is what the GPU kernel computes with a radix select, so both pick the same token.
fn draw(l: &[f32], r: &SampleRow) -> usize {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f32> = l.iter().map(|&x| if x.is_finite() { ((x - m) / r.temperature).exp() } else { 0.0 }).collect();
    let mut sorted: Vec<f32> = w.iter().copied().filter(|&x| x > 0.0).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut tau = 0.0f32;
    let k = r.top_k as usize;
    if k > 0 && k < sorted.len() {
        tau = sorted[k - 1];
    }
    if r.top_p < 1.0 {
        let kept: f64 = sorted.iter().filter(|&&x| x >= tau).map(|&x| x as f64).sum();
        let target = r.top_p as f64 * kept;
        let mut acc = 0.0;
        for &x in sorted.iter().filter(|&&x| x >= tau) {
            acc += x as f64;
            if acc >= target {
                tau = tau.max(x);
                break;
            }
        }
    }
    if r.min_p > 0.0 {
        tau = tau.max(r.min_p);
    }
    let total: f64 = w.iter().filter(|&&x| x >= tau && x > 0.0).map(|&x| x as f64).sum();
    let target = r.u as f64 * total;
    let mut acc = 0.0;
    let mut last = argmax(l);
    for (i, &x) in w.iter().enumerate() {
        if x >= tau && x > 0.0 {
            acc += x as f64;
            last = i;
            if acc > target {
                return i;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, ..Default::default() }
    }

    #[test]
    fn greedy_picks_argmax_and_reports_the_unmodified_logprob() {
        let l = [1.0, 3.0, 2.0];
        let mut p = params(0.0);
        p.repetition_penalty = 2.0;
        let s = sample(&l, &p, &mut Rng::new(0), History { tokens: &[1], output_counts: None }, &[], None);
        // The penalty halves token 1's logit to 1.5, so token 2 wins; the logprob is the raw one.
        assert_eq!(s.token, 2);
        assert!((s.logprob - log_softmax(&l)[2]).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_tokens_and_filters_hold() {
        let l: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut p = params(1.0);
        p.top_k = 5;
        let draw_all = |seed| {
            (0..200)
                .map(|_| 0)
                .scan(Rng::new(seed), |r, _| Some(sample(&l, &p, r, History::default(), &[], None).token))
                .collect::<Vec<_>>()
        };
        let a = draw_all(7);
        assert_eq!(a, draw_all(7));
        assert_ne!(a, draw_all(8));
        let mut top5: Vec<usize> = (0..50).collect();
        top5.sort_by(|&x, &y| l[y].total_cmp(&l[x]));
        assert!(a.iter().all(|t| top5[..5].contains(&(*t as usize))));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 1);
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let l = [5.0, 4.9, 0.0, -1.0];
        let mut p = params(1.0);
        p.top_p = 0.5;
        let mut rng = Rng::new(3);
        assert!((0..100).all(|_| sample(&l, &p, &mut rng, History::default(), &[], None).token == 0));
        let mut p = params(1.0);
        p.min_p = 0.5;
        assert!((0..200).all(|_| sample(&l, &p, &mut rng, History::default(), &[], None).token < 2));
    }

    #[test]
    fn pick_cuts_at_one_threshold_keeps_ties_and_walks_in_vocabulary_order() {
        let row =
            |temperature, top_k, top_p, min_p, u| SampleRow { row: 0, temperature, top_k, top_p, min_p, u, mask: 0 };
        // Greedy: the first maximal logit, with the raw logprob.
        let (t, lp) = pick(&[1.0, 3.0, 3.0], &row(0.0, 0, 1.0, 0.0, 0.5), None);
        assert_eq!(t, 1);
        assert!((lp - log_softmax(&[1.0, 3.0, 3.0])[1]).abs() < 1e-6);
        // top_k 1 with a tie at the cut keeps both tied tokens; u picks between them in order.
        let l = [2.0, 1.0, 2.0, 0.0];
        assert_eq!(pick(&l, &row(1.0, 1, 1.0, 0.0, 0.2), None).0, 0);
        assert_eq!(pick(&l, &row(1.0, 1, 1.0, 0.0, 0.7), None).0, 2);
        // Without cuts, u = 0 takes the first token in vocabulary order, not the likeliest.
        assert_eq!(pick(&[0.0, 5.0, 0.0], &row(1.0, 0, 1.0, 0.0, 0.0), None).0, 0);
        // top_p: the smallest top set whose mass reaches p (here the single best token).
        assert!((0..10).all(|i| pick(&[0.0, 5.0, 0.0], &row(1.0, 0, 0.9, 0.0, i as f32 / 10.0), None).0 == 1));
        // min_p is relative to the best token's weight.
        let l = [0.0, 1.0f32.ln() + 3.0, 3.0];
        assert!((0..10).all(|i| pick(&l, &row(1.0, 0, 1.0, 0.5, i as f32 / 10.0), None).0 != 0));
        // -inf logits are never drawn.
        assert!(
            (0..10).all(|i| pick(&[f32::NEG_INFINITY, 0.0, 0.0], &row(1.0, 0, 1.0, 0.0, i as f32 / 10.0), None).0 != 0)
        );
        // A mask keeps the pick among its tokens; the logprob stays the raw one.
        let l = [4.0, 1.0, 2.0, 3.0];
        let (t, lp) = pick(&l, &row(0.0, 0, 1.0, 0.0, 0.0), Some(&[0b0110]));
        assert_eq!((t, lp), (2, log_softmax(&l)[2]));
        assert!((0..10).all(|i| [1, 2].contains(&pick(&l, &row(1.0, 0, 1.0, 0.0, i as f32 / 10.0), Some(&[0b0110])).0)));
        assert_eq!(pick(&l, &row(0.0, 0, 1.0, 0.0, 0.0), Some(&[0])).0, 0, "an empty mask is ignored");
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_output_only() {
        // Tokens 0 and 1 start level at 2.0; the prompt holds token 0 three times, the output
        // token 1 twice and token 2 once.
        let l = [2.0, 2.0, 1.5, 0.0];
        let counts = count_output(&[1, 2, 1]);
        let h = History { tokens: &[0, 0, 0, 1, 2, 1], output_counts: Some(&counts) };
        let greedy = |presence, frequency| {
            let p = SamplingParams { presence_penalty: presence, frequency_penalty: frequency, ..params(0.0) };
            sample(&l, &p, &mut Rng::new(0), h, &[], None)
        };
        // Presence 0.4: token 1 -> 1.6, token 2 -> 1.1, token 0 (prompt only) stays 2.0.
        assert_eq!(greedy(0.4, 0.0).token, 0);
        // Frequency 0.3 alone: token 1 -> 1.4, token 2 -> 1.2: token 0 still wins.
        assert_eq!(greedy(0.0, 0.3).token, 0);
        // Negative values encourage repeats: presence -0.1 and frequency -0.2 take token 1 to 2.5.
        let s = greedy(-0.1, -0.2);
        assert_eq!(s.token, 1);
        assert!((s.logprob - log_softmax(&l)[1]).abs() < 1e-6, "the logprob stays the model's");
        // The output alone: with every token in the prompt, nothing changes.
        let p = SamplingParams { presence_penalty: 2.0, frequency_penalty: 2.0, ..params(0.0) };
        let all_prompt = History { tokens: &[0, 1], output_counts: Some(&OutputCounts::new()) };
        assert_eq!(sample(&[1.0, 3.0], &p, &mut Rng::new(0), all_prompt, &[], None).token, 1);
        assert!(p.needs_history() && !SampleRow::fits(&p, false));
    }

    #[test]
    fn logit_bias_adds_before_the_penalties_and_never_reaches_the_logprob() {
        let l = [3.0, 1.0, 0.0];
        let p = SamplingParams { logit_bias: vec![(2, 5.0), (9, 100.0)], ..params(0.0) };
        let s = sample(&l, &p, &mut Rng::new(0), History::default(), &[], None);
        assert_eq!(s.token, 2, "a token id past the logits is skipped");
        assert!((s.logprob - log_softmax(&l)[2]).abs() < 1e-6);
        let p = SamplingParams { logit_bias: vec![(0, -100.0)], ..params(1.0) };
        let mut rng = Rng::new(4);
        assert!((0..100).all(|_| sample(&l, &p, &mut rng, History::default(), &[], None).token != 0));
        // The repetition penalty divides the biased logit: (1 + 3) / 2 = 2 < 3 - 0.5.
        let p = SamplingParams { logit_bias: vec![(1, 3.0), (0, -0.5)], repetition_penalty: 2.0, ..params(0.0) };
        assert_eq!(sample(&l, &p, &mut Rng::new(0), History { tokens: &[1], output_counts: None }, &[], None).token, 0);
        assert!(!SampleRow::fits(&p, false));
    }

    #[test]
    fn banned_tokens_are_never_chosen_and_top_logprobs_sorted() {
        let l = [9.0, 1.0, 2.0];
        let mut p = params(0.0);
        p.top_logprobs = 2;
        let s = sample(&l, &p, &mut Rng::new(1), History::default(), &[0], None);
        assert_eq!(s.token, 2);
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 2]);
    }
}
