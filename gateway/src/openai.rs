//! OpenAI response bodies: chat completions and their stream chunks, text completions, usage and
//! the two logprob shapes (chat's `content: [{token, logprob, bytes, top_logprobs}]`,
//! completions' parallel `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists).

use std::collections::BTreeMap;

use cleave_engine::tokenizer::Tokenizer;
use serde::Serialize;

use crate::choice::{ChoiceState, TokenLogprob};

/// Token counts of a request; `completion_tokens` includes reasoning tokens and sums all choices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`, as OpenAI's API returns it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache (the most of any choice).
    pub cached_tokens: usize,
}

impl Usage {
    /// The usage of a response's choices so far, `per_prompt` choices to each prompt: the cached
    /// prompt tokens are each prompt's (the most any of its choices found), summed.
    pub fn of(prompt_tokens: usize, choices: &[ChoiceState], per_prompt: usize) -> Self {
        let completion_tokens = choices.iter().map(|c| c.completion_tokens).sum();
        let cached_tokens = choices
            .chunks(per_prompt.max(1))
            .map(|group| group.iter().map(|c| c.cached_tokens).max().unwrap_or(0))
            .sum();
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// A `chat.completion.chunk`.
#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice inside a [`ChatChunk`].
#[derive(Debug, Serialize)]
pub struct ChatChunkChoice<'a> {
    pub index: usize,
    pub delta: ChatDelta<'a>,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `delta` of a chat chunk: absent fields are left out (`{}` on a bare finish chunk).
#[derive(Debug, Default, Serialize)]
pub struct ChatDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(flatten)]
    pub reasoning: DeltaReasoning<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallChunk<'a>>,
}

/// A piece of a streamed tool call: the first has `id`, `type` and the name, later ones more
/// of the arguments' text.
#[derive(Debug, Serialize)]
pub struct ToolCallChunk<'a> {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionChunk<'a>,
}

/// `function` of a [`ToolCallChunk`].
#[derive(Debug, Serialize)]
pub struct FunctionChunk<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    pub arguments: &'a str,
}

impl<'a> ToolCallChunk<'a> {
    /// The chunk of one parsed delta.
    pub fn of(d: &'a crate::tools::ToolCallDelta) -> Self {
        ToolCallChunk {
            index: d.index,
            id: d.id.as_deref(),
            kind: d.id.is_some().then_some("function"),
            function: FunctionChunk { name: d.name.as_deref(), arguments: &d.arguments },
        }
    }
}

/// A complete tool call of a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MessageToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: MessageFunction,
}

/// `function` of a [`MessageToolCall`]: `arguments` is the JSON text the model wrote.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MessageFunction {
    pub name: String,
    pub arguments: String,
}

/// R1's reasoning text goes out under both names clients read: `reasoning_content` (DeepSeek's
/// API and most clients) and `reasoning` (current vLLM).
fn reasoning_keys<M: serde::ser::SerializeMap>(m: &mut M, text: Option<&str>) -> Result<(), M::Error> {
    m.serialize_entry("reasoning_content", &text)?;
    m.serialize_entry("reasoning", &text)
}

/// The reasoning of a delta: both keys, or neither when there is none.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct DeltaReasoning<'a>(pub Option<&'a str>);

impl Serialize for DeltaReasoning<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if self.0.is_some() {
            reasoning_keys(&mut m, self.0)?;
        }
        m.end()
    }
}

/// The reasoning of a message: both keys, null when there is none.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MessageReasoning(pub Option<String>);

impl Serialize for MessageReasoning {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        reasoning_keys(&mut m, self.0.as_deref())?;
        m.end()
    }
}

/// A complete `chat.completion`.
#[derive(Debug, Serialize)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// One choice of a [`ChatCompletion`].
#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The generated message: `content` is null when a reasoning model never closed its reasoning,
/// or when the answer is tool calls and nothing else.
#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(flatten)]
    pub reasoning: MessageReasoning,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MessageToolCall>,
}

/// Chat logprobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// One token in [`ChatLogprobs`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative in [`ChatTokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// A `text_completion` (complete, or one stream chunk).
#[derive(Debug, Serialize)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a [`Completion`].
#[derive(Debug, Serialize)]
pub struct CompletionChoice<'a> {
    pub index: usize,
    pub text: &'a str,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// Completions logprobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends another chunk's lists.
    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

/// Turns token ids into the strings logprobs show (each token decoded alone, special tokens
/// included; `token_id:N` without a tokenizer).
#[derive(Clone, Copy)]
pub struct TokenStrings<'a>(pub Option<&'a Tokenizer>);

/// vLLM clamps -inf logprobs to this so the JSON stays a number.
const MIN_LOGPROB: f32 = -9999.0;

fn clamp(lp: f32) -> f32 {
    if lp.is_nan() {
        MIN_LOGPROB
    } else {
        lp.max(MIN_LOGPROB)
    }
}

impl TokenStrings<'_> {
    /// The text of one token.
    pub fn text(&self, id: u32) -> String {
        self.0.and_then(|t| t.decode(&[id], false).ok()).unwrap_or_else(|| format!("token_id:{id}"))
    }

    /// Chat-shaped logprobs of `lps`.
    pub fn chat(&self, lps: &[TokenLogprob]) -> ChatLogprobs {
        let content = lps
            .iter()
            .map(|l| {
                let token = self.text(l.token);
                let top_logprobs = l
                    .top
                    .iter()
                    .map(|&(id, lp)| {
                        let token = self.text(id);
                        ChatTopLogprob { bytes: token.as_bytes().to_vec(), token, logprob: clamp(lp) }
                    })
                    .collect();
                ChatTokenLogprob { bytes: token.as_bytes().to_vec(), token, logprob: clamp(l.logprob), top_logprobs }
            })
            .collect();
        ChatLogprobs { content }
    }

    /// Completions-shaped logprobs of `lps`; `offset` is the length of the text before them.
    pub fn completion(&self, lps: &[TokenLogprob], mut offset: usize) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for l in lps {
            let token = self.text(l.token);
            out.text_offset.push(offset);
            offset += token.len();
            out.tokens.push(token);
            out.token_logprobs.push(clamp(l.logprob));
            out.top_logprobs.push(l.top.iter().map(|&(id, lp)| (self.text(id), clamp(lp))).collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_shapes_match_openai() {
        let lps = vec![TokenLogprob { token: 7, logprob: f32::NEG_INFINITY, top: vec![(7, -0.5), (8, -1.5)] }];
        let s = TokenStrings(None);
        let chat = serde_json::to_value(s.chat(&lps)).unwrap();
        assert_eq!(chat["content"][0]["token"], "token_id:7");
        assert_eq!(chat["content"][0]["logprob"], -9999.0);
        assert_eq!(chat["content"][0]["top_logprobs"][1]["token"], "token_id:8");
        assert!(chat["content"][0]["bytes"].is_array());
        let c = serde_json::to_value(s.completion(&lps, 3)).unwrap();
        assert_eq!(c["tokens"][0], "token_id:7");
        assert_eq!(c["text_offset"][0], 3);
        assert_eq!(c["top_logprobs"][0]["token_id:8"], -1.5);
        let d = serde_json::to_string(&ChatDelta::default()).unwrap();
        assert_eq!(d, "{}");
    }
}
