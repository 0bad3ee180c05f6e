//! vLLM's ShareGPT dataset from a local file (`--dataset-name sharegpt --dataset-path F.json`):
//! a JSON list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}`.
//! As vLLM samples it: entries with at least two turns, shuffled with the seed; the first turn
//! is the prompt and the second's token count the output length (unless
//! `--sharegpt-output-len`); pairs with fewer than 4 tokens on a side, a prompt over 1024 or
//! both over 2048 tokens are skipped.

use std::path::Path;

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

use crate::client::Prompt;
use crate::dataset::{SampleRequest, Tokenizer};

/// The first two turns of every conversation that has them, in file order.
pub fn load_pairs(path: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let Value::Array(items) = v else { bail!("{}: a ShareGPT file is a JSON list", path.display()) };
    let turn = |c: &Value| c.get("value").and_then(Value::as_str).map(str::to_string);
    let pairs: Vec<(String, String)> = items
        .iter()
        .filter_map(|e| {
            let conv = e.get("conversations")?.as_array()?;
            Some((turn(conv.first()?)?, turn(conv.get(1)?)?))
        })
        .collect();
    if pairs.is_empty() {
        bail!("{}: no conversation with two turns", path.display());
    }
    Ok(pairs)
}

/// `num_prompts` requests from `path`, tokenized with `tok`.
pub async fn requests<T: Tokenizer>(
    tok: &T,
    path: &Path,
    num_prompts: usize,
    fixed_output_len: Option<usize>,
    seed: u64,
) -> Result<Vec<SampleRequest>> {
    let mut pairs = load_pairs(path)?;
    pairs.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut out = Vec::with_capacity(num_prompts);
    for (prompt, completion) in pairs {
        if out.len() == num_prompts {
            break;
        }
        let prompt_len = tok.tokenize(&prompt, true).await?.len();
        let output_len = match fixed_output_len {
            Some(n) => n,
            None => tok.tokenize(&completion, false).await?.len(),
        };
        let too_short = prompt_len < 4 || (fixed_output_len.is_none() && output_len < 4);
        if too_short || prompt_len > 1024 || prompt_len + output_len > 2048 {
            continue;
        }
        out.push(SampleRequest { prompt: Prompt::Text(prompt), prompt_len, output_len });
    }
    if out.len() < num_prompts {
        eprintln!(
            "WARNING: {} holds only {} usable conversations of the {num_prompts} asked for",
            path.display(),
            out.len()
        );
    }
    if out.is_empty() {
        bail!("{}: no usable conversation", path.display());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Words;
    impl Tokenizer for Words {
        async fn tokenize(&self, text: &str, add: bool) -> Result<Vec<u32>> {
            Ok(add.then_some(0).into_iter().chain(text.split_whitespace().map(|_| 1)).collect())
        }
        async fn detokenize(&self, _: &[u32]) -> Result<String> {
            unreachable!()
        }
    }

    #[test]
    fn conversations_become_prompts_with_their_reply_lengths() {
        let dir = std::env::temp_dir().join(format!("cleave-sharegpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sg.json");
        let conv = |h: &str, g: &str| serde_json::json!({"id": "x", "conversations": [{"from": "human", "value": h}, {"from": "gpt", "value": g}]});
        let data = serde_json::json!([
            conv("one two three four five", "a b c d e f"),
            conv("too short", "a b c d e"),
            {"id": "lonely", "conversations": [{"from": "human", "value": "no reply here at all"}]},
            conv("six seven eight nine ten", "g h i j"),
        ]);
        std::fs::write(&file, data.to_string()).unwrap();
        let reqs = futures::executor::block_on(requests(&Words, &file, 5, None, 1)).unwrap();
        let mut lens: Vec<(usize, usize)> = reqs.iter().map(|r| (r.prompt_len, r.output_len)).collect();
        lens.sort();
        assert_eq!(lens, vec![(6, 4), (6, 6)], "BOS + 5 words; the short pair and the lonely turn are skipped");
        let fixed = futures::executor::block_on(requests(&Words, &file, 1, Some(32), 1)).unwrap();
        assert_eq!((fixed.len(), fixed[0].output_len), (1, 32));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
