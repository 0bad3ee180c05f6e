//! Server-sent events, split the way `vllm bench serve` reads them.
//!
//! Bytes arrive in arbitrary pieces; a message ends at a blank line (`\n\n`). From each message
//! the `data:` lines are taken (the literal `"data: "` prefix stripped, as vLLM does; a bare
//! `data:` is accepted too), comment lines (`:` pings) and other fields are skipped, and
//! `data: [DONE]` ends the stream. Carriage returns are dropped, so `\r\n\r\n` framing works too.

/// One complete SSE message that carries data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The payload of a `data:` message (normally one JSON object).
    Data(String),
    /// `data: [DONE]`: the server's end of stream.
    Done,
}

/// Incremental SSE splitter: feed it network chunks, get back complete messages.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// A parser with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a network chunk and returns every message it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend(chunk.iter().copied().filter(|&b| b != b'\r'));
        let mut out = Vec::new();
        while let Some(pos) = find_blank_line(&self.buf) {
            let message: Vec<u8> = self.buf.drain(..pos + 2).collect();
            if let Some(ev) = parse_message(&message[..pos]) {
                out.push(ev);
            }
        }
        out
    }

    /// Ends the stream: whatever is left in the buffer (a last message the server did not
    /// terminate with a blank line) is parsed as one message.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let rest = std::mem::take(&mut self.buf);
        parse_message(&rest)
    }
}

fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n")
}

/// Parses one message (without its terminating blank line).
fn parse_message(message: &[u8]) -> Option<SseEvent> {
    let text = String::from_utf8_lossy(message);
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let Some(rest) = line.strip_prefix("data:") else { continue };
        let payload = rest.strip_prefix(' ').unwrap_or(rest);
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(payload);
            }
            None => data = Some(payload.to_string()),
        }
    }
    let data = data?;
    let trimmed = data.trim();
    if trimmed == "[DONE]" {
        Some(SseEvent::Done)
    } else if trimmed.is_empty() {
        None
    } else {
        Some(SseEvent::Data(trimmed.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.to_string())
    }

    #[test]
    fn splits_messages_across_arbitrary_chunk_boundaries() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":\"x\\ny\"}\n\n: ping\n\ndata: [DONE]\n\n";
        // Every split point must give the same messages.
        for cut in 0..stream.len() {
            let mut p = SseParser::new();
            let mut got = p.push(&stream[..cut]);
            got.extend(p.push(&stream[cut..]));
            assert_eq!(got, vec![data("{\"a\":1}"), data("{\"b\":\"x\\ny\"}"), SseEvent::Done], "cut {cut}");
        }
        // One byte at a time.
        let mut p = SseParser::new();
        let got: Vec<_> = stream.iter().flat_map(|b| p.push(&[*b])).collect();
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn message_is_emitted_only_when_complete() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: {\"a\":1}\n").is_empty());
        assert_eq!(p.push(b"\n"), vec![data("{\"a\":1}")]);
    }

    #[test]
    fn crlf_comments_other_fields_and_bare_data_prefix() {
        let mut p = SseParser::new();
        let got = p.push(b": keepalive\r\n\r\nevent: message\r\nid: 7\r\ndata:{\"x\":2}\r\n\r\nretry: 10\n\n");
        assert_eq!(got, vec![data("{\"x\":2}")]);
    }

    #[test]
    fn utf8_split_inside_a_character() {
        let s = "data: {\"t\":\"日本\"}\n\n".as_bytes();
        let mut p = SseParser::new();
        let mut got = p.push(&s[..12]);
        got.extend(p.push(&s[12..]));
        assert_eq!(got, vec![data("{\"t\":\"日本\"}")]);
    }

    #[test]
    fn unterminated_last_message_is_flushed_by_finish() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: {\"a\":1}\n\ndata: [DONE]").len() == 1);
        assert_eq!(p.finish(), Some(SseEvent::Done));
        assert_eq!(p.finish(), None);
    }
}
