//! The DeepSeek-R1 reasoning split, decided by token id.
//!
//! R1's chat template ends the prompt inside the reasoning (`<｜Assistant｜><think>\n`), so every
//! generated token up to the first `</think>` token is reasoning and everything after it is the
//! answer. The split is made on the `</think>` token id, never by searching the text, so a
//! literal "</think>" typed inside the reasoning's words cannot end it early. The `</think>` token
//! itself produces no text on either side.
//!
//! The engine's text stream may release text one token late (a character split across tokens,
//! text held back while it could begin a stop string). Text carried on the `</think>` token's
//! own output therefore belongs to the reasoning, except for the token's literal "</think>"
//! (which is not a special token in R1's vocabulary, so it is decoded even with
//! `skip_special_tokens`) and anything after it.

/// The literal text of the think-end token.
const THINK_END: &str = "</think>";
/// The literal text of the think-start token, which some models repeat at the start.
const THINK_START: &str = "<think>";

/// The reasoning and content parts of one token's text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitText {
    pub reasoning: String,
    pub content: String,
}

/// Splits one choice's token stream into reasoning and content.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    think_end: Option<u32>,
    in_reasoning: bool,
    /// Reasoning text so far is empty (a leading `<think>` is dropped).
    at_start: bool,
}

impl ReasoningSplitter {
    /// A splitter for a model whose `</think>` token is `think_end`. `None` (a model without the
    /// token) means no split: all text is content.
    pub fn new(think_end: Option<u32>) -> Self {
        ReasoningSplitter { think_end, in_reasoning: think_end.is_some(), at_start: true }
    }

    /// Whether this splitter separates reasoning at all.
    pub fn active(&self) -> bool {
        self.think_end.is_some()
    }

    /// Whether the `</think>` token has been seen (the output has a content section).
    pub fn ended(&self) -> bool {
        self.active() && !self.in_reasoning
    }

    /// Whether the next token will still be part of the reasoning.
    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// Assigns the text of one generated token.
    pub fn push(&mut self, token: u32, text: &str) -> SplitText {
        if !self.in_reasoning {
            return SplitText { reasoning: String::new(), content: text.to_string() };
        }
        let mut text = text;
        if self.at_start {
            text = text.strip_prefix(THINK_START).unwrap_or(text);
            if !text.is_empty() {
                self.at_start = false;
            }
        }
        if Some(token) == self.think_end {
            self.in_reasoning = false;
            return match text.rfind(THINK_END) {
                Some(pos) => SplitText { reasoning: text[..pos].to_string(), content: text[pos + THINK_END.len()..].to_string() },
                None => SplitText { reasoning: text.to_string(), content: String::new() },
            };
        }
        SplitText { reasoning: text.to_string(), content: String::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: u32 = 383;

    fn run(s: &mut ReasoningSplitter, toks: &[(u32, &str)]) -> (String, String) {
        let (mut r, mut c) = (String::new(), String::new());
        for (id, text) in toks {
            let p = s.push(*id, text);
            r.push_str(&p.reasoning);
            c.push_str(&p.content);
        }
        (r, c)
    }

    #[test]
    fn splits_on_the_think_end_id_and_the_token_sends_nothing() {
        let mut s = ReasoningSplitter::new(Some(END));
        assert_eq!(s.push(5, "Let me"), SplitText { reasoning: "Let me".into(), content: String::new() });
        assert_eq!(s.push(6, " think"), SplitText { reasoning: " think".into(), content: String::new() });
        assert!(!s.ended());
        assert_eq!(s.push(END, "</think>"), SplitText::default(), "the </think> token alone produces nothing");
        assert!(s.ended());
        assert_eq!(s.push(7, "\n\nAnswer").content, "\n\nAnswer");
        assert_eq!(s.push(END, "</think>").content, "</think>", "a second </think> is content");
    }

    #[test]
    fn literal_think_end_text_from_other_tokens_does_not_split() {
        let mut s = ReasoningSplitter::new(Some(END));
        let (r, c) = run(&mut s, &[(10, "a </"), (11, "think> b")]);
        assert_eq!((r.as_str(), c.as_str()), ("a </think> b", ""));
        assert!(!s.ended());
    }

    #[test]
    fn late_text_on_the_think_end_token_goes_to_the_right_side() {
        // Text held back by the detokenizer is released together with the </think> token.
        let mut s = ReasoningSplitter::new(Some(END));
        let (r, c) = run(&mut s, &[(10, "caf"), (END, "é</think>"), (12, "ok")]);
        assert_eq!((r.as_str(), c.as_str()), ("café", "ok"));
        // With skip_special_tokens and a special </think>, its text is empty.
        let mut s = ReasoningSplitter::new(Some(END));
        let (r, c) = run(&mut s, &[(10, "x"), (END, ""), (12, "y")]);
        assert_eq!((r.as_str(), c.as_str()), ("x", "y"));
    }

    #[test]
    fn no_think_token_means_no_split_and_no_end_means_all_reasoning() {
        let mut s = ReasoningSplitter::new(None);
        assert!(!s.active());
        let (r, c) = run(&mut s, &[(1, "a"), (END, "</think>"), (2, "b")]);
        assert_eq!((r.as_str(), c.as_str()), ("", "a</think>b"));
        let mut s = ReasoningSplitter::new(Some(END));
        let (r, c) = run(&mut s, &[(1, "<think>"), (2, "still thinking")]);
        assert_eq!((r.as_str(), c.as_str()), ("still thinking", ""));
        assert!(s.active() && !s.ended());
    }
}
