//! The tokenizer of a generated checkpoint: tiny-r1's byte-level BPE (DeepSeek's special tokens,
//! R1's chat template) grown with synthetic merges, or cut, to exactly the model's vocabulary,
//! so a random-weight model at a real shape serves text over HTTP and `vllm bench serve
//! --tokenizer DIR` loads it with transformers. The merges carry no meaning; every id is a
//! token, text round-trips byte for byte. R1's tool-call tokens (tiny-r1's added tokens after its
//! BPE vocabulary) take the last ids.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{ensure, Context};
use serde_json::Value;

const TOKENIZER: &str = include_str!("../models/tiny-r1/tokenizer.json");
const TOKENIZER_CONFIG: &str = include_str!("../models/tiny-r1/tokenizer_config.json");

/// Writes `tokenizer.json` and `tokenizer_config.json` with `vocab_size` tokens into `dir`.
pub fn write(dir: &Path, vocab_size: usize, max_len: usize) -> anyhow::Result<()> {
    let mut tok: Value = serde_json::from_str(TOKENIZER)?;
    let model = tok.get_mut("model").context("tiny-r1's tokenizer.json has no model")?;
    let vocab: HashMap<String, u64> = serde_json::from_value(model["vocab"].take())?;
    let merges: Vec<(String, String)> = serde_json::from_value(model["merges"].take())?;
    let bpe_size = vocab.len() as u64;
    // Added tokens past the BPE vocabulary (the tool-call tokens) move to the end.
    let added = tok["added_tokens"].as_array_mut().context("tiny-r1's tokenizer.json has no added_tokens")?;
    let tail: Vec<&mut Value> =
        added.iter_mut().filter(|t| t["id"].as_u64().is_some_and(|id| id >= bpe_size)).collect();
    ensure!(vocab_size > tail.len() + 256, "a vocabulary of {vocab_size} is too small");
    let base = vocab_size - tail.len();
    for (i, t) in tail.into_iter().enumerate() {
        t["id"] = (base + i).into();
    }
    let (vocab, merges) = resize(vocab, merges, base)?;
    let model = tok.get_mut("model").context("tiny-r1's tokenizer.json has no model")?;
    model["vocab"] = serde_json::to_value(vocab)?;
    model["merges"] = serde_json::to_value(merges)?;
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tok)?)?;
    let mut cfg: Value = serde_json::from_str(TOKENIZER_CONFIG)?;
    cfg["model_max_length"] = max_len.into();
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&cfg)?)?;
    Ok(())
}

/// BPE merges, in rank order.
type Merges = Vec<(String, String)>;

/// The vocabulary with ids `0..n`: tiny-r1's entries below `n`, then merges of two existing
/// tokens into new ones until `n` are there.
fn resize(
    mut vocab: HashMap<String, u64>,
    mut merges: Merges,
    n: usize,
) -> anyhow::Result<(HashMap<String, u64>, Merges)> {
    vocab.retain(|_, id| (*id as usize) < n);
    merges.retain(|(a, b)| vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")));
    let mut by_id: Vec<(u64, String)> = vocab.iter().map(|(t, &i)| (i, t.clone())).collect();
    by_id.sort();
    ensure!(by_id.iter().enumerate().all(|(i, (id, _))| i as u64 == *id), "tiny-r1's vocabulary has gaps");
    // Parts: the byte-level alphabet and tiny-r1's merged tokens, never the special tokens.
    let parts: Vec<String> = by_id.iter().map(|(_, t)| t.clone()).filter(|t| !t.starts_with('<')).collect();
    let mut next = by_id.len();
    'grow: for a in &parts {
        for b in &parts {
            if next >= n {
                break 'grow;
            }
            let t = format!("{a}{b}");
            if let std::collections::hash_map::Entry::Vacant(e) = vocab.entry(t) {
                e.insert(next as u64);
                merges.push((a.clone(), b.clone()));
                next += 1;
            }
        }
    }
    ensure!(next == n, "cannot make {n} distinct tokens from {} parts", parts.len());
    Ok((vocab, merges))
}

#[cfg(test)]
mod tests {
    use cleave_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};

    use super::*;

    #[test]
    fn the_tokenizer_covers_the_vocabulary_and_round_trips_text() {
        for n in [400, 4096, 129_280] {
            let dir = std::env::temp_dir().join(format!("cleave-gentok-{n}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            write(&dir, n, 4096).unwrap();
            let t = Tokenizer::from_dir(&dir).unwrap();
            assert_eq!(t.vocab_size(), n);
            assert!(t.id_to_token(n as u32 - 1).is_some() && t.id_to_token(n as u32).is_none());
            let text = "What is 347 + 589? Ünïcödé, tabs\tand\nnewlines.";
            assert_eq!(t.decode(&t.encode(text, false).unwrap(), false).unwrap(), text);
            let ids: Vec<u32> = (0..n as u32).step_by(n / 97).filter(|&i| i > 5).collect();
            let again = t.encode(&t.decode(&ids, false).unwrap(), false).unwrap();
            assert_eq!(t.decode(&again, false).unwrap(), t.decode(&ids, false).unwrap());
            assert_eq!(t.token_to_id("<｜tool▁calls▁begin｜>"), Some(n as u32 - 9), "the tool tokens come last");
            assert!(t.is_special(n as u32 - 1));
            let hi = ChatMessage::new("user", "hi");
            let chat = t.apply_chat_template(&[hi], ChatOptions::generation()).unwrap();
            assert!(chat.contains("<｜User｜>hi<｜Assistant｜>"), "{chat}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
