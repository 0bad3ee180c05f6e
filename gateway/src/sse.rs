//! Server-sent events in the exact framing OpenAI clients and `vllm bench serve` parse:
//! `data: <json>\n\n` per event, a role chunk per choice once its first token exists, the same
//! `id` / `created` on every chunk, `finish_reason` on each choice's last chunk, an optional usage
//! chunk with `choices: []`, then `data: [DONE]\n\n`. An error after the stream started is sent
//! as `data: {"error": {...}}` followed by `[DONE]`.
//!
//! [`StreamFormatter`] is pure: token outputs in, bytes out.

use std::sync::Arc;

use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::TokenOutput;
use serde::Serialize;

use crate::choice::{ChoiceDelta, ChoiceState, OutputParsing, ResponseMeta};
use crate::errors::ApiError;
use crate::openai::{
    ChatChunk, ChatChunkChoice, ChatDelta, Completion, CompletionChoice, DeltaReasoning, TokenStrings, ToolCallChunk,
    Usage,
};
use crate::validate::Endpoint;

/// The final event of every stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Appends one `data: <json>\n\n` event.
pub fn write_event<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    out.extend_from_slice(b"data: ");
    // Serializing these plain structs cannot fail; an error would only truncate the event.
    let _ = serde_json::to_writer(&mut *out, value);
    out.extend_from_slice(b"\n\n");
}

/// Turns the token outputs of `n` choices into SSE bytes.
pub struct StreamFormatter {
    meta: ResponseMeta,
    tokenizer: Option<Arc<Tokenizer>>,
    choices: Vec<ChoiceState>,
    /// Completions: bytes of text sent per choice (for `text_offset`).
    sent: Vec<usize>,
    events: u64,
}

impl StreamFormatter {
    /// `parsing`: how chat output is read (completions are plain text).
    pub fn new(meta: ResponseMeta, tokenizer: Option<Arc<Tokenizer>>, n: usize, parsing: OutputParsing) -> Self {
        let choices = ChoiceState::for_response(&meta, n, parsing);
        StreamFormatter { meta, tokenizer, choices, sent: vec![0; n], events: 0 }
    }

    /// The response id (also the request id in logs).
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// Events written so far (chunks, usage, error and `[DONE]` included).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Whether every choice has its finish reason.
    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Token counts so far.
    pub fn usage(&self) -> Usage {
        Usage::of(self.meta.prompt_tokens, &self.choices, self.meta.choices_per_prompt)
    }

    fn event<T: Serialize>(&mut self, out: &mut Vec<u8>, value: &T) {
        write_event(out, value);
        self.events += 1;
    }

    /// Appends the events for one token of choice `choice`.
    pub fn on_token(&mut self, choice: usize, t: &TokenOutput, out: &mut Vec<u8>) {
        let Some(state) = self.choices.get_mut(choice) else { return };
        let d = state.push(t);
        match self.meta.endpoint {
            Endpoint::Chat => self.chat(choice, d, out),
            Endpoint::Completion => self.completion(choice, d, out),
        }
    }

    fn chat_chunk<'a>(
        &'a self,
        index: usize,
        delta: ChatDelta<'a>,
        d: &ChoiceDelta,
        lps: bool,
        finish: bool,
    ) -> ChatChunk<'a> {
        let strings = TokenStrings(self.tokenizer.as_deref());
        let logprobs = (self.meta.logprobs && lps).then(|| strings.chat(&d.logprobs));
        let finish_reason = if finish { d.finish } else { None };
        ChatChunk {
            id: &self.meta.id,
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: &self.meta.model,
            choices: vec![ChatChunkChoice { index, delta, logprobs, finish_reason }],
            usage: None,
        }
    }

    fn chat(&mut self, index: usize, d: ChoiceDelta, out: &mut Vec<u8>) {
        let mut events = 0;
        if d.first {
            let role = ChatDelta { role: Some("assistant"), content: Some(""), ..Default::default() };
            write_event(out, &self.chat_chunk(index, role, &ChoiceDelta::default(), false, false));
            events += 1;
        }
        if d.has_chunk() {
            // The </think> token's output can carry late reasoning and early content together:
            // they go out as two chunks, reasoning first.
            let both = !d.reasoning.is_empty() && !d.content.is_empty();
            if both {
                let r = ChatDelta { reasoning: DeltaReasoning(Some(&d.reasoning)), ..Default::default() };
                write_event(out, &self.chat_chunk(index, r, &d, true, false));
                events += 1;
            }
            let delta = ChatDelta {
                role: None,
                content: (!d.content.is_empty()).then_some(d.content.as_str()),
                reasoning: DeltaReasoning((!both && !d.reasoning.is_empty()).then_some(d.reasoning.as_str())),
                tool_calls: d.tool_calls.iter().map(ToolCallChunk::of).collect(),
            };
            write_event(out, &self.chat_chunk(index, delta, &d, !both, true));
            events += 1;
        }
        self.events += events;
    }

    fn completion(&mut self, index: usize, d: ChoiceDelta, out: &mut Vec<u8>) {
        if !d.has_chunk() {
            return;
        }
        let strings = TokenStrings(self.tokenizer.as_deref());
        let logprobs = self.meta.logprobs.then(|| strings.completion(&d.logprobs, self.sent[index]));
        self.sent[index] += d.content.len();
        let chunk = Completion {
            id: &self.meta.id,
            object: "text_completion",
            created: self.meta.created,
            model: &self.meta.model,
            choices: vec![CompletionChoice { index, text: &d.content, logprobs, finish_reason: d.finish }],
            usage: None,
        };
        write_event(out, &chunk);
        self.events += 1;
    }

    /// Appends the usage chunk (when asked for) and `[DONE]`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.meta.include_usage {
            let usage = Some(self.usage());
            match self.meta.endpoint {
                Endpoint::Chat => {
                    let c = ChatChunk {
                        id: &self.meta.id,
                        object: "chat.completion.chunk",
                        created: self.meta.created,
                        model: &self.meta.model,
                        choices: vec![],
                        usage,
                    };
                    write_event(out, &c);
                }
                Endpoint::Completion => {
                    let c = Completion {
                        id: &self.meta.id,
                        object: "text_completion",
                        created: self.meta.created,
                        model: &self.meta.model,
                        choices: vec![],
                        usage,
                    };
                    write_event(out, &c);
                }
            }
            self.events += 1;
        }
        out.extend_from_slice(DONE);
        self.events += 1;
    }

    /// Appends an error event and `[DONE]`.
    pub fn error(&mut self, err: &ApiError, out: &mut Vec<u8>) {
        self.event(out, &err.body());
        out.extend_from_slice(DONE);
        self.events += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasoning::ReasoningSplitter;
    use cleave_engine::FinishReason;
    use serde_json::Value;

    fn tok(token: u32, text: &str, finish: Option<FinishReason>) -> TokenOutput {
        TokenOutput {
            id: 0,
            token,
            logprob: -0.25,
            top_logprobs: vec![(token, -0.25)],
            text: text.into(),
            finish,
            ..TokenOutput::default()
        }
    }

    fn meta(endpoint: Endpoint, include_usage: bool, logprobs: bool) -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 42,
            model: "m".into(),
            endpoint,
            prompt_tokens: 5,
            choices_per_prompt: 1,
            include_usage,
            logprobs,
        }
    }

    /// Splits SSE bytes the way `vllm bench serve` does.
    fn events(bytes: &[u8]) -> Vec<String> {
        let s = std::str::from_utf8(bytes).unwrap();
        assert!(s.ends_with("\n\n"));
        s.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("data: prefix").to_string())
            .collect()
    }

    #[test]
    fn chat_stream_has_role_reasoning_content_finish_usage_done() {
        let mut f = StreamFormatter::new(
            meta(Endpoint::Chat, true, false),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        let mut out = Vec::new();
        for t in [
            tok(1, "hmm", None),
            tok(9, "</think>", None),
            tok(2, "\n\nYes", None),
            tok(3, "", Some(FinishReason::Stop)),
        ] {
            f.on_token(0, &t, &mut out);
        }
        assert!(f.all_finished());
        f.finish(&mut out);
        let ev = events(&out);
        assert_eq!(ev.last().unwrap(), "[DONE]");
        let j: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert_eq!(j.len(), 5);
        assert_eq!(j[0]["choices"][0]["delta"], serde_json::json!({"role": "assistant", "content": ""}));
        assert_eq!(j[1]["choices"][0]["delta"], serde_json::json!({"reasoning_content": "hmm", "reasoning": "hmm"}));
        assert_eq!(j[2]["choices"][0]["delta"], serde_json::json!({"content": "\n\nYes"}));
        assert_eq!(j[3]["choices"][0]["delta"], serde_json::json!({}));
        assert_eq!(j[3]["choices"][0]["finish_reason"], "stop");
        assert!(j[..4].iter().all(|c| c["choices"][0]["logprobs"].is_null() && c.get("usage").is_none()));
        assert!(j[..3].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
        assert_eq!(j[4]["choices"], serde_json::json!([]));
        assert_eq!(
            j[4]["usage"],
            serde_json::json!({"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                               "prompt_tokens_details": {"cached_tokens": 0}})
        );
        assert!(j
            .iter()
            .all(|c| c["id"] == "chatcmpl-1" && c["created"] == 42 && c["object"] == "chat.completion.chunk"));
        assert_eq!(f.events(), 6);
    }

    #[test]
    fn completion_stream_with_logprobs_and_two_choices() {
        let mut f = StreamFormatter::new(
            meta(Endpoint::Completion, false, true),
            None,
            2,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        let mut out = Vec::new();
        f.on_token(1, &tok(4, "b", Some(FinishReason::Length)), &mut out);
        f.on_token(0, &tok(9, "</think>", None), &mut out);
        assert!(!f.all_finished());
        f.on_token(0, &tok(5, "a", Some(FinishReason::Stop)), &mut out);
        f.finish(&mut out);
        let ev = events(&out);
        assert_eq!(ev.len(), 4, "no usage chunk without include_usage");
        let j: Vec<Value> = ev[..3].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert_eq!((j[0]["choices"][0]["index"].as_u64(), j[0]["choices"][0]["text"].as_str()), (Some(1), Some("b")));
        assert_eq!(j[1]["choices"][0]["text"], "</think>", "completions have no reasoning split");
        assert_eq!(j[2]["choices"][0]["text"], "a");
        assert_eq!(j[2]["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 1);
        assert_eq!(j[2]["choices"][0]["logprobs"]["text_offset"][0], 8);
        assert_eq!(j[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(j[0]["object"], "text_completion");
    }

    #[test]
    fn error_after_start_is_an_error_event_then_done() {
        let mut f = StreamFormatter::new(
            meta(Endpoint::Chat, true, false),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(None), true),
        );
        let mut out = Vec::new();
        f.on_token(0, &tok(1, "x", None), &mut out);
        f.error(&ApiError::Internal("rank 3 failed".into()), &mut out);
        let ev = events(&out);
        assert_eq!(ev.len(), 4);
        let e: Value = serde_json::from_str(&ev[2]).unwrap();
        assert_eq!(e["error"]["type"], "server_error");
        assert_eq!(e["error"]["message"], crate::errors::INTERNAL_PUBLIC, "the detail stays in the log");
        assert_eq!(ev[3], "[DONE]");
    }

    #[test]
    fn late_reasoning_and_content_on_the_think_end_token_are_two_chunks() {
        let mut f = StreamFormatter::new(
            meta(Endpoint::Chat, false, true),
            None,
            1,
            OutputParsing::new(ReasoningSplitter::new(Some(9)), true),
        );
        let mut out = Vec::new();
        f.on_token(0, &tok(1, "", None), &mut out);
        f.on_token(0, &tok(9, "r</think>c", Some(FinishReason::Stop)), &mut out);
        let ev = events(&out);
        let j: Vec<Value> = ev.iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert_eq!(j.len(), 3);
        assert_eq!(j[1]["choices"][0]["delta"]["reasoning_content"], "r");
        assert_eq!(j[1]["choices"][0]["logprobs"]["content"].as_array().unwrap().len(), 2);
        assert!(j[1]["choices"][0]["finish_reason"].is_null());
        assert_eq!(j[2]["choices"][0]["delta"]["content"], "c");
        assert!(j[2]["choices"][0]["logprobs"].is_null());
        assert_eq!(j[2]["choices"][0]["finish_reason"], "stop");
    }
}
