//! The periodic stats line of a pool, as vLLM logs one: running and waiting sequences, KV cache
//! usage, and prompt and generation throughput since the previous line.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::table::{RankTable, Role};

/// What one line reports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolStats {
    pub running: usize,
    pub waiting: usize,
    /// Fraction of the pool's KV blocks in use.
    pub kv_usage: f64,
    pub prompt_tok_s: f64,
    pub gen_tok_s: f64,
}

/// Token counts seen at the previous line, per slot and incarnation.
pub(crate) struct StatsLine {
    last: HashMap<usize, (u64, u64, u64)>,
    at: Instant,
}

impl StatsLine {
    pub fn new() -> Self {
        StatsLine { last: HashMap::new(), at: Instant::now() }
    }

    /// The pool's numbers since the previous call; `None` when it is idle and was idle then.
    pub fn sample(&mut self, table: &RankTable, slots: &[usize]) -> Option<PoolStats> {
        let secs = self.at.elapsed().as_secs_f64().max(1e-3);
        self.at = Instant::now();
        let (mut s, mut used, mut total, mut prompt, mut gen) = (PoolStats::zero(), 0, 0, 0, 0);
        for &slot in slots {
            let sh = table.shared(slot);
            let l = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
            s.running += l(&sh.running);
            s.waiting += l(&sh.waiting);
            used += l(&sh.blocks_used);
            total += l(&sh.blocks_total);
            let (p, g) = (sh.prompt_tokens.load(Ordering::Relaxed), sh.generated.load(Ordering::Relaxed));
            // A restarted rank counts from zero again.
            let (_, lp, lg) = self.last.insert(slot, (sh.inc, p, g)).filter(|l| l.0 == sh.inc).unwrap_or_default();
            prompt += p.saturating_sub(lp);
            gen += g.saturating_sub(lg);
        }
        s.kv_usage = if total == 0 { 0.0 } else { used as f64 / total as f64 };
        s.prompt_tok_s = prompt as f64 / secs;
        s.gen_tok_s = gen as f64 / secs;
        (s != PoolStats::zero()).then_some(s)
    }
}

fn tenth(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl PoolStats {
    fn zero() -> Self {
        PoolStats { running: 0, waiting: 0, kv_usage: 0.0, prompt_tok_s: 0.0, gen_tok_s: 0.0 }
    }

    /// Logs the line for `role`.
    pub fn log(&self, role: Role) {
        tracing::info!(
            pool = role.as_str(),
            running = self.running,
            waiting = self.waiting,
            kv_cache_usage_pct = tenth(100.0 * self.kv_usage),
            prompt_tokens_per_s = tenth(self.prompt_tok_s),
            generation_tokens_per_s = tenth(self.gen_tok_s),
            "stats"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::FailurePolicy;
    use crate::metrics::Metrics;

    #[test]
    fn a_line_reports_the_pool_since_the_previous_one() {
        let t = RankTable::new(
            &[(0, Role::Decode), (1, Role::Decode)],
            Arc::new(Metrics::new("m")),
            FailurePolicy::Fail,
            16,
        );
        let mut line = StatsLine::new();
        assert_eq!(line.sample(&t, &[0, 1]), None, "idle: no line");
        for (slot, (running, used)) in [(3, 10), (1, 30)].into_iter().enumerate() {
            let sh = t.shared(slot);
            sh.running.store(running, Ordering::Relaxed);
            sh.blocks_used.store(used, Ordering::Relaxed);
            sh.blocks_total.store(100, Ordering::Relaxed);
            sh.prompt_tokens.store(500, Ordering::Relaxed);
            sh.generated.store(40, Ordering::Relaxed);
        }
        let s = line.sample(&t, &[0, 1]).unwrap();
        assert_eq!((s.running, s.waiting, s.kv_usage), (4, 0, 0.2));
        assert!(s.prompt_tok_s > 0.0 && s.gen_tok_s > 0.0);
        // Nothing new: the throughput is zero; a restarted rank counts from zero, never below.
        t.shared(0).generated.store(45, Ordering::Relaxed);
        t.replace(1);
        let s = line.sample(&t, &[0, 1]).unwrap();
        assert_eq!((s.running, s.prompt_tok_s), (3, 0.0));
        assert!(s.gen_tok_s > 0.0);
    }
}
