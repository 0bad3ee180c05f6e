//! Tokenizer, chat template and incremental detokenization.
//!
//! [`Tokenizer`] wraps a Hugging Face `tokenizer.json` (through the `tokenizers` crate) together
//! with the chat template and the BOS/EOS strings of `tokenizer_config.json`. Chat templates are
//! rendered with minijinja configured like transformers' Jinja environment (`trim_blocks`,
//! `lstrip_blocks`, loop controls, Python string methods, `raise_exception`, a `tojson` that
//! writes like Python's `json.dumps`). [`IncrementalDecoder`] turns a stream of generated ids
//! into text deltas without ever splitting a UTF-8 character.

mod chat;
mod detok;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

pub use chat::{ChatMessage, ChatOptions, ToolCall};
pub use detok::IncrementalDecoder;

/// The token that closes the reasoning section of DeepSeek-R1 outputs.
const THINK_END: &str = "</think>";

/// A loaded tokenizer with its chat template. Cheap to share between threads through an `Arc`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special_ids: HashSet<u32>,
    vocab_size: usize,
    bos: Option<String>,
    eos: Option<String>,
    think_end: Option<u32>,
    template: Option<chat::ChatTemplate>,
}

// The tokenizer is shared between request handlers and the engine loop.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<IncrementalDecoder>();
};

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("special_tokens", &self.special_ids.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("think_end_id", &self.think_end)
            .field("has_chat_template", &self.template.is_some())
            .finish()
    }
}

/// What `tokenizer_config.json` (and its `chat_template.*` siblings) contribute.
#[derive(Default)]
struct TokenizerConfig {
    chat_template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
}

impl Tokenizer {
    /// The tokenizer in `dir` when it has a `tokenizer.json`.
    pub fn from_dir_if_present(dir: &Path) -> Result<Option<std::sync::Arc<Self>>> {
        if !dir.join("tokenizer.json").exists() {
            return Ok(None);
        }
        Ok(Some(std::sync::Arc::new(Self::from_dir(dir)?)))
    }

    /// Loads `<dir>/tokenizer.json` and, when present, `<dir>/tokenizer_config.json`
    /// (chat_template as a string, or a list of {name, template} where "default" wins;
    ///  bos_token/eos_token as a string or an AddedToken object {"content": ...}).
    ///
    /// When `tokenizer_config.json` has no `chat_template`, `<dir>/chat_template.jinja` or
    /// `<dir>/chat_template.json` (the layouts newer transformers save) are used if present.
    /// A chat template that does not compile is an error naming the file it came from.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&path).map_err(|e| EngineError::io(&path, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| EngineError::checkpoint(&path, format!("cannot parse tokenizer: {e}")))?;
        drop(bytes);

        let (config, template_path) = read_config(dir)?;
        let template = match config.chat_template {
            Some(source) => Some(
                chat::ChatTemplate::new(source)
                    .map_err(|e| EngineError::checkpoint(&template_path, format!("invalid chat_template: {e}")))?,
            ),
            None => None,
        };

        let special_ids =
            inner.get_added_tokens_decoder().iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
        let vocab_size = inner.get_vocab_size(true);
        let think_end = inner.token_to_id(THINK_END);
        Ok(Tokenizer { inner, special_ids, vocab_size, bos: config.bos, eos: config.eos, think_end, template })
    }

    /// Tokenizes `text`; with `add_special_tokens` the tokenizer's post-processor adds its
    /// special tokens (BOS for DeepSeek). Special-token strings inside `text` become their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Tokenizer(format!("cannot encode text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Turns ids back into text, dropping special tokens when `skip_special_tokens` is set.
    /// Ids outside the vocabulary are ignored (as Hugging Face tokenizers do).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// The id of one vocabulary entry (in its stored form, e.g. `Ġhello` for byte-level BPE),
    /// or of an added token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of `id` in its stored form, if the id exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of distinct tokens, including added tokens (Python's `len(tokenizer)`).
    /// The model's embedding table may be larger (padding rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether `id` is an added token marked special (BOS, EOS, role markers...).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The BOS string from `tokenizer_config.json`, if it names one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    /// The EOS string from `tokenizer_config.json`, if it names one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    /// Id of `</think>` when the vocabulary has it as a single token (the reasoning split uses it).
    pub fn think_end_id(&self) -> Option<u32> {
        self.think_end
    }

    /// Whether a chat template was found when loading.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders the chat template with minijinja (pycompat methods enabled so `.split`, `.startswith`,
    /// `.strip` etc. work like Python) given `messages`, `bos_token`, `eos_token` and the options:
    /// `add_generation_prompt`, `tools` (omitted when there are none, as transformers does) and
    /// extra template kwargs (`chat_template_kwargs` of the OpenAI request, a JSON object, merged
    /// into the context). A missing template is an error that says so. Template errors name the
    /// problem (minijinja's message + line). Templates may call `raise_exception(msg)` (as in HF),
    /// which becomes an error.
    ///
    /// Kwargs may override `bos_token`/`eos_token` but not `messages`, `tools` or
    /// `add_generation_prompt`. Kwargs that are neither an object nor null are an
    /// [`EngineError::InvalidRequest`].
    pub fn apply_chat_template(&self, messages: &[ChatMessage], opts: ChatOptions<'_>) -> Result<String> {
        let template = self.template.as_ref().ok_or_else(|| {
            EngineError::Tokenizer(
                "this model has no chat template (tokenizer_config.json has no chat_template)".to_string(),
            )
        })?;
        template.render(messages, opts, self.bos.as_deref(), self.eos.as_deref())
    }

    /// Renders the template and tokenizes WITHOUT adding special tokens (the rendered text already holds BOS).
    pub fn encode_chat(&self, messages: &[ChatMessage], opts: ChatOptions<'_>) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, opts)?;
        self.encode(&text, false)
    }

    /// Replaces the checkpoint's chat template (vLLM's `--chat-template`); `origin` names it in
    /// errors.
    pub fn set_chat_template(&mut self, source: String, origin: &str) -> Result<()> {
        let template = chat::ChatTemplate::new(source)
            .map_err(|e| EngineError::Tokenizer(format!("invalid chat template {origin}: {e}")))?;
        self.template = Some(template);
        Ok(())
    }
}

/// Reads `tokenizer_config.json` if present; returns what it holds and the path the chat
/// template came from (for error messages).
fn read_config(dir: &Path) -> Result<(TokenizerConfig, PathBuf)> {
    let path = dir.join("tokenizer_config.json");
    let mut config = TokenizerConfig::default();
    if let Some(text) = read_optional(&path)? {
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| EngineError::checkpoint(&path, format!("invalid JSON: {e}")))?;
        config.chat_template = template_field(&json, &path)?;
        config.bos = token_field(&json, "bos_token", &path)?;
        config.eos = token_field(&json, "eos_token", &path)?;
    }
    if config.chat_template.is_some() {
        return Ok((config, path));
    }
    let jinja = dir.join("chat_template.jinja");
    if let Some(text) = read_optional(&jinja)? {
        config.chat_template = Some(text);
        return Ok((config, jinja));
    }
    let json_path = dir.join("chat_template.json");
    if let Some(text) = read_optional(&json_path)? {
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::checkpoint(&json_path, format!("invalid JSON: {e}")))?;
        config.chat_template = template_field(&json, &json_path)?;
        return Ok((config, json_path));
    }
    Ok((config, path))
}

/// Reads a file that may be absent.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::io(path, e)),
    }
}

/// `chat_template`: a string, or a list of `{name, template}` where "default" wins (else the
/// first entry).
fn template_field(json: &serde_json::Value, path: &Path) -> Result<Option<String>> {
    use serde_json::Value;
    match json.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |want: Option<&str>| {
                list.iter().find(|entry| want.is_none_or(|w| entry.get("name").and_then(Value::as_str) == Some(w)))
            };
            let entry = named(Some("default")).or_else(|| named(None));
            match entry.map(|e| e.get("template")) {
                None => Ok(None),
                Some(Some(Value::String(s))) => Ok(Some(s.clone())),
                Some(_) => Err(EngineError::checkpoint(path, "chat_template entry has no string `template`")),
            }
        }
        Some(_) => Err(EngineError::checkpoint(path, "chat_template must be a string or a list of {name, template}")),
    }
}

/// `bos_token` / `eos_token`: a string, an AddedToken object `{"content": ...}`, or null.
fn token_field(json: &serde_json::Value, key: &str, path: &Path) -> Result<Option<String>> {
    use serde_json::Value;
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(EngineError::checkpoint(path, format!("`{key}` object has no string `content`"))),
        },
        Some(_) => Err(EngineError::checkpoint(path, format!("`{key}` must be a string or an object with `content`"))),
    }
}
