//! Structured outputs: what a request's output must match (any JSON object, a JSON schema, a
//! regular expression, one of several strings, a Lark grammar), enforced token by token with
//! llguidance's masks. A constraint may start after a given token (R1's `</think>`: the reasoning
//! stays free, the answer is constrained, as vLLM does by default).

mod vocab;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema (`json_schema`, vLLM's `guided_json` / `structured_outputs.json`).
    JsonSchema(Value),
    /// A regular expression the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Grammar(String),
}

/// A request's constraint and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Guided {
    pub constraint: Constraint,
    /// Output is free until this token has been generated (R1's `</think>`); `None`: from the
    /// first token.
    pub after_token: Option<u32>,
}

/// Escapes `s` for a regular expression.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// JSON without free whitespace between tokens (one space after `,` and `:`), unless the schema
/// sets llguidance's own `x-guidance` options: small models given free whitespace can write
/// nothing else until `max_tokens`.
pub fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    schema
}

impl Constraint {
    fn grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({"type": "object"}))),
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Choice(c) => {
                if c.is_empty() {
                    return Err(EngineError::InvalidRequest("a choice constraint needs at least one choice".into()));
                }
                let alternatives: Vec<String> = c.iter().map(|s| format!("({})", regex_escape(s))).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            Constraint::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// Compiles constraints for one model's vocabulary (built once per engine: the token trie).
pub struct GuideCompiler {
    factory: ParserFactory,
}

impl GuideCompiler {
    /// A compiler for `tok` over `vocab` ids (the model's logits width) ending with `eos`.
    pub fn new(tok: Arc<Tokenizer>, vocab: usize, eos: u32) -> Result<Self> {
        let env: toktrie::TokEnv = Arc::new(vocab::Vocab::new(tok, vocab, eos));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::Config(format!("structured outputs: cannot index the vocabulary: {e}")))?;
        factory.quiet();
        Ok(GuideCompiler { factory })
    }

    /// Starts enforcing `g`; an invalid schema, regex or grammar is an `InvalidRequest` naming
    /// the problem.
    pub fn start(&self, g: &Guided) -> Result<Guide> {
        let parser = self
            .factory
            .create_parser(g.constraint.grammar()?)
            .map_err(|e| EngineError::InvalidRequest(format!("invalid structured output constraint: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(EngineError::InvalidRequest(format!("invalid structured output constraint: {e}")));
        }
        Ok(Guide { matcher, after: g.after_token, active: g.after_token.is_none() })
    }
}

/// What a generated token did to a constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuideStep {
    /// More output is expected (or the constraint has not started).
    Continue,
    /// The output is complete: the sequence ends.
    Done,
    /// The token broke the constraint (a bug or an impossible state): the sequence ends.
    Failed(String),
}

/// One request's constraint in progress.
pub struct Guide {
    matcher: Matcher,
    after: Option<u32>,
    active: bool,
}

impl Guide {
    /// Whether the next token is constrained.
    pub fn active(&self) -> bool {
        self.active && !self.matcher.is_stopped()
    }

    /// The tokens allowed next, one bit each (bit `i % 32` of word `i / 32`); `None` while the
    /// constraint has not started.
    pub fn mask(&mut self) -> Option<std::result::Result<Vec<u32>, String>> {
        if !self.active() {
            return None;
        }
        Some(self.matcher.compute_mask().map(|v| v.as_slice().to_vec()).map_err(|e| e.to_string()))
    }

    /// Records a generated token.
    pub fn advance(&mut self, token: u32, eos: bool) -> GuideStep {
        if !self.active {
            if Some(token) == self.after {
                self.active = true;
            }
            return GuideStep::Continue;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            return GuideStep::Failed(e.to_string());
        }
        if eos || self.matcher.is_stopped() {
            GuideStep::Done
        } else {
            GuideStep::Continue
        }
    }
}

/// Each constrained sequence's allowed tokens for one step, by sequence id (or why none could be
/// computed).
pub type Masks = HashMap<u64, std::result::Result<Vec<u32>, String>>;

/// One step's masks, computed on a CPU thread while the ranks run the forward pass and read by
/// the ranks right before they sample (a rank waits only if the masks are late).
#[derive(Debug, Default)]
pub struct MaskBoard {
    masks: OnceLock<Masks>,
}

impl MaskBoard {
    /// A board whose masks are known already (none, for a step without constraints).
    pub fn ready(masks: Masks) -> Self {
        let board = MaskBoard::default();
        board.fill(masks);
        board
    }

    /// Publishes the step's masks (the first call wins).
    pub fn fill(&self, masks: Masks) {
        let _ = self.masks.set(masks);
    }

    /// The step's masks, waiting until they are published.
    pub fn wait(&self) -> &Masks {
        self.masks.wait()
    }
}

/// Whether bit `token` is set in `mask` (see [`Guide::mask`]).
pub fn allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_escaped_and_bits_read() {
        assert_eq!(regex_escape("a.b(c)"), "a\\.b\\(c\\)");
        let m = [0b101u32, 1];
        assert!(allows(&m, 0) && !allows(&m, 1) && allows(&m, 2) && allows(&m, 32) && !allows(&m, 99));
    }
}
