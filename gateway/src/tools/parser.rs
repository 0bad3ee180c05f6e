//! DeepSeek-V3/R1 tool calls read out of a token stream, by token id.
//!
//! The model writes `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
//! "\n```json\n", ARGUMENTS, "\n```" and `<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`. V3.1 writes
//! `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>`; both are read. The markers are
//! recognized by id (their text is empty when special tokens are skipped, their literal text
//! otherwise), so a model quoting the marker text inside an answer cannot start a call. Arguments
//! stream as they come, holding back only what could be the closing fence.

use cleave_engine::tokenizer::Tokenizer;

/// The closing fence of R1's arguments.
const CLOSE_FENCE: &str = "\n```";
/// The opening fence of R1's arguments.
const OPEN_FENCE: &str = "```json\n";

/// The ids and texts of the tool-call marker tokens of a vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolTokens {
    pub calls_begin: u32,
    pub calls_end: u32,
    pub call_begin: u32,
    pub call_end: u32,
    pub sep: u32,
    /// The literal text of each marker, by the id order above.
    literals: [String; 5],
}

impl ToolTokens {
    /// DeepSeek's markers in `tok`'s vocabulary; `None` when any is missing.
    pub fn of(tok: &Tokenizer) -> Option<Self> {
        let names = [
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
        ];
        let ids: Vec<u32> = names.iter().map(|n| tok.token_to_id(n)).collect::<Option<_>>()?;
        Some(ToolTokens {
            calls_begin: ids[0],
            calls_end: ids[1],
            call_begin: ids[2],
            call_end: ids[3],
            sep: ids[4],
            literals: names.map(str::to_string),
        })
    }

    /// Markers with ids 100..=104 (calls begin, calls end, call begin, call end, sep) whose texts
    /// are `<CB>`, `<CE>`, `<B>`, `<E>`, `<SEP>`.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        ToolTokens {
            calls_begin: 100,
            calls_end: 101,
            call_begin: 102,
            call_end: 103,
            sep: 104,
            literals: ["<CB>", "<CE>", "<B>", "<E>", "<SEP>"].map(str::to_string),
        }
    }

    /// The text a marker token carries before its own literal (text the detokenizer released
    /// late); for any other token, all of `text`.
    fn before_marker<'t>(&self, token: u32, text: &'t str) -> &'t str {
        let ids = [self.calls_begin, self.calls_end, self.call_begin, self.call_end, self.sep];
        match ids.iter().position(|&id| id == token) {
            Some(i) => text.strip_suffix(self.literals[i].as_str()).unwrap_or(text),
            None => text,
        }
    }
}

/// What one token adds to a call: its first delta has the id and name, later ones argument text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position in the message's `tool_calls`.
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Plain answer text.
    Content,
    /// Inside the calls section, between calls.
    Between,
    /// After `<｜tool▁call▁begin｜>`: the type (R1) or the name (V3.1), up to `<｜tool▁sep｜>`.
    Header(String),
    /// R1: the name, up to its newline.
    Name(String),
    /// The arguments not sent yet; `opened` once the opening fence is known to be there or not.
    Arguments { pending: String, opened: bool },
    /// After `<｜tool▁calls▁end｜>` or the last call allowed: the rest is dropped.
    Done,
}

/// One choice's tool-call parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallParser {
    tokens: ToolTokens,
    state: State,
    calls: usize,
    max_calls: usize,
    id_prefix: String,
}

impl ToolCallParser {
    /// A parser for `tokens` reading at most `max_calls` calls; call ids are `id_prefix` + index.
    pub fn new(tokens: ToolTokens, max_calls: usize, id_prefix: String) -> Self {
        ToolCallParser { tokens, state: State::Content, calls: 0, max_calls, id_prefix }
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Gives this parser's choice its own call ids.
    pub fn set_id_prefix(&mut self, prefix: String) {
        self.id_prefix = prefix;
    }

    /// Reads one generated token of the answer; returns its content text and call deltas.
    pub fn push(&mut self, token: u32, text: &str) -> (String, Vec<ToolCallDelta>) {
        let t = &self.tokens;
        let before = t.before_marker(token, text).to_string();
        let mut content = String::new();
        let mut deltas = Vec::new();
        match std::mem::replace(&mut self.state, State::Done) {
            State::Content => {
                content = before;
                self.state = if token == t.calls_begin {
                    State::Between
                } else if token == t.call_begin {
                    State::Header(String::new())
                } else {
                    State::Content
                };
            }
            State::Between => {
                self.state = if token == t.call_begin {
                    State::Header(String::new())
                } else if token == t.calls_end {
                    State::Done
                } else {
                    State::Between
                };
            }
            State::Header(mut h) => {
                h.push_str(&before);
                self.state = if token == t.sep {
                    match h.trim() {
                        "function" | "" => State::Name(String::new()),
                        name => {
                            deltas.push(self.begin_call(name));
                            State::Arguments { pending: String::new(), opened: false }
                        }
                    }
                } else if token == t.call_end {
                    deltas.push(self.begin_call(h.trim()));
                    self.end_call()
                } else {
                    State::Header(h)
                };
            }
            State::Name(mut n) => {
                n.push_str(&before);
                let end = token == t.call_end;
                self.state = match n.find('\n') {
                    Some(pos) => {
                        deltas.push(self.begin_call(n[..pos].trim()));
                        let rest = n[pos + 1..].to_string();
                        self.arguments(rest, false, end, &mut deltas)
                    }
                    None if end => {
                        deltas.push(self.begin_call(n.trim()));
                        self.end_call()
                    }
                    None => State::Name(n),
                };
            }
            State::Arguments { mut pending, opened } => {
                pending.push_str(&before);
                self.state = self.arguments(pending, opened, token == t.call_end, &mut deltas);
            }
            // Text after the calls is not part of an OpenAI message (vLLM drops it too).
            State::Done => {}
        }
        (content, deltas)
    }

    /// Sends what can be sent of the pending arguments; `end`: the call is over.
    fn arguments(&mut self, mut pending: String, mut opened: bool, end: bool, out: &mut Vec<ToolCallDelta>) -> State {
        if !opened {
            if let Some(rest) = pending.strip_prefix(OPEN_FENCE) {
                pending = rest.to_string();
                opened = true;
            } else if end || !OPEN_FENCE.starts_with(pending.as_str()) {
                opened = true;
            }
        }
        if end {
            let args = pending.strip_suffix(CLOSE_FENCE).unwrap_or(&pending).trim_end();
            self.send_arguments(args, out);
            return self.end_call();
        }
        if !opened {
            return State::Arguments { pending, opened };
        }
        let hold = held_back(&pending);
        let ready = pending.len() - hold;
        self.send_arguments(&pending[..ready], out);
        State::Arguments { pending: pending[ready..].to_string(), opened }
    }

    fn send_arguments(&self, text: &str, out: &mut Vec<ToolCallDelta>) {
        if text.is_empty() {
            return;
        }
        let index = self.calls - 1;
        match out.last_mut() {
            Some(d) if d.index == index => d.arguments.push_str(text),
            _ => out.push(ToolCallDelta { index, arguments: text.to_string(), ..ToolCallDelta::default() }),
        }
    }

    fn begin_call(&mut self, name: &str) -> ToolCallDelta {
        let index = self.calls;
        self.calls += 1;
        ToolCallDelta {
            index,
            id: Some(format!("{}{index}", self.id_prefix)),
            name: Some(name.to_string()),
            arguments: String::new(),
        }
    }

    fn end_call(&self) -> State {
        if self.calls >= self.max_calls {
            State::Done
        } else {
            State::Between
        }
    }

    /// The output ended: arguments held back so far are sent as they are.
    pub fn finish(&mut self) -> Vec<ToolCallDelta> {
        let mut out = Vec::new();
        if let State::Arguments { pending, .. } = std::mem::replace(&mut self.state, State::Done) {
            self.send_arguments(pending.strip_suffix(CLOSE_FENCE).unwrap_or(&pending), &mut out);
        }
        out
    }
}

/// Bytes at the end of `s` that could begin the closing fence.
fn held_back(s: &str) -> usize {
    (1..=CLOSE_FENCE.len().min(s.len()))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && CLOSE_FENCE.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CB: u32 = 100;
    const CE: u32 = 101;
    const B: u32 = 102;
    const E: u32 = 103;
    const SEP: u32 = 104;

    fn tokens() -> ToolTokens {
        ToolTokens::for_tests()
    }

    /// Runs `toks` and gathers content and per-call (id, name, arguments), checking that each
    /// call's first delta carries its id and name.
    fn run(p: &mut ToolCallParser, toks: &[(u32, &str)]) -> (String, Vec<(String, String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(String, String, String)> = Vec::new();
        let take = |ds: Vec<ToolCallDelta>, calls: &mut Vec<(String, String, String)>| {
            for d in ds {
                if d.index == calls.len() {
                    calls.push((d.id.clone().expect("first delta has the id"), d.name.clone().unwrap(), String::new()));
                } else {
                    assert!(d.id.is_none() && d.name.is_none());
                }
                calls[d.index].2.push_str(&d.arguments);
            }
        };
        for (id, text) in toks {
            let (c, ds) = p.push(*id, text);
            content.push_str(&c);
            take(ds, &mut calls);
        }
        take(p.finish(), &mut calls);
        (content, calls)
    }

    fn call(id: &str, name: &str, args: &str) -> (String, String, String) {
        (id.into(), name.into(), args.into())
    }

    #[test]
    fn r1_calls_stream_name_first_then_arguments_without_fences() {
        let mut p = ToolCallParser::new(tokens(), usize::MAX, "call_".into());
        let toks = [
            (1, "\n\n"),
            (CB, ""),
            (B, ""),
            (2, "function"),
            (SEP, ""),
            (3, "calc"),
            (4, "\n```"),
            (5, "json\n{\"a\":"),
            (6, " 1}\n`"),
            (7, "``"),
            (E, ""),
            (8, "\n"),
            (B, ""),
            (2, "function"),
            (SEP, ""),
            (3, "g\n```json\n{}\n```"),
            (E, ""),
            (CE, ""),
        ];
        let (content, calls) = run(&mut p, &toks);
        assert_eq!(content, "\n\n");
        assert_eq!(calls, vec![call("call_0", "calc", "{\"a\": 1}"), call("call_1", "g", "{}")]);
        assert_eq!(p.calls(), 2);
    }

    #[test]
    fn arguments_stream_before_the_call_ends_holding_back_only_a_possible_fence() {
        let mut p = ToolCallParser::new(tokens(), usize::MAX, "c".into());
        for (id, text) in [(CB, ""), (B, ""), (2, "function"), (SEP, ""), (3, "f\n```json\n")] {
            p.push(id, text);
        }
        let (_, d) = p.push(4, "{\"x\":");
        assert_eq!(d[0].arguments, "{\"x\":");
        let (_, d) = p.push(5, "2}\n`");
        assert_eq!(d[0].arguments, "2}", "the newline and backtick could start the fence");
        let (_, d) = p.push(6, "x");
        assert_eq!(d[0].arguments, "\n`x", "not a fence after all");
    }

    #[test]
    fn literal_marker_text_and_v31_format_and_the_call_limit() {
        // Markers decoded with their text (skip_special_tokens false), late text before them.
        let mut p = ToolCallParser::new(tokens(), 1, "id".into());
        let toks = [
            (1, "ok"),
            (CB, "!<CB>"),
            (B, "<B>"),
            (3, "lookup"),
            (SEP, "<SEP>"),
            (4, "{\"w\":\"hi\"}"),
            (E, "<E>"),
            (B, "<B>"),
            (3, "second"),
            (SEP, "<SEP>"),
            (E, "<E>"),
        ];
        let (content, calls) = run(&mut p, &toks);
        assert_eq!(content, "ok!");
        assert_eq!(calls, vec![call("id0", "lookup", "{\"w\":\"hi\"}")], "max_calls 1 keeps the first call");
        // The marker text typed by other tokens is plain content.
        let mut p = ToolCallParser::new(tokens(), 4, "id".into());
        let (content, calls) = run(&mut p, &[(1, "<CB><B>"), (2, "x")]);
        assert_eq!((content.as_str(), calls.len()), ("<CB><B>x", 0));
    }

    #[test]
    fn an_output_cut_short_sends_what_it_has() {
        let mut p = ToolCallParser::new(tokens(), 4, "id".into());
        let (_, calls) = run(&mut p, &[(CB, ""), (B, ""), (2, "function"), (SEP, ""), (3, "f\n```json\n{\"a\n`")]);
        assert_eq!(calls, vec![call("id0", "f", "{\"a\n`")]);
        let mut p = ToolCallParser::new(tokens(), 4, "id".into());
        let (_, calls) = run(&mut p, &[(CB, ""), (B, ""), (2, "function"), (SEP, ""), (3, "na")]);
        assert!(calls.is_empty(), "no call before its name is complete");
        assert_eq!(held_back("ab\n``"), 3);
        assert_eq!(held_back("é"), 0);
    }
}
