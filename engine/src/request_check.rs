//! The invariants of a request, written once: the gateway reports a violation against the
//! request field (OpenAI's `param`), the cluster and the engine refuse a request that breaks one
//! (callers of their APIs skip the gateway). Wording is OpenAI's: the field in backticks.

use crate::sampler::SamplingParams;

/// Why a request cannot run on this model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// A field out of range; `param` is its request name.
    #[error("{message}")]
    Param { param: &'static str, message: String },
    /// The prompt plus the output do not fit the context (`max_tokens` counted as at least 1).
    #[error(
        "this model's maximum context length is {max_model_len} tokens; the prompt has {prompt_tokens} and max_tokens is {max_tokens}"
    )]
    ContextLength { max_model_len: usize, prompt_tokens: usize, max_tokens: usize },
}

/// Stop strings per request, and bytes per stop string, at most: the matcher looks at each
/// against the tail of every new token's text, so they bound the cost per token.
pub const MAX_STOP_STRINGS: usize = 64;
pub const MAX_STOP_BYTES: usize = 1024;

fn param(param: &'static str, message: String) -> Result<(), RequestError> {
    Err(RequestError::Param { param, message })
}

impl SamplingParams {
    /// The ranges every sampler relies on.
    pub fn check(&self) -> Result<(), RequestError> {
        let t = self.temperature;
        if !(t >= 0.0 && t.is_finite()) {
            return param("temperature", format!("`temperature` must be a finite number >= 0, got {t}"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return param("top_p", format!("`top_p` must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return param("min_p", format!("`min_p` must be in [0, 1], got {}", self.min_p));
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r.is_finite()) {
            return param("repetition_penalty", format!("`repetition_penalty` must be a finite number > 0, got {r}"));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return param(name, format!("`{name}` must be in [-2, 2], got {v}"));
            }
        }
        if let Some(&(t, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return param("logit_bias", format!("`logit_bias` values must be in [-100, 100], got {b} for token {t}"));
        }
        if self.max_tokens == 0 {
            return param("max_tokens", "`max_tokens` must be at least 1".into());
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return param("stop", format!("at most {MAX_STOP_STRINGS} stop strings, got {}", self.stop.len()));
        }
        if let Some(s) = self.stop.iter().find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
            return param("stop", format!("each stop string must have 1 to {MAX_STOP_BYTES} bytes, got {}", s.len()));
        }
        if self.min_tokens > self.max_tokens {
            return param(
                "min_tokens",
                format!("`min_tokens` ({}) must not exceed max_tokens ({})", self.min_tokens, self.max_tokens),
            );
        }
        Ok(())
    }
}

/// What a model accepts: its vocabulary and context length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub vocab_size: usize,
    pub max_model_len: usize,
}

impl RequestLimits {
    /// Checks a tokenized request; `prompt_param` names the field the prompt came from
    /// (`prompt`, or `messages` for chat).
    pub fn check(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        prompt_param: &'static str,
    ) -> Result<(), RequestError> {
        if prompt.is_empty() {
            return param(prompt_param, "the prompt has no tokens".into());
        }
        if let Some(t) = prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return param(prompt_param, format!("token id {t} is outside the vocabulary of {}", self.vocab_size));
        }
        if let Some(t) = params.stop_token_ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return param("stop_token_ids", format!("token id {t} is outside the vocabulary of {}", self.vocab_size));
        }
        if let Some((t, _)) = params.logit_bias.iter().find(|(t, _)| *t as usize >= self.vocab_size) {
            return param("logit_bias", format!("token id {t} is outside the vocabulary of {}", self.vocab_size));
        }
        let max_tokens = params.max_tokens.max(1);
        if prompt.len() + max_tokens > self.max_model_len {
            return Err(RequestError::ContextLength {
                max_model_len: self.max_model_len,
                prompt_tokens: prompt.len(),
                max_tokens,
            });
        }
        params.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_invariant_names_its_field() {
        let lim = RequestLimits { vocab_size: 100, max_model_len: 50 };
        let ok = SamplingParams::greedy(10);
        assert_eq!(lim.check(&[1, 2, 3], &ok, "prompt"), Ok(()));
        let field = |prompt: &[u32], p: SamplingParams| match lim.check(prompt, &p, "messages") {
            Err(RequestError::Param { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&[], ok.clone()), "messages");
        assert_eq!(field(&[100], ok.clone()), "messages");
        assert_eq!(field(&[1], SamplingParams { temperature: f32::INFINITY, ..ok.clone() }), "temperature");
        assert_eq!(field(&[1], SamplingParams { temperature: f32::NAN, ..ok.clone() }), "temperature");
        assert_eq!(field(&[1], SamplingParams { top_p: 0.0, ..ok.clone() }), "top_p");
        assert_eq!(field(&[1], SamplingParams { min_p: 1.5, ..ok.clone() }), "min_p");
        assert_eq!(
            field(&[1], SamplingParams { repetition_penalty: f32::INFINITY, ..ok.clone() }),
            "repetition_penalty"
        );
        assert_eq!(field(&[1], SamplingParams { presence_penalty: 2.5, ..ok.clone() }), "presence_penalty");
        assert_eq!(field(&[1], SamplingParams { frequency_penalty: f32::NAN, ..ok.clone() }), "frequency_penalty");
        assert_eq!(field(&[1], SamplingParams { logit_bias: vec![(3, 100.5)], ..ok.clone() }), "logit_bias");
        assert_eq!(field(&[1], SamplingParams { logit_bias: vec![(100, 1.0)], ..ok.clone() }), "logit_bias");
        let edges = SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(99, -100.0)],
            ..ok.clone()
        };
        assert_eq!(lim.check(&[1], &edges, "prompt"), Ok(()));
        assert_eq!(field(&[1], SamplingParams { max_tokens: 0, ..ok.clone() }), "max_tokens");
        assert_eq!(field(&[1], SamplingParams { min_tokens: 11, ..ok.clone() }), "min_tokens");
        let many = vec!["x".to_string(); MAX_STOP_STRINGS + 1];
        assert_eq!(field(&[1], SamplingParams { stop: many, ..ok.clone() }), "stop");
        assert_eq!(field(&[1], SamplingParams { stop: vec![String::new()], ..ok.clone() }), "stop");
        assert_eq!(field(&[1], SamplingParams { stop: vec!["y".repeat(MAX_STOP_BYTES + 1)], ..ok.clone() }), "stop");
        assert_eq!(field(&[1], SamplingParams { stop_token_ids: vec![7, 400], ..ok.clone() }), "stop_token_ids");
        let long = vec![1u32; 45];
        assert_eq!(
            lim.check(&long, &ok, "prompt"),
            Err(RequestError::ContextLength { max_model_len: 50, prompt_tokens: 45, max_tokens: 10 })
        );
    }
}
