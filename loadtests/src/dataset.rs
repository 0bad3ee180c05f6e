//! Benchmark prompts: the random dataset built with the server's own tokenizer, and JSONL files.
//!
//! Random prompts follow vLLM's `RandomDataset`: lengths drawn uniformly from
//! `[floor(len*(1-r)), ceil(len*(1+r))]` (output at least 1), the tokenizer's special tokens
//! (what `/tokenize` adds to an empty prompt, e.g. BOS) subtracted from the input length, random
//! token ids decoded to text, then re-encoded and cut or topped up until the text is exactly the
//! target number of tokens (at most 10 rounds, as vLLM's `gen_prompt_decode_to_target_len`).
//! Token ids are drawn from a pool of ordinary (non-special) ids: by default every id the server's
//! tokenizer produces for a built-in mixed-language corpus, or an explicit id range.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;

use crate::client::{ApiClient, Prompt};

/// One prompt of a benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    /// What to send.
    pub prompt: Prompt,
    /// Prompt tokens as counted here (0 when unknown; the usage chunk has the final word).
    pub prompt_len: usize,
    /// Tokens to ask for.
    pub output_len: usize,
}

/// Tokenization, as the server does it. Implemented over HTTP by [`ServerTokenizer`].
#[allow(async_fn_in_trait)]
pub trait Tokenizer {
    /// Text to ids.
    async fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>>;
    /// Ids to text.
    async fn detokenize(&self, ids: &[u32]) -> Result<String>;
}

/// The server's tokenizer through `POST /tokenize` and `POST /detokenize`.
pub struct ServerTokenizer<'a> {
    /// The server.
    pub client: &'a ApiClient,
    /// The model whose tokenizer to use.
    pub model: String,
}

impl Tokenizer for ServerTokenizer<'_> {
    async fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.client.tokenize(&self.model, text, add_special_tokens).await
    }
    async fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.client.detokenize(&self.model, ids).await
    }
}

/// A local Hugging Face `tokenizer.json` (`--tokenizer`), decoding as transformers does by
/// default (special tokens kept).
pub struct LocalTokenizer(tokenizers::Tokenizer);

impl LocalTokenizer {
    /// Loads `path`, a `tokenizer.json` or a directory that holds one.
    pub fn load(path: &Path) -> Result<Self> {
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        let t = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", file.display()))?;
        Ok(LocalTokenizer(t))
    }
}

impl Tokenizer for LocalTokenizer {
    async fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.0.encode(text, add_special_tokens).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }
    async fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.0.decode(ids, false).map_err(|e| anyhow::anyhow!("detokenizing: {e}"))
    }
}

/// The tokenizer prompts are built with: the server's, or a local one.
// One per benchmark: boxing the local tokenizer would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum PromptTokenizer<'a> {
    /// `/tokenize` and `/detokenize`.
    Server(ServerTokenizer<'a>),
    /// `--tokenizer`.
    Local(LocalTokenizer),
}

impl Tokenizer for PromptTokenizer<'_> {
    async fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match self {
            PromptTokenizer::Server(t) => t.tokenize(text, add_special_tokens).await,
            PromptTokenizer::Local(t) => t.tokenize(text, add_special_tokens).await,
        }
    }
    async fn detokenize(&self, ids: &[u32]) -> Result<String> {
        match self {
            PromptTokenizer::Server(t) => t.detokenize(ids).await,
            PromptTokenizer::Local(t) => t.detokenize(ids).await,
        }
    }
}

/// Inclusive sampling bounds for a length: `[floor(len*(1-r)), ceil(len*(1+r))]`, the low end
/// at least `min`. `r` must be in `[0, 1)`.
pub fn length_bounds(len: usize, ratio: f64, min: usize) -> Result<(usize, usize)> {
    if !(0.0..1.0).contains(&ratio) {
        bail!("--random-range-ratio must be in [0, 1), got {ratio}");
    }
    let lo = ((len as f64 * (1.0 - ratio)).floor() as usize).max(min);
    let hi = ((len as f64 * (1.0 + ratio)).ceil() as usize).max(min);
    Ok((lo, hi))
}

/// Settings of the random dataset.
#[derive(Debug, Clone)]
pub struct RandomSpec {
    /// Mean prompt length in tokens, special tokens included (after the prefix).
    pub input_len: usize,
    /// Tokens of a random prefix every prompt starts with (vLLM's `--random-prefix-len`).
    pub prefix_len: usize,
    /// Mean output length in tokens.
    pub output_len: usize,
    /// Spread of both lengths.
    pub range_ratio: f64,
    /// How many prompts.
    pub num_prompts: usize,
    /// Draw ids from `[lo, hi)` instead of the corpus pool.
    pub token_id_range: Option<(u32, u32)>,
    /// Send token ids (completions only) instead of text.
    pub as_token_ids: bool,
    /// Seed of all randomness.
    pub seed: u64,
}

/// Words, numbers, code and punctuation, ASCII only: every token of a byte-level BPE is then
/// valid UTF-8 on its own, so random sequences of them decode to clean text that re-encodes to
/// about the same length (partial multi-byte tokens would decode to U+FFFD and grow).
const CORPUS_WORDS: &str = "the of and to in is was that for on with as by at from his her which \
or an be this are not have had one were all their there been has more when will would who so no \
time people year way day man thing woman life child world school state family student group \
country problem hand part place case week company system program question work government number \
night point home water room mother area money story fact month lot right study book eye job word \
business issue side kind head house service friend father power hour game line end member law car \
city community name president team minute idea kid body information back parent face others level \
office door health person art war history party result change morning reason research girl guy \
moment air teacher force education think prefill decode latency throughput token cache matrix \
vector kernel tensor expert router attention benchmark server request stream chunk quickly \
brown fox jumps over lazy dog Alpha Beta Gamma Delta NASA HTTP JSON Rust Python Linux GPU CPU \
0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2025 3.14 -7 1e-6 0x1F x+y=z f(x) {a:1} [1,2] <p> \
#include fn main() let mut i = 0; for i in range(10): print(i) return None; SELECT * FROM t \
WHERE id=1 Hello, world! What? Yes. No... (maybe) \"quoted\" 'single' a/b c\\d e_f g-h #tag \
@user $5 %20 ~home ^up &amp; |pipe| `code` ==> <= != ** // /* */ :: -> => ; ,";

/// The id pool: `[lo, hi)` when given, else every distinct id the tokenizer produces for the
/// built-in corpus (ordinary text only, so never a special token).
pub async fn token_pool<T: Tokenizer>(tok: &T, range: Option<(u32, u32)>, seed: u64) -> Result<Vec<u32>> {
    if let Some((lo, hi)) = range {
        if lo >= hi {
            bail!("--token-id-range {lo}:{hi} is empty");
        }
        return Ok((lo..hi).collect());
    }
    let words: Vec<&str> = CORPUS_WORDS.split_whitespace().collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_c0de);
    let mut text = CORPUS_WORDS.to_string();
    for i in 0..4000 {
        text.push(if i % 17 == 0 { '\n' } else { ' ' });
        text.push_str(words[rng.random_range(0..words.len())]);
    }
    let ids: BTreeSet<u32> =
        tok.tokenize(&text, false).await.context("building the token pool with /tokenize")?.into_iter().collect();
    if ids.is_empty() {
        bail!("the server's /tokenize returned no tokens for the corpus");
    }
    Ok(ids.into_iter().collect())
}

/// Decodes `ids`, re-encodes the text, and cuts or tops up (from `pool`) until the text is
/// `target` tokens, for at most `max_rounds` rounds. Returns the text and its final token ids.
pub async fn fit_to_length<T: Tokenizer>(
    tok: &T,
    mut ids: Vec<u32>,
    target: usize,
    pool: &[u32],
    rng: &mut StdRng,
    max_rounds: usize,
) -> Result<(String, Vec<u32>)> {
    let mut rounds_left = max_rounds;
    loop {
        let text = tok.detokenize(&ids).await?;
        ids = tok.tokenize(&text, false).await?;
        if rounds_left == 0 || ids.len() == target {
            return Ok((text, ids));
        }
        if ids.len() < target {
            let extra = target - ids.len();
            ids.extend((0..extra).map(|_| pool[rng.random_range(0..pool.len())]));
        } else {
            ids.truncate(target);
        }
        rounds_left -= 1;
    }
}

/// Builds the random dataset against the server's tokenizer.
pub async fn random_requests<T: Tokenizer>(tok: &T, spec: &RandomSpec) -> Result<Vec<SampleRequest>> {
    let special = tok.tokenize("", true).await.context("asking /tokenize for the special tokens")?;
    let content_len = spec.input_len.saturating_sub(special.len());
    let (in_lo, in_hi) = length_bounds(content_len, spec.range_ratio, 0)?;
    let (out_lo, out_hi) = length_bounds(spec.output_len, spec.range_ratio, 1)?;
    if in_lo < 1 {
        bail!(
            "--random-input-len {} leaves no room for prompt text after {} special token(s)",
            spec.input_len,
            special.len()
        );
    }
    let pool = token_pool(tok, spec.token_id_range, spec.seed).await?;
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let prefix: Vec<u32> = (0..spec.prefix_len).map(|_| pool[rng.random_range(0..pool.len())]).collect();
    let plans: Vec<(usize, usize, u64)> = (0..spec.num_prompts)
        .map(|_| (rng.random_range(in_lo..=in_hi), rng.random_range(out_lo..=out_hi), rng.random::<u64>()))
        .collect();
    let (pool, special, prefix) = (&pool, &special, &prefix);
    let results: Vec<Result<(SampleRequest, i64)>> = futures::stream::iter(plans)
        .map(|(input_len, output_len, seed)| async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let own = (0..input_len).map(|_| pool[rng.random_range(0..pool.len())]);
            let ids: Vec<u32> = prefix.iter().copied().chain(own).collect();
            let target = prefix.len() + input_len;
            let (text, ids) = fit_to_length(tok, ids, target, pool, &mut rng, 10).await?;
            let mismatch = ids.len() as i64 - target as i64;
            let prompt_len = ids.len() + special.len();
            let prompt = if spec.as_token_ids {
                Prompt::Tokens(special.iter().copied().chain(ids).collect())
            } else {
                Prompt::Text(text)
            };
            Ok((SampleRequest { prompt, prompt_len, output_len }, mismatch))
        })
        .buffered(16)
        .collect()
        .await;
    let (requests, mismatches): (Vec<SampleRequest>, Vec<i64>) =
        results.into_iter().collect::<Result<Vec<_>>>()?.into_iter().unzip();
    let off: i64 = mismatches.iter().sum();
    if off != 0 {
        eprintln!("WARNING: {off:+} prompt tokens across all prompts after 10 rounds of decode/re-encode");
    }
    Ok(requests)
}

/// vLLM's prefix_repetition dataset: `num_prefixes` random prefixes of `spec.prefix_len` tokens,
/// each followed by random suffixes of `spec.input_len` tokens in `spec.num_prompts /
/// num_prefixes` prompts, shuffled with the seed.
pub async fn prefix_repetition_requests<T: Tokenizer>(
    tok: &T,
    spec: &RandomSpec,
    num_prefixes: usize,
) -> Result<Vec<SampleRequest>> {
    if num_prefixes == 0 || spec.num_prompts < num_prefixes {
        bail!(
            "--num-prompts {} must be at least --prefix-repetition-num-prefixes {num_prefixes} (and that at least 1)",
            spec.num_prompts
        );
    }
    let per_prefix = spec.num_prompts / num_prefixes;
    let mut out = Vec::with_capacity(per_prefix * num_prefixes);
    for i in 0..num_prefixes as u64 {
        let one = RandomSpec { num_prompts: per_prefix, seed: spec.seed.wrapping_add(i * 0x9e37_79b9), ..spec.clone() };
        out.extend(random_requests(tok, &one).await?);
    }
    use rand::seq::SliceRandom;
    out.shuffle(&mut StdRng::seed_from_u64(spec.seed));
    Ok(out)
}

/// Reads a JSONL dataset: one `{"prompt": text}` or `{"messages": [...]}` per line, with an
/// optional `"output_len"` (default `default_output_len`). Blank lines are skipped.
pub fn load_jsonl(path: &Path, default_output_len: usize) -> Result<Vec<SampleRequest>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let prompt = match (v.get("prompt"), v.get("messages")) {
            (Some(Value::String(s)), _) => Prompt::Text(s.clone()),
            (Some(Value::Array(ids)), _) if ids.iter().all(Value::is_u64) => {
                Prompt::Tokens(ids.iter().filter_map(Value::as_u64).map(|x| x as u32).collect())
            }
            (_, Some(Value::Array(m))) => Prompt::Messages(m.clone()),
            _ => bail!("{}:{}: needs \"prompt\" (text or token ids) or \"messages\" (a list)", path.display(), i + 1),
        };
        let output_len = match v.get("output_len") {
            None | Some(Value::Null) => default_output_len,
            Some(n) => {
                n.as_u64().with_context(|| format!("{}:{}: output_len is not a count", path.display(), i + 1))? as usize
            }
        };
        let prompt_len = if let Prompt::Tokens(t) = &prompt { t.len() } else { 0 };
        out.push(SampleRequest { prompt, prompt_len, output_len });
    }
    if out.is_empty() {
        bail!("{} holds no prompts", path.display());
    }
    Ok(out)
}

/// Fills in `prompt_len` of text prompts with the server's count (best effort: unknown stays 0).
pub async fn count_prompt_tokens<T: Tokenizer>(tok: &T, requests: &mut [SampleRequest]) {
    for r in requests.iter_mut() {
        if let Prompt::Text(t) = &r.prompt {
            if let Ok(ids) = tok.tokenize(t, true).await {
                r.prompt_len = ids.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words `w0`..`w99` are ids 0..99 and id 0 is BOS; id 7 decodes to "w8 w9", two tokens
    /// when re-encoded, so prompts that contain it grow and must be cut.
    struct WordTokenizer;

    impl Tokenizer for WordTokenizer {
        async fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
            let mut ids: Vec<u32> = if add_special_tokens { vec![0] } else { vec![] };
            for w in text.split_whitespace() {
                ids.push(w.strip_prefix('w').and_then(|n| n.parse().ok()).context("unknown word")?);
            }
            Ok(ids)
        }
        async fn detokenize(&self, ids: &[u32]) -> Result<String> {
            Ok(ids
                .iter()
                .map(|&i| if i == 7 { "w8 w9".to_string() } else { format!("w{i}") })
                .collect::<Vec<_>>()
                .join(" "))
        }
    }

    #[test]
    fn bounds_follow_vllm() {
        assert_eq!(length_bounds(100, 0.0, 1).unwrap(), (100, 100));
        assert_eq!(length_bounds(100, 0.25, 1).unwrap(), (75, 125));
        assert_eq!(length_bounds(10, 0.33, 1).unwrap(), (6, 14)); // floor(6.7), ceil(13.3)
        assert_eq!(length_bounds(1, 0.9, 1).unwrap(), (1, 2));
        assert!(length_bounds(10, 1.0, 1).is_err());
        assert!(length_bounds(10, -0.1, 1).is_err());
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn fit_to_length_cuts_and_tops_up_to_the_exact_count() {
        block_on(async {
            let pool: Vec<u32> = (10..20).collect();
            let mut rng = StdRng::seed_from_u64(1);
            // Two 7s expand to four tokens: 6 ids re-encode to 8, cut back to 6.
            let (text, ids) =
                fit_to_length(&WordTokenizer, vec![7, 7, 1, 2, 3, 4], 6, &pool, &mut rng, 10).await.unwrap();
            assert_eq!(ids.len(), 6);
            assert_eq!(WordTokenizer.tokenize(&text, false).await.unwrap(), ids);
            // Too short: topped up from the pool.
            let (text, ids) = fit_to_length(&WordTokenizer, vec![1, 2], 5, &pool, &mut rng, 10).await.unwrap();
            assert_eq!(ids.len(), 5);
            assert!(ids[2..].iter().all(|i| pool.contains(i)));
            assert_eq!(WordTokenizer.tokenize(&text, false).await.unwrap().len(), 5);
        });
    }

    #[test]
    fn prefix_repetition_shares_each_prefix_among_an_equal_share_of_prompts() {
        block_on(async {
            let spec = RandomSpec {
                input_len: 3,
                prefix_len: 4,
                output_len: 5,
                range_ratio: 0.0,
                num_prompts: 6,
                token_id_range: Some((10, 60)),
                as_token_ids: false,
                seed: 3,
            };
            let reqs = prefix_repetition_requests(&WordTokenizer, &spec, 2).await.unwrap();
            assert_eq!(reqs.len(), 6);
            let mut prefixes = std::collections::BTreeMap::new();
            for r in &reqs {
                let Prompt::Text(t) = &r.prompt else { panic!("text prompts") };
                let words: Vec<&str> = t.split_whitespace().collect();
                assert_eq!((words.len(), r.output_len), (6, 5), "suffix less the BOS the server adds");
                *prefixes.entry(words[..4].join(" ")).or_insert(0) += 1;
            }
            assert_eq!(prefixes.values().copied().collect::<Vec<_>>(), vec![3, 3], "{prefixes:?}");
            assert!(prefix_repetition_requests(&WordTokenizer, &spec, 7).await.is_err());
        });
    }

    #[test]
    fn random_requests_have_exact_lengths_in_range_and_are_seeded() {
        block_on(async {
            let spec = RandomSpec {
                input_len: 41,
                prefix_len: 0,
                output_len: 20,
                range_ratio: 0.5,
                num_prompts: 50,
                token_id_range: Some((1, 100)),
                as_token_ids: false,
                seed: 7,
            };
            let reqs = random_requests(&WordTokenizer, &spec).await.unwrap();
            assert_eq!(reqs.len(), 50);
            for r in &reqs {
                let Prompt::Text(t) = &r.prompt else { panic!() };
                // The server's count of the text (with BOS) is the recorded prompt_len.
                assert_eq!(WordTokenizer.tokenize(t, true).await.unwrap().len(), r.prompt_len);
                assert!((21..=61).contains(&r.prompt_len), "{}", r.prompt_len); // 1 + [20, 60]
                assert!((10..=30).contains(&r.output_len));
            }
            let distinct: BTreeSet<usize> = reqs.iter().map(|r| r.prompt_len).collect();
            assert!(distinct.len() > 5, "lengths are spread");
            assert_eq!(reqs, random_requests(&WordTokenizer, &spec).await.unwrap(), "same seed, same prompts");
            let ids = random_requests(&WordTokenizer, &RandomSpec { as_token_ids: true, range_ratio: 0.0, ..spec })
                .await
                .unwrap();
            for r in ids {
                let Prompt::Tokens(t) = &r.prompt else { panic!() };
                assert_eq!((t.len(), t[0], r.prompt_len), (41, 0, 41), "BOS first, exact length");
            }
            // A shared prefix: every prompt starts with the same 12 tokens, then its own 40.
            let spec = RandomSpec { as_token_ids: true, range_ratio: 0.0, prefix_len: 12, ..spec };
            let reqs = random_requests(&WordTokenizer, &spec).await.unwrap();
            let toks: Vec<&Vec<u32>> = reqs
                .iter()
                .map(|r| match &r.prompt {
                    Prompt::Tokens(t) => t,
                    _ => panic!("token prompts expected"),
                })
                .collect();
            assert!(toks.iter().all(|t| t.len() == 53 && t[..13] == toks[0][..13]), "BOS + prefix + 40");
            assert!(toks.iter().any(|t| t[13..] != toks[0][13..]), "own parts differ");
        });
    }

    #[test]
    fn corpus_pool_has_no_special_tokens() {
        block_on(async {
            struct CharTok;
            impl Tokenizer for CharTok {
                async fn tokenize(&self, text: &str, add: bool) -> Result<Vec<u32>> {
                    Ok(add.then_some(0).into_iter().chain(text.chars().map(|c| c as u32 + 10)).collect())
                }
                async fn detokenize(&self, _: &[u32]) -> Result<String> {
                    unreachable!()
                }
            }
            let pool = token_pool(&CharTok, None, 0).await.unwrap();
            assert!(pool.len() > 50 && !pool.contains(&0));
            assert!(pool.windows(2).all(|w| w[0] < w[1]));
        });
    }

    #[test]
    fn jsonl_rows() {
        let dir = std::env::temp_dir().join(format!("cleave-bench-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.jsonl");
        std::fs::write(
            &p,
            "{\"prompt\": \"hi\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}], \"output_len\": 5}\n{\"prompt\": [1, 2, 3]}\n",
        )
        .unwrap();
        let r = load_jsonl(&p, 9).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].prompt.clone(), r[0].output_len), (Prompt::Text("hi".into()), 9));
        assert!(matches!(&r[1].prompt, Prompt::Messages(m) if m.len() == 1));
        assert_eq!(r[1].output_len, 5);
        assert_eq!((r[2].prompt.clone(), r[2].prompt_len), (Prompt::Tokens(vec![1, 2, 3]), 3));
        std::fs::write(&p, "{\"text\": 1}\n").unwrap();
        assert!(load_jsonl(&p, 9).is_err());
    }
}
