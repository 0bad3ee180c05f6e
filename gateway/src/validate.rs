//! Request validation, in one place: raw body bytes in, a [`GenerateRequest`] (prompt ids and
//! engine [`SamplingParams`]) or an [`ApiError`] naming the offending field out.
//!
//! Fields are read one by one from the JSON object so every type error names its field; fields
//! this server does not know are ignored, as OpenAI-compatible servers do.

use cleave_engine::structured::{Constraint, Guided};
use cleave_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
use cleave_engine::{RequestError, RequestLimits, SamplingParams};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::backend::ModelInfo;
use crate::defaults::SamplingDefaults;
use crate::errors::{kind, ApiError};
use crate::messages::messages;
use crate::reasoning::ReasoningSplitter;
use crate::structured;
use crate::tools::{self, ToolCallParser, ToolRequest, ToolTokens};

/// Most alternatives per token a request may ask for (vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Which OpenAI endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: chat template, reasoning split, `message` / `delta`.
    Chat,
    /// `/v1/completions`: raw prompt, `text`.
    Completion,
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub endpoint: Endpoint,
    /// Prompt token ids (chat: the rendered template).
    pub prompt: Vec<u32>,
    /// Engine parameters of choice 0; choice `i` uses `seed + i` when a seed is given.
    pub params: SamplingParams,
    /// Independent choices.
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `Some(k)`: return each token's logprob and its top `k` alternatives.
    pub logprobs: Option<usize>,
    /// Chat: send the reasoning (`include_reasoning`, default true).
    pub include_reasoning: bool,
    /// Chat with tools: the parser of the answer's tool calls (ids not set yet).
    pub tools: Option<ToolCallParser>,
}

/// Validates requests against one served model.
pub struct Validator<'a> {
    pub info: &'a ModelInfo,
    pub tokenizer: Option<&'a Tokenizer>,
    pub defaults: &'a SamplingDefaults,
    /// Largest `n` accepted.
    pub max_n: usize,
}

/// Bytes of text per token that no tokenizer reaches on average: longer text cannot fit.
const MAX_BYTES_PER_TOKEN: usize = 32;

fn message_bytes(messages: &[ChatMessage]) -> usize {
    let calls = |m: &ChatMessage| m.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>();
    messages.iter().map(|m| m.content.len() + m.reasoning_content.as_ref().map_or(0, String::len) + calls(m)).sum()
}

/// Parses a body that must be a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::InvalidRequest("the request body must be a JSON object".into())),
        Err(e) => Err(ApiError::MalformedJson(e.to_string())),
    }
}

/// Typed access to the fields of a JSON object, with errors that name the field.
pub(crate) struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    /// The field as `T`; absent and `null` are `None`.
    pub fn opt<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ApiError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| ApiError::field(key, format!("`{key}`: {e}"))),
        }
    }

    fn num(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(ApiError::field(key, format!("`{key}` must be a number, got {}", kind(v)))),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
            Some(Value::Number(n)) if n.is_u64() => Ok(Some(i64::MAX)),
            Some(v) => Err(ApiError::field(key, format!("`{key}` must be an integer, got {}", kind(v)))),
        }
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool, ApiError> {
        Ok(self.opt::<bool>(key)?.unwrap_or(default))
    }
}

/// `logit_bias`: token ids (as strings, OpenAI's form) to biases, clamped to [-100, 100] as
/// vLLM does; the ids are checked against the vocabulary with the other limits.
fn logit_bias(f: &Fields) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(m) = f.opt::<Map<String, Value>>("logit_bias")? else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in &m {
        let t = k
            .trim()
            .parse::<u32>()
            .map_err(|_| ApiError::field("logit_bias", format!("`logit_bias` keys must be token ids, got \"{k}\"")))?;
        let b = v.as_f64().filter(|b| b.is_finite()).ok_or_else(|| {
            ApiError::field("logit_bias", format!("`logit_bias` values must be numbers, got {} for token {t}", kind(v)))
        })?;
        out.push((t, b.clamp(-100.0, 100.0) as f32));
    }
    out.sort_by_key(|&(t, _)| t);
    Ok(out)
}

fn positive(f: &Fields, key: &str) -> Result<Option<usize>, ApiError> {
    match f.int(key)? {
        Some(v) if v <= 0 => Err(ApiError::field(key, format!("`{key}` must be at least 1, got {v}"))),
        v => Ok(v.map(|v| v as usize)),
    }
}

impl Validator<'_> {
    fn tokenizer(&self) -> Result<&Tokenizer, ApiError> {
        self.tokenizer
            .ok_or_else(|| ApiError::InvalidRequest("this model has no tokenizer: send prompts as token ids".into()))
    }

    /// Refuses, before tokenizing, text too long for the context under any tokenizer.
    fn fits(&self, bytes: usize, param: &str) -> Result<(), ApiError> {
        let most = self.info.max_model_len.saturating_mul(MAX_BYTES_PER_TOKEN);
        if bytes > most {
            return Err(ApiError::field(
                param,
                format!(
                    "the prompt has {bytes} bytes of text, more than this model's maximum context of {} tokens can hold",
                    self.info.max_model_len
                ),
            ));
        }
        Ok(())
    }

    fn check_model(&self, f: &Fields) -> Result<(), ApiError> {
        match f.opt::<String>("model")? {
            Some(m) if m != self.info.served_model_name => Err(ApiError::ModelNotFound(m)),
            _ => Ok(()),
        }
    }

    fn check_ids(&self, ids: &[u32], param: &str) -> Result<(), ApiError> {
        match ids.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            Some(t) => Err(ApiError::field(
                param,
                format!("token id {t} is outside the vocabulary of {}", self.info.vocab_size),
            )),
            None => Ok(()),
        }
    }

    /// Validates a `/v1/chat/completions` body.
    pub fn chat(&self, body: &[u8]) -> Result<GenerateRequest, ApiError> {
        let obj = parse_object(body)?;
        let f = Fields(&obj);
        self.check_model(&f)?;
        let mut req = self.common(&f, Endpoint::Chat)?;
        let tok = self.tokenizer()?;
        let (prompt, tools) = self.chat_prompt(tok, &obj, &f)?;
        req.prompt = prompt;
        let mut constraint = structured::constraint(&obj)?;
        if let Some(t) = tools.as_ref().filter(|t| t.parses()) {
            let tokens = ToolTokens::of(tok).ok_or_else(|| {
                ApiError::field("tools", "this model's vocabulary has no DeepSeek tool-call tokens to write calls with")
            })?;
            if let Some(grammar) = t.grammar(&tokens) {
                if constraint.is_some() {
                    return Err(ApiError::field(
                        "tool_choice",
                        "a required or named `tool_choice` constrains the output already; drop `response_format`",
                    ));
                }
                constraint = Some(Constraint::Grammar(grammar));
            }
            req.tools = Some(ToolCallParser::new(tokens, t.max_calls(), String::new()));
        }
        if let Some(constraint) = constraint {
            // A prompt that opened R1's think block leaves the reasoning free: the constraint
            // starts after `</think>` (vLLM's default with a reasoning parser).
            let think_start = tok.token_to_id("<think>");
            let reasoning = ReasoningSplitter::for_prompt(&req.prompt, think_start, self.info.think_end_id).active();
            let after_token = if reasoning { self.info.think_end_id } else { None };
            req.params.guided = Some(Guided { constraint, after_token });
        }
        self.finish(&f, req, "messages")
    }

    /// A chat body's prompt: its `messages` through `tok`'s chat template, with
    /// `add_generation_prompt` (default true), `chat_template_kwargs` and the tools it declares
    /// (returned too). The rendered template holds its special tokens (BOS) already, so nothing
    /// is added.
    fn chat_prompt(
        &self,
        tok: &Tokenizer,
        obj: &Map<String, Value>,
        f: &Fields<'_>,
    ) -> Result<(Vec<u32>, Option<ToolRequest>), ApiError> {
        let messages = messages(obj.get("messages"))?;
        self.fits(message_bytes(&messages), "messages")?;
        let kwargs = chat_template_kwargs(f)?;
        let tools = tools::request(obj)?;
        let opts = ChatOptions {
            add_generation_prompt: f.bool("add_generation_prompt", true)?,
            tools: tools.as_ref().and_then(ToolRequest::rendered),
            kwargs: kwargs.as_ref(),
        };
        let prompt = tok.encode_chat(&messages, opts)?;
        Ok((prompt, tools))
    }

    /// Validates a `/v1/completions` body: one request per prompt (OpenAI's `prompt` may list
    /// several), alike but for the prompt and its default `max_tokens` (each prompt's own room).
    pub fn completion(&self, body: &[u8]) -> Result<Vec<GenerateRequest>, ApiError> {
        let obj = parse_object(body)?;
        let f = Fields(&obj);
        self.check_model(&f)?;
        let req = self.common(&f, Endpoint::Completion)?;
        let prompts = self.completion_prompts(obj.get("prompt"), req.n)?;
        let req = self.completion_options(&f, &obj, req)?;
        prompts.into_iter().map(|prompt| self.finish(&f, GenerateRequest { prompt, ..req.clone() }, "prompt")).collect()
    }

    /// A completion's own options, on the request every prompt shares.
    fn completion_options(
        &self,
        f: &Fields,
        obj: &Map<String, Value>,
        mut req: GenerateRequest,
    ) -> Result<GenerateRequest, ApiError> {
        if f.bool("echo", false)? {
            return Err(ApiError::field("echo", "`echo` is not supported"));
        }
        if f.int("best_of")?.is_some_and(|b| b as usize != req.n) {
            return Err(ApiError::field("best_of", "`best_of` other than `n` is not supported"));
        }
        if let Some(constraint) = structured::constraint(obj)? {
            self.tokenizer()?;
            req.params.guided = Some(Guided { constraint, after_token: None });
        }
        Ok(req)
    }

    /// Validates a `/tokenize` body (vLLM's shape): `prompt` (with `add_special_tokens`, default
    /// true) or `messages` (with `add_generation_prompt`, default true, and
    /// `chat_template_kwargs`; the template's own special tokens only, like the chat endpoint).
    pub fn tokenize(&self, body: &[u8]) -> Result<Vec<u32>, ApiError> {
        let obj = parse_object(body)?;
        let f = Fields(&obj);
        self.check_model(&f)?;
        let tok = self.tokenizer()?;
        if obj.contains_key("messages") {
            return Ok(self.chat_prompt(tok, &obj, &f)?.0);
        }
        let prompt = f
            .opt::<String>("prompt")?
            .ok_or_else(|| ApiError::field("prompt", "`prompt` or `messages` is required"))?;
        self.fits(prompt.len(), "prompt")?;
        Ok(tok.encode(&prompt, f.bool("add_special_tokens", true)?)?)
    }

    /// Validates a `/detokenize` body: `{"tokens": [ids]}`.
    pub fn detokenize(&self, body: &[u8]) -> Result<Vec<u32>, ApiError> {
        let obj = parse_object(body)?;
        let f = Fields(&obj);
        self.check_model(&f)?;
        self.tokenizer()?;
        let ids: Vec<u32> = f.opt("tokens")?.ok_or_else(|| ApiError::field("tokens", "`tokens` is required"))?;
        self.check_ids(&ids, "tokens")?;
        Ok(ids)
    }

    /// `prompt` as OpenAI takes it: a string, a list of strings, a list of token ids, or a list
    /// of token-id lists; at most as many prompts as run `n` choices each within `max_n`
    /// sequences (counted before any is tokenized).
    fn completion_prompts(&self, v: Option<&Value>, n: usize) -> Result<Vec<Vec<u32>>, ApiError> {
        const SHAPES: &str = "a string, a list of strings, a list of token ids, or a list of token-id lists";
        let one_text = |s: &str| -> Result<Vec<u32>, ApiError> {
            self.fits(s.len(), "prompt")?;
            Ok(self.tokenizer()?.encode(s, true)?)
        };
        let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
            items
                .iter()
                .map(|x| x.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::field("prompt", format!("`prompt` must be {SHAPES}")))
        };
        let prompts = match v {
            None | Some(Value::Null) => return Err(ApiError::field("prompt", "`prompt` is required")),
            Some(Value::String(s)) => vec![one_text(s)?],
            Some(Value::Array(items)) => match items.as_slice() {
                [] => return Err(ApiError::field("prompt", "`prompt` is empty")),
                [Value::Number(_), ..] => vec![ids(items)?],
                _ if items.len() * n > self.max_n => {
                    return Err(ApiError::field(
                        "prompt",
                        format!(
                            "{} prompts of n = {n} choices each are {} sequences; one request runs at most {}",
                            items.len(),
                            items.len() * n,
                            self.max_n
                        ),
                    ))
                }
                _ => items
                    .iter()
                    .map(|item| match item {
                        Value::String(s) => one_text(s),
                        Value::Array(inner) => ids(inner),
                        _ => Err(ApiError::field("prompt", format!("`prompt` must be {SHAPES}"))),
                    })
                    .collect::<Result<_, _>>()?,
            },
            Some(other) => {
                return Err(ApiError::field(
                    "prompt",
                    format!("`prompt` must be a string or a list, got {}", kind(other)),
                ))
            }
        };
        Ok(prompts)
    }

    /// Everything but the prompt and the output length.
    fn common(&self, f: &Fields, endpoint: Endpoint) -> Result<GenerateRequest, ApiError> {
        let d = self.defaults;
        let mut p = SamplingParams { top_logprobs: 0, ..SamplingParams::default() };
        // Ranges are the shared check's (`finish`); a value beyond f32 becomes infinite there.
        p.temperature = f.num("temperature")?.map_or(d.temperature, |t| t as f32);
        p.top_p = f.num("top_p")?.map_or(d.top_p, |t| t as f32);
        p.top_k = match f.int("top_k")? {
            Some(k) if k < -1 => {
                return Err(ApiError::field("top_k", format!("`top_k` must be -1 (disabled) or >= 0, got {k}")))
            }
            Some(k) => k.max(0) as usize,
            None => d.top_k,
        };
        p.min_p = f.num("min_p")?.map_or(d.min_p, |m| m as f32);
        p.repetition_penalty = f.num("repetition_penalty")?.map_or(d.repetition_penalty, |r| r as f32);
        p.presence_penalty = f.num("presence_penalty")?.map_or(0.0, |v| v as f32);
        p.frequency_penalty = f.num("frequency_penalty")?.map_or(0.0, |v| v as f32);
        p.logit_bias = logit_bias(f)?;
        p.seed = match f.0.get("seed") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.is_u64() => n.as_u64(),
            Some(Value::Number(n)) if n.is_i64() => n.as_i64().map(|s| s as u64),
            Some(v) => return Err(ApiError::field("seed", format!("`seed` must be an integer, got {}", kind(v)))),
        };
        p.stop = match f.0.get("stop") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(_)) => f.opt::<Vec<String>>("stop")?.unwrap_or_default(),
            Some(v) => {
                return Err(ApiError::field(
                    "stop",
                    format!("`stop` must be a string or a list of strings, got {}", kind(v)),
                ))
            }
        };
        if !p.stop.is_empty() && self.tokenizer.is_none() {
            return Err(ApiError::field("stop", "stop strings need a tokenizer, which this model lacks"));
        }
        p.stop_token_ids = f.opt("stop_token_ids")?.unwrap_or_default();
        p.ignore_eos = f.bool("ignore_eos", false)?;
        p.skip_special_tokens = f.bool("skip_special_tokens", true)?;
        p.min_tokens = match f.int("min_tokens")? {
            Some(m) if m < 0 => {
                return Err(ApiError::field("min_tokens", format!("`min_tokens` must be >= 0, got {m}")))
            }
            m => m.unwrap_or(0) as usize,
        };
        let n = match f.int("n")? {
            Some(n) if n < 1 => return Err(ApiError::field("n", format!("`n` must be at least 1, got {n}"))),
            Some(n) if n as usize > self.max_n => {
                return Err(ApiError::field("n", format!("`n` must be at most {}, got {n}", self.max_n)))
            }
            n => n.unwrap_or(1) as usize,
        };
        let stream = f.bool("stream", false)?;
        let include_usage = match f.opt::<Map<String, Value>>("stream_options")? {
            Some(_) if !stream => {
                return Err(ApiError::field("stream_options", "`stream_options` is only allowed when `stream` is true"))
            }
            Some(o) => Fields(&o).bool("include_usage", false).map_err(|_| {
                ApiError::field("stream_options.include_usage", "`stream_options.include_usage` must be a boolean")
            })?,
            None => false,
        };
        let logprobs = match endpoint {
            Endpoint::Chat => {
                let want = f.bool("logprobs", false)?;
                let top = f.int("top_logprobs")?;
                match top {
                    Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                        return Err(ApiError::field(
                            "top_logprobs",
                            format!("`top_logprobs` must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
                        ))
                    }
                    Some(k) if k > 0 && !want => {
                        return Err(ApiError::field("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
                    }
                    _ => {}
                }
                want.then_some(top.unwrap_or(0) as usize)
            }
            Endpoint::Completion => match f.int("logprobs")? {
                Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                    return Err(ApiError::field(
                        "logprobs",
                        format!("`logprobs` must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
                    ))
                }
                k => k.map(|k| k as usize),
            },
        };
        p.top_logprobs = logprobs.unwrap_or(0);
        let include_reasoning = f.bool("include_reasoning", true)?;
        Ok(GenerateRequest {
            endpoint,
            prompt: Vec::new(),
            params: p,
            n,
            stream,
            include_usage,
            logprobs,
            include_reasoning,
            tools: None,
        })
    }

    /// Output length and the context check, once the prompt is known.
    fn finish(
        &self,
        f: &Fields,
        mut req: GenerateRequest,
        prompt_param: &'static str,
    ) -> Result<GenerateRequest, ApiError> {
        let max_len = self.info.max_model_len;
        let prompt_len = req.prompt.len();
        let requested = match positive(f, "max_completion_tokens")? {
            Some(m) if req.endpoint == Endpoint::Chat => Some(m),
            _ => positive(f, "max_tokens")?,
        };
        let room = max_len.saturating_sub(prompt_len);
        let max_tokens = match requested.or(self.defaults.max_tokens.map(|m| m.min(room))) {
            Some(m) => m,
            None => room,
        };
        req.params.max_tokens = max_tokens;
        let limits = RequestLimits { vocab_size: self.info.vocab_size, max_model_len: max_len };
        match limits.check(&req.prompt, &req.params, prompt_param) {
            Ok(()) => Ok(req),
            Err(RequestError::Param { param, message }) => Err(ApiError::field(param, message)),
            Err(RequestError::ContextLength { max_model_len, prompt_tokens, max_tokens }) => {
                Err(ApiError::ContextLength {
                    param: prompt_param,
                    max_model_len,
                    prompt_tokens,
                    max_tokens,
                    requested: prompt_tokens + max_tokens,
                })
            }
        }
    }
}

fn chat_template_kwargs(f: &Fields) -> Result<Option<Value>, ApiError> {
    match f.0.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
        Some(v) => Err(ApiError::field(
            "chat_template_kwargs",
            format!("`chat_template_kwargs` must be an object, got {}", kind(v)),
        )),
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
