//! One choice's progress through its token stream: the reasoning split, tool calls parsed out of
//! the answer, logprobs waiting for a chunk to carry them, the completion-token count and the
//! finish reason. Pure over [`TokenOutput`]s; the SSE formatter and the non-streaming collector
//! both build on it.

use cleave_engine::{FinishReason, TokenOutput};

use crate::reasoning::ReasoningSplitter;
use crate::tools::{ToolCallDelta, ToolCallParser};
use crate::validate::Endpoint;

/// What every chunk (streaming) or the one body (not streaming) of one response shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-...` or `cmpl-...`; also the request id in logs.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// Over all the response's prompts.
    pub prompt_tokens: usize,
    /// `n`: choice `i` belongs to prompt `i / choices_per_prompt`.
    pub choices_per_prompt: usize,
    pub include_usage: bool,
    pub logprobs: bool,
}

/// How a response's output is read.
#[derive(Debug, Clone)]
pub struct OutputParsing {
    /// How chat output divides into reasoning and content (switched off for completions).
    pub splitter: ReasoningSplitter,
    /// Send the reasoning.
    pub include_reasoning: bool,
    /// Chat with tools: the answer's tool calls are parsed out of its content.
    pub tools: Option<ToolCallParser>,
}

impl OutputParsing {
    /// Reasoning split only, no tools.
    pub fn new(splitter: ReasoningSplitter, include_reasoning: bool) -> Self {
        OutputParsing { splitter, include_reasoning, tools: None }
    }
}

/// A token's logprob and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What one token adds to a choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceDelta {
    /// This is the choice's first token (the role chunk goes out now).
    pub first: bool,
    pub reasoning: String,
    pub content: String,
    /// Pieces of tool calls (a call's first piece has its id and name).
    pub tool_calls: Vec<ToolCallDelta>,
    /// Logprobs of the tokens whose text this delta carries (and of text-less tokens before it).
    pub logprobs: Vec<TokenLogprob>,
    /// `finish_reason` when this delta ends the choice: the engine's reason, or `tool_calls`
    /// when an answer that stopped by itself made calls.
    pub finish: Option<&'static str>,
}

impl ChoiceDelta {
    /// Whether a chunk should carry this delta (it has text or calls, or ends the choice).
    pub fn has_chunk(&self) -> bool {
        !self.reasoning.is_empty() || !self.content.is_empty() || !self.tool_calls.is_empty() || self.finish.is_some()
    }
}

/// The state of one choice.
#[derive(Debug, Clone)]
pub struct ChoiceState {
    pub index: usize,
    splitter: ReasoningSplitter,
    include_reasoning: bool,
    tools: Option<ToolCallParser>,
    want_logprobs: bool,
    pending: Vec<TokenLogprob>,
    /// Tokens generated so far (reasoning included).
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache supplied, as the first token reported it.
    pub cached_tokens: usize,
    /// `finish_reason`, once the choice ended.
    pub finish: Option<&'static str>,
}

impl ChoiceState {
    /// The state of choice `index`; tool call ids begin with `call_id_prefix`.
    pub fn new(index: usize, parsing: OutputParsing, want_logprobs: bool, call_id_prefix: &str) -> Self {
        let mut tools = parsing.tools;
        if let Some(t) = tools.as_mut() {
            t.set_id_prefix(format!("{call_id_prefix}{index}_"));
        }
        ChoiceState {
            index,
            splitter: parsing.splitter,
            include_reasoning: parsing.include_reasoning,
            tools,
            want_logprobs,
            pending: Vec::new(),
            completion_tokens: 0,
            cached_tokens: 0,
            finish: None,
        }
    }

    /// The states of a response's `n` choices. Only chat output is split into reasoning and
    /// content and read for tool calls.
    pub fn for_response(meta: &ResponseMeta, n: usize, mut parsing: OutputParsing) -> Vec<Self> {
        if meta.endpoint != Endpoint::Chat {
            parsing = OutputParsing::new(ReasoningSplitter::off(), parsing.include_reasoning);
        }
        let prefix = format!("call_{}_", meta.id.trim_start_matches("chatcmpl-"));
        (0..n).map(|i| ChoiceState::new(i, parsing.clone(), meta.logprobs, &prefix)).collect()
    }

    /// Whether this choice's output has a reasoning section.
    pub fn splits_reasoning(&self) -> bool {
        self.splitter.active()
    }

    /// Whether the `</think>` token came (so the answer has a content part).
    pub fn reasoning_ended(&self) -> bool {
        self.splitter.ended()
    }

    /// Takes one token. Tokens after the finish are ignored.
    pub fn push(&mut self, t: &TokenOutput) -> ChoiceDelta {
        if self.finish.is_some() {
            return ChoiceDelta::default();
        }
        let first = self.completion_tokens == 0;
        if first {
            self.cached_tokens = t.cached_tokens;
        }
        self.completion_tokens += 1;
        let was_reasoning = self.splitter.in_reasoning();
        let split = self.splitter.push(t.token, &t.text);
        let keep_token = self.include_reasoning || !was_reasoning;
        if self.want_logprobs && keep_token {
            self.pending.push(TokenLogprob { token: t.token, logprob: t.logprob, top: t.top_logprobs.clone() });
        }
        let (content, tool_calls) = match self.tools.as_mut() {
            Some(p) if !self.splitter.in_reasoning() => {
                let (content, mut calls) = p.push(t.token, &split.content);
                if t.finish.is_some() {
                    calls.extend(p.finish());
                }
                (content, calls)
            }
            _ => (split.content, Vec::new()),
        };
        let made_calls = self.tools.as_ref().is_some_and(|p| p.calls() > 0);
        let finish = t.finish.map(|f| if made_calls && f == FinishReason::Stop { "tool_calls" } else { f.as_str() });
        let mut d = ChoiceDelta {
            first,
            reasoning: if self.include_reasoning { split.reasoning } else { String::new() },
            content,
            tool_calls,
            logprobs: Vec::new(),
            finish,
        };
        self.finish = finish;
        if d.has_chunk() {
            d.logprobs = std::mem::take(&mut self.pending);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tok(token: u32, text: &str, finish: Option<FinishReason>) -> TokenOutput {
        TokenOutput {
            id: 0,
            token,
            logprob: -(token as f32) / 100.0,
            top_logprobs: vec![(token, -0.1)],
            text: text.into(),
            finish,
            ..TokenOutput::default()
        }
    }

    #[test]
    fn logprobs_of_textless_tokens_ride_on_the_next_chunk() {
        let mut c = ChoiceState::new(0, OutputParsing::new(ReasoningSplitter::new(Some(9)), true), true, "");
        let d = c.push(&tok(1, "", None));
        assert!(d.first && !d.has_chunk());
        let d = c.push(&tok(2, "ab", None));
        assert_eq!(d.logprobs.iter().map(|l| l.token).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(d.reasoning, "ab");
        let d = c.push(&tok(9, "</think>", None));
        assert!(!d.has_chunk());
        let d = c.push(&tok(3, "x", Some(FinishReason::Stop)));
        assert_eq!((d.content.as_str(), d.finish), ("x", Some("stop")));
        assert_eq!(d.logprobs.len(), 2);
        assert_eq!(c.completion_tokens, 4);
        assert!(c.reasoning_ended());
        assert!(!c.push(&tok(4, "late", None)).has_chunk());
    }

    #[test]
    fn excluded_reasoning_sends_neither_text_nor_logprobs() {
        let mut c = ChoiceState::new(1, OutputParsing::new(ReasoningSplitter::new(Some(9)), false), true, "");
        assert!(!c.push(&tok(1, "hmm", None)).has_chunk());
        assert!(!c.push(&tok(9, "</think>", None)).has_chunk());
        let d = c.push(&tok(2, "yes", Some(FinishReason::Length)));
        assert_eq!(d.content, "yes");
        assert_eq!(d.logprobs.iter().map(|l| l.token).collect::<Vec<_>>(), vec![2]);
        assert_eq!(c.completion_tokens, 3, "usage still counts reasoning tokens");
    }
}
