//! The model's vocabulary as llguidance sees it: the bytes of every token id, special tokens
//! marked with a leading 0xFF, and tokenization of bytes through the model's own tokenizer.

use std::collections::HashMap;

use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// GPT-2's byte-level alphabet: the character each byte is stored as in a byte-level BPE vocab.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = HashMap::new();
    let mut extra = 0;
    for b in 0..=255u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        map.insert(char::from_u32(c).expect("valid code point"), b as u8);
    }
    map
}

/// The bytes of token `id`: its vocabulary entry read through the byte-level alphabet, or, for
/// a tokenizer that is not byte-level, its decoded text.
fn token_bytes(tok: &Tokenizer, id: u32, chars: &HashMap<char, u8>) -> Vec<u8> {
    let Some(entry) = tok.id_to_token(id) else { return Vec::new() };
    if tok.is_special(id) {
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(entry.as_bytes());
        return b;
    }
    match entry.chars().map(|c| chars.get(&c).copied()).collect::<Option<Vec<u8>>>() {
        Some(bytes) => bytes,
        None => tok.decode(&[id], false).map(String::into_bytes).unwrap_or_default(),
    }
}

/// A [`TokenizerEnv`] over the model's tokenizer, `vocab` ids wide (the model's logits rows;
/// ids past the tokenizer's are padding that no grammar allows).
pub(super) struct Vocab {
    trie: TokTrie,
    tok: std::sync::Arc<Tokenizer>,
}

impl Vocab {
    pub fn new(tok: std::sync::Arc<Tokenizer>, vocab: usize, eos: u32) -> Self {
        let chars = byte_level_chars();
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let b = token_bytes(&tok, id, &chars);
                if b.is_empty() {
                    let mut pad = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    pad.extend_from_slice(format!("<[pad {id}]>").as_bytes());
                    pad
                } else {
                    b
                }
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, eos);
        Vocab { trie: TokTrie::from(&info, &words), tok }
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode(&String::from_utf8_lossy(s), false).unwrap_or_else(|_| self.trie.greedy_tokenize(s))
    }
}
