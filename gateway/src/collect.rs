//! Non-streaming responses: every choice's tokens gathered into one `chat.completion` or
//! `text_completion` body. Pure: token outputs in, JSON out.

use std::sync::Arc;

use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::TokenOutput;

use crate::choice::{ChoiceState, OutputParsing, ResponseMeta, TokenLogprob};
use crate::openai::{
    AssistantMessage, ChatChoice, ChatCompletion, Completion, CompletionChoice, MessageFunction, MessageReasoning,
    MessageToolCall, TokenStrings, Usage,
};
use crate::validate::Endpoint;

#[derive(Default)]
struct Gathered {
    reasoning: String,
    content: String,
    tool_calls: Vec<MessageToolCall>,
    logprobs: Vec<TokenLogprob>,
}

/// Gathers the outputs of `n` choices.
pub struct Collector {
    meta: ResponseMeta,
    tokenizer: Option<Arc<Tokenizer>>,
    choices: Vec<ChoiceState>,
    gathered: Vec<Gathered>,
    include_reasoning: bool,
}

impl Collector {
    /// See [`crate::sse::StreamFormatter::new`].
    pub fn new(meta: ResponseMeta, tokenizer: Option<Arc<Tokenizer>>, n: usize, parsing: OutputParsing) -> Self {
        let include_reasoning = parsing.include_reasoning;
        let choices = ChoiceState::for_response(&meta, n, parsing);
        Collector {
            meta,
            tokenizer,
            choices,
            gathered: (0..n).map(|_| Gathered::default()).collect(),
            include_reasoning,
        }
    }

    /// Takes one token of choice `choice`.
    pub fn on_token(&mut self, choice: usize, t: &TokenOutput) {
        let (Some(state), Some(g)) = (self.choices.get_mut(choice), self.gathered.get_mut(choice)) else { return };
        let d = state.push(t);
        g.reasoning.push_str(&d.reasoning);
        g.content.push_str(&d.content);
        for t in d.tool_calls {
            if t.index == g.tool_calls.len() {
                g.tool_calls.push(MessageToolCall {
                    id: t.id.unwrap_or_default(),
                    kind: "function",
                    function: MessageFunction { name: t.name.unwrap_or_default(), arguments: String::new() },
                });
            }
            if let Some(call) = g.tool_calls.get_mut(t.index) {
                call.function.arguments.push_str(&t.arguments);
            }
        }
        g.logprobs.extend(d.logprobs);
    }

    /// Whether every choice has its finish reason.
    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Token counts.
    pub fn usage(&self) -> Usage {
        Usage::of(self.meta.prompt_tokens, &self.choices, self.meta.choices_per_prompt)
    }

    /// The response body.
    pub fn into_json(self) -> Vec<u8> {
        let usage = self.usage();
        let strings = TokenStrings(self.tokenizer.as_deref());
        let m = &self.meta;
        let out = match m.endpoint {
            Endpoint::Chat => {
                let choices = self
                    .choices
                    .iter()
                    .zip(self.gathered)
                    .map(|(c, g)| {
                        let (mut content, reasoning_content) = if !c.splits_reasoning() {
                            (Some(g.content), None)
                        } else {
                            let content = c.reasoning_ended().then_some(g.content);
                            (content, self.include_reasoning.then_some(g.reasoning))
                        };
                        // An answer of tool calls only (R1 puts a blank line before them).
                        if !g.tool_calls.is_empty() && content.as_deref().is_some_and(|t| t.trim().is_empty()) {
                            content = None;
                        }
                        ChatChoice {
                            index: c.index,
                            message: AssistantMessage {
                                role: "assistant",
                                content,
                                reasoning: MessageReasoning(reasoning_content),
                                tool_calls: g.tool_calls,
                            },
                            logprobs: m.logprobs.then(|| strings.chat(&g.logprobs)),
                            finish_reason: c.finish,
                        }
                    })
                    .collect();
                serde_json::to_vec(&ChatCompletion {
                    id: &m.id,
                    object: "chat.completion",
                    created: m.created,
                    model: &m.model,
                    choices,
                    usage,
                })
            }
            Endpoint::Completion => {
                let choices = self
                    .choices
                    .iter()
                    .zip(&self.gathered)
                    .map(|(c, g)| CompletionChoice {
                        index: c.index,
                        text: &g.content,
                        logprobs: m.logprobs.then(|| strings.completion(&g.logprobs, 0)),
                        finish_reason: c.finish,
                    })
                    .collect();
                serde_json::to_vec(&Completion {
                    id: &m.id,
                    object: "text_completion",
                    created: m.created,
                    model: &m.model,
                    choices,
                    usage: Some(usage),
                })
            }
        };
        out.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasoning::ReasoningSplitter;
    use cleave_engine::FinishReason;
    use serde_json::{json, Value};

    fn tok(token: u32, text: &str, finish: Option<FinishReason>) -> TokenOutput {
        TokenOutput { token, logprob: -0.5, text: text.into(), finish, ..TokenOutput::default() }
    }

    fn meta(endpoint: Endpoint, logprobs: bool) -> ResponseMeta {
        ResponseMeta {
            id: "x".into(),
            created: 1,
            model: "m".into(),
            endpoint,
            prompt_tokens: 3,
            choices_per_prompt: 1,
            include_usage: false,
            logprobs,
        }
    }

    fn run(c: &mut Collector, toks: &[TokenOutput]) -> Value {
        for t in toks {
            c.on_token(0, t);
        }
        let c = std::mem::replace(
            c,
            Collector::new(
                meta(Endpoint::Chat, false),
                None,
                1,
                OutputParsing::new(ReasoningSplitter::new(None), true),
            ),
        );
        serde_json::from_slice(&c.into_json()).unwrap()
    }

    #[test]
    fn chat_message_carries_reasoning_and_content() {
        let first = TokenOutput { cached_tokens: 2, ..tok(1, "think", None) };
        let toks = [first, tok(9, "</think>", None), tok(2, "answer", Some(FinishReason::Stop))];
        let mut c = Collector::new(
            meta(Endpoint::Chat, false),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        let v = run(&mut c, &toks);
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "answer", "reasoning_content": "think", "reasoning": "think"})
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                   "prompt_tokens_details": {"cached_tokens": 2}}),
            "the first token reports the cached prompt tokens"
        );
        assert_eq!(v["object"], "chat.completion");
        let mut c = Collector::new(
            meta(Endpoint::Chat, false),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), false),
        );
        let v = run(&mut c, &toks);
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "answer", "reasoning_content": null, "reasoning": null})
        );
    }

    #[test]
    fn no_think_end_means_null_content_and_no_split_means_plain_content() {
        let toks = [tok(1, "still", None), tok(2, " thinking", Some(FinishReason::Length))];
        let mut c = Collector::new(
            meta(Endpoint::Chat, true),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        let v = run(&mut c, &toks);
        assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "still thinking");
        assert_eq!(v["choices"][0]["message"]["reasoning"], "still thinking");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["logprobs"]["content"].as_array().unwrap().len(), 2);
        let mut c = Collector::new(
            meta(Endpoint::Chat, false),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(None), true),
        );
        let v = run(&mut c, &toks);
        assert_eq!(v["choices"][0]["message"]["content"], "still thinking");
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], Value::Null);
    }

    #[test]
    fn completion_body_has_text_and_usage() {
        let mut c = Collector::new(
            meta(Endpoint::Completion, true),
            None,
            2,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        c.on_token(1, &tok(5, "b", Some(FinishReason::Stop)));
        c.on_token(0, &tok(9, "</think>", Some(FinishReason::Length)));
        assert!(c.all_finished());
        let v: Value = serde_json::from_slice(&c.into_json()).unwrap();
        assert_eq!(v["choices"][0]["text"], "</think>");
        assert_eq!(v["choices"][1]["text"], "b");
        assert_eq!(v["choices"][1]["logprobs"]["token_logprobs"], json!([-0.5]));
        assert_eq!(v["usage"]["completion_tokens"], 2);
    }
}
