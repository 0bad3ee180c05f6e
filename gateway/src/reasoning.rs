//! The DeepSeek-R1 reasoning split, decided by token id.
//!
//! R1's chat template ends the prompt inside the reasoning (`<｜Assistant｜><think>\n`), so every
//! generated token up to the first `</think>` token is reasoning and everything after it is the
//! answer. The split is made on the `</think>` token id, never by searching the text, so a
//! literal "`</think>`" typed inside the reasoning's words cannot end it early. The `</think>` token
//! itself produces no text on either side.
//!
//! The engine's text stream may release text one token late (a character split across tokens,
//! text held back while it could begin a stop string). Text carried on the `</think>` token's
//! own output therefore belongs to the reasoning, except for the token's literal "`</think>`"
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No split: all text is content.
    Off,
    /// The prompt did not open a reasoning section: a first `<think>` token opens one,
    /// anything else means plain content.
    Undecided,
    Reasoning,
    /// After `</think>`.
    Content,
}

/// Splits one choice's token stream into reasoning and content.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    think_start: Option<u32>,
    think_end: Option<u32>,
    mode: Mode,
    /// Reasoning text so far is empty (a leading `<think>` is dropped).
    at_start: bool,
}

impl ReasoningSplitter {
    /// A splitter that starts inside the reasoning, for a model whose `</think>` token is
    /// `think_end`. `None` (a model without the token) means no split: all text is content.
    pub fn new(think_end: Option<u32>) -> Self {
        let mode = if think_end.is_some() { Mode::Reasoning } else { Mode::Off };
        ReasoningSplitter { think_start: None, think_end, mode, at_start: true }
    }

    /// No split at all (text completions).
    pub fn off() -> Self {
        Self::new(None)
    }

    /// The split for a chat whose rendered prompt is `prompt`. The output starts inside the
    /// reasoning when the prompt's last `<think>` comes after its last `</think>` (R1's template
    /// ends with `<think>\n`); otherwise only an output that itself begins with `<think>` is
    /// split (older R1 templates), and anything else is plain content (e.g. a template rendered
    /// with thinking disabled, which closes the section in the prompt).
    pub fn for_prompt(prompt: &[u32], think_start: Option<u32>, think_end: Option<u32>) -> Self {
        let Some(end) = think_end else { return Self::off() };
        let last = |id: Option<u32>| id.and_then(|id| prompt.iter().rposition(|&t| t == id));
        let opened = match (last(think_start), last(Some(end))) {
            (Some(s), Some(e)) => s > e,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let mode = if opened { Mode::Reasoning } else { Mode::Undecided };
        ReasoningSplitter { think_start, think_end, mode, at_start: true }
    }

    /// Whether the output has a reasoning section (so far).
    pub fn active(&self) -> bool {
        matches!(self.mode, Mode::Reasoning | Mode::Content)
    }

    /// Whether the `</think>` token has been seen (the output has a content section).
    pub fn ended(&self) -> bool {
        self.mode == Mode::Content
    }

    /// Whether the next token will still be part of the reasoning (an undecided first token
    /// counts as reasoning: `<think>` belongs to it).
    pub fn in_reasoning(&self) -> bool {
        matches!(self.mode, Mode::Reasoning | Mode::Undecided)
    }

    /// Assigns the text of one generated token.
    pub fn push(&mut self, token: u32, text: &str) -> SplitText {
        if self.mode == Mode::Undecided {
            self.mode = if self.think_start == Some(token) { Mode::Reasoning } else { Mode::Off };
        }
        if matches!(self.mode, Mode::Off | Mode::Content) {
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
            self.mode = Mode::Content;
            return match text.rfind(THINK_END) {
                Some(pos) => {
                    SplitText { reasoning: text[..pos].to_string(), content: text[pos + THINK_END.len()..].to_string() }
                }
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

    #[test]
    fn the_prompt_decides_whether_the_output_starts_in_reasoning() {
        const START: u32 = 382;
        // R1's template: the prompt ends with <think>\n.
        let mut s = ReasoningSplitter::for_prompt(&[0, 380, 7, 381, START, 10], Some(START), Some(END));
        let (r, c) = run(&mut s, &[(1, "a"), (END, "</think>"), (2, "b")]);
        assert_eq!((r.as_str(), c.as_str()), ("a", "b"));
        // Thinking disabled: the prompt closes the section; the output is plain content.
        let mut s = ReasoningSplitter::for_prompt(&[0, 381, START, END], Some(START), Some(END));
        let (r, c) = run(&mut s, &[(1, "a"), (END, "</think>"), (2, "b")]);
        assert_eq!((r.as_str(), c.as_str()), ("", "a</think>b"));
        assert!(!s.active());
        // An older template: no <think> in the prompt, the model writes it.
        let mut s = ReasoningSplitter::for_prompt(&[0, 381], Some(START), Some(END));
        let (r, c) = run(&mut s, &[(START, "<think>"), (1, "\nhm"), (END, "</think>"), (2, "ok")]);
        assert_eq!((r.as_str(), c.as_str()), ("\nhm", "ok"));
        assert!(s.ended());
        assert!(!ReasoningSplitter::for_prompt(&[0, 381, START], Some(START), None).active());
    }
}
