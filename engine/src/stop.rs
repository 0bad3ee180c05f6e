//! Stop strings: text is held back while it could still be the start of a stop string, so a stop
//! string split across tokens never reaches the client.

/// Streams text through a set of stop strings.
#[derive(Debug, Default, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new() }
    }

    /// Adds text; returns what can be emitted now, and whether a stop string was reached (the
    /// emitted text then ends right before it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), false);
        }
        if let Some(pos) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..pos].to_string();
            self.pending.clear();
            return (out, true);
        }
        let hold = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.pending[i..])))
            .unwrap_or(self.pending.len());
        let rest = self.pending.split_off(hold);
        (std::mem::replace(&mut self.pending, rest), false)
    }

    /// Releases held-back text at the end of a stream.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_pushes_never_leaks() {
        let mut m = StopMatcher::new(&["END".into(), "\n\n".into()]);
        assert_eq!(m.push("abc E"), ("abc ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("D tail"), ("".into(), true));
        let mut m = StopMatcher::new(&["END".into()]);
        assert_eq!(m.push("xE"), ("x".into(), false));
        assert_eq!(m.push("Nd"), ("ENd".into(), false), "a false start is released");
        assert_eq!(m.push("é E"), ("é ".into(), false));
        assert_eq!(m.flush(), "E");
    }
}
