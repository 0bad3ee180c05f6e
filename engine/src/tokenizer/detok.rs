//! Incremental detokenization with prefix/read offsets (as vLLM and TGI do it).

use super::Tokenizer;
use crate::error::Result;

/// How many prompt ids [`IncrementalDecoder::with_prompt`] keeps as left context.
const PROMPT_CONTEXT: usize = 5;

/// Incremental detokenization in the manner of vLLM/TGI (prefix_offset / read_offset): each `push`
/// returns the newly completed text, and never emits half a UTF-8 character (text ending in U+FFFD
/// is held back until the next token completes it). `finish` returns whatever is held back.
///
/// Each step decodes only the ids from `prefix_offset` on: `decode(ids[prefix..read])` is the
/// text already emitted for that window and `decode(ids[prefix..])` the same plus the new part.
/// Decoding a window that starts a few tokens back keeps context-dependent decoders (leading
/// spaces) consistent with decoding the whole sequence. Ids before the window are dropped, so
/// memory and work per token stay constant.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    text: String,
}

impl IncrementalDecoder {
    /// A decoder with no left context.
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens,
            text: String::new(),
        }
    }

    /// Optionally seeded with prompt ids so the first output token decodes with its left context
    /// (byte-level BPE leading-space handling): `with_prompt(prompt_tail_ids, skip)`; use at most the last ~5 prompt ids.
    ///
    /// Only the last 5 of `prompt_ids` are kept, so passing the whole prompt is fine too. The
    /// prompt's text is never emitted.
    pub fn with_prompt(prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDecoder {
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
            skip_special_tokens,
            text: String::new(),
        }
    }

    /// Adds one generated id and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        if new_text.len() <= prefix_text.len() || new_text.ends_with('\u{FFFD}') {
            // Nothing new (e.g. a skipped special token), or an incomplete UTF-8 character:
            // keep the offsets so the next token is decoded together with this one.
            return Ok(String::new());
        }
        let delta = suffix_after(&new_text, &prefix_text).to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        self.text.push_str(&delta);
        Ok(delta)
    }

    /// Returns the text held back so far (an incomplete character comes out as U+FFFD, as a
    /// full decode would give it). Later pushes continue after it.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let skip = self.skip_special_tokens;
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        let delta = if new_text.len() > prefix_text.len() {
            suffix_after(&new_text, &prefix_text).to_string()
        } else {
            String::new()
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        self.text.push_str(&delta);
        Ok(delta)
    }

    /// Everything emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Drops ids before the prefix window; they are never decoded again.
    fn compact(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `new` after `old`. Normally `old` is a prefix of `new`; if the decoder rewrote
/// earlier text, the part after the longest common prefix is returned.
fn suffix_after<'a>(new: &'a str, old: &str) -> &'a str {
    if let Some(rest) = new.strip_prefix(old) {
        return rest;
    }
    let common = new
        .char_indices()
        .zip(old.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(old.len().min(new.len()));
    // `common` is a char boundary of `new`: either a mismatch index or, when `old` is a
    // (char-wise) prefix, its byte length, which then ends on a boundary of `new` too.
    new.get(common..).unwrap_or_default()
}
