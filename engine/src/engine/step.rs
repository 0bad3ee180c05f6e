//! One step of a group: plan a batch per DP rank, execute it on the runners, then sample and
//! finish each sampled token (detokenize, stop conditions, limits).

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use rayon::prelude::*;

use super::{Engine, FinishReason, ReqState, TokenOutput};
use crate::backend::{AttnSeq, Backend};
use crate::error::Result;
use crate::runner::{RankBatch, RankOutput, StepPlan};
use crate::sampler::{sample, History, SampleRow, Sampled};
use crate::scheduler::{Scheduled, SeqId};
use crate::structured::{GuideStep, MaskBoard, Masks};

/// Where one sampling sequence's token comes from.
enum Pick {
    /// Row `i` of its DP rank's device samples.
    Device(usize),
    /// Row `i` of its DP rank's host logits, with the tokens suppressed now.
    Host(usize, Vec<u32>),
}

impl<B: Backend> Engine<B> {
    /// Runs one batch. Returns the tokens sampled in it (none while only prefill chunks ran).
    pub fn step(&mut self) -> Result<Vec<TokenOutput>> {
        let work: Vec<Vec<Scheduled>> = self.scheds.iter_mut().map(|s| s.schedule()).collect();
        self.started.clear();
        if work.iter().all(Vec::is_empty) {
            return Ok(Vec::new());
        }
        self.started.extend(work.iter().flatten().filter(|w| w.start == 0).map(|w| w.id));
        let dp_rows: Vec<usize> =
            if work.len() > 1 { work.iter().map(|w| w.iter().map(|s| s.len).sum()).collect() } else { Vec::new() };
        let mut plan = StepPlan::default();
        let mut picks: Vec<Vec<(SeqId, Pick)>> = Vec::with_capacity(work.len());
        for (dp, w) in work.iter().enumerate() {
            let (mut batch, p) = self.plan_rank(dp, w);
            batch.input.dp_rows = dp_rows.clone();
            plan.ranks.push(batch);
            picks.push(p);
        }
        // Constrained sequences' masks are computed on another thread while the ranks run the
        // forward pass (llguidance's work never adds to the step); the ranks apply them in
        // their samplers.
        let guided: HashSet<SeqId> = picks
            .iter()
            .flatten()
            .map(|(id, _)| *id)
            .filter(|id| self.reqs[id].guide.as_ref().is_some_and(|g| g.active()))
            .collect();
        let board = Arc::new(if guided.is_empty() { MaskBoard::ready(Masks::new()) } else { MaskBoard::default() });
        plan.masks = board.clone();
        let (group, reqs) = (&mut self.group, &mut self.reqs);
        let outs = if guided.is_empty() {
            group.execute(plan)?
        } else {
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Always published, so no rank waits forever (a panic leaves no masks: the
                    // sequences end as broken).
                    let masks = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        reqs.par_iter_mut()
                            .filter(|(id, _)| guided.contains(id))
                            .filter_map(|(id, st)| Some((*id, st.guide.as_mut()?.mask()?)))
                            .collect::<Masks>()
                    }));
                    board.fill(masks.unwrap_or_default());
                });
                group.execute(plan)
            })?
        };
        let masks = board.wait();
        for (dp, w) in work.iter().enumerate() {
            self.scheds[dp].commit(w);
        }
        let mut out = Vec::new();
        for (dp, (picks, o)) in picks.into_iter().zip(outs).enumerate() {
            let mut host = self.sample_host(dp, &picks, &o, masks);
            for (id, pick) in picks {
                let mask = masks.get(&id);
                if let Some(Err(e)) = mask {
                    tracing::warn!(request_id = id, error = %e, "structured output: no mask; ending the sequence");
                }
                // A mask that could not be computed (or a masker that died) ends the sequence.
                let broken = matches!(mask, Some(Err(_))) || (guided.contains(&id) && mask.is_none());
                let s = match pick {
                    Pick::Device(i) => {
                        let (token, logprob) = o.device[i];
                        Sampled { token, logprob, top: Vec::new() }
                    }
                    Pick::Host(..) => host.remove(&id).expect("every host row was sampled"),
                };
                out.push(self.on_token(id, s, broken)?);
            }
        }
        Ok(out)
    }

    /// The tokens of DP rank `dp`'s rows sampled on the host, in parallel over the rows: each
    /// from its logits row with its repetition penalty over its history, top logprobs,
    /// suppressed tokens and its constraint's allowed tokens.
    fn sample_host(
        &mut self,
        dp: usize,
        picks: &[(SeqId, Pick)],
        o: &RankOutput,
        masks: &Masks,
    ) -> HashMap<SeqId, Sampled> {
        let rows: HashMap<SeqId, (usize, &[u32])> = picks
            .iter()
            .filter_map(|(id, p)| match p {
                Pick::Host(j, banned) => Some((*id, (*j, banned.as_slice()))),
                Pick::Device(_) => None,
            })
            .collect();
        if rows.is_empty() {
            return HashMap::new();
        }
        let (vocab, sched) = (self.vocab, &self.scheds[dp]);
        self.reqs
            .par_iter_mut()
            .filter_map(|(id, st)| {
                let &(j, banned) = rows.get(id)?;
                let seq = sched.get(*id).expect("scheduled sequence exists");
                let p = &st.params;
                let history = History {
                    tokens: if p.repetition_penalty != 1.0 { &seq.tokens } else { &[] },
                    output_counts: p.counts_output().then_some(&st.output_counts),
                };
                let allowed = masks.get(id).and_then(|m| m.as_ref().ok()).map(Vec::as_slice);
                Some((*id, sample(&o.host[j * vocab..(j + 1) * vocab], p, &mut st.rng, history, banned, allowed)))
            })
            .collect()
    }

    /// DP rank `dp`'s tokens, cache slots and sampling rows.
    fn plan_rank(&mut self, dp: usize, work: &[Scheduled]) -> (RankBatch, Vec<(SeqId, Pick)>) {
        let mut b = RankBatch::default();
        let mut picks = Vec::new();
        let bs = self.cfg.block_size;
        let mut logit_row = 0u32;
        for w in work {
            let seq = self.scheds[dp].get(w.id).expect("scheduled sequence exists");
            let input = &mut b.input;
            let q_start = input.ids.len();
            for pos in w.start..w.start + w.len {
                input.ids.push(seq.tokens[pos]);
                input.positions.push(pos as u32);
                input.slots.push(seq.blocks[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            input.attn.seqs.push(AttnSeq {
                q_start,
                q_len: w.len,
                ctx_len: w.start + w.len,
                block_table: seq.blocks.clone(),
            });
            if !w.sample {
                continue;
            }
            input.sample_rows.push((input.ids.len() - 1) as u32);
            let banned = self.banned(&self.reqs[&w.id]);
            let st = self.reqs.get_mut(&w.id).expect("scheduled request has state");
            if SampleRow::fits(&st.params, !banned.is_empty()) {
                if st.guide.as_ref().is_some_and(|g| g.active()) {
                    b.masked.push((b.device.len(), w.id));
                }
                picks.push((w.id, Pick::Device(b.device.len())));
                b.device.push(SampleRow::new(logit_row, &st.params, &mut st.rng));
            } else {
                picks.push((w.id, Pick::Host(b.host.len(), banned)));
                b.host.push(logit_row);
            }
            logit_row += 1;
        }
        (b, picks)
    }

    /// Tokens suppressed for `id` now: EOS and stop ids before `min_tokens`.
    fn banned(&self, st: &ReqState) -> Vec<u32> {
        let p = &st.params;
        let mut banned: Vec<u32> = Vec::new();
        if st.generated < p.min_tokens {
            banned.extend(p.stop_token_ids.iter().copied());
            if !p.ignore_eos {
                banned.extend(self.eos.iter().copied());
            }
        }
        banned
    }

    /// Finishes one sampled token; `broken`: its constraint could not be applied, so the
    /// sequence ends here.
    fn on_token(&mut self, id: SeqId, s: Sampled, broken: bool) -> Result<TokenOutput> {
        let dp = self.placed[&id];
        let st = self.reqs.get_mut(&id).expect("scheduled request has state");
        let seq = self.scheds[dp].get(id).expect("scheduled sequence exists");
        let p = &st.params;
        let total_len = seq.tokens.len() + 1;
        let cached_tokens = seq.cached_tokens;
        st.generated += 1;
        if p.counts_output() {
            *st.output_counts.entry(s.token).or_default() += 1;
        }
        let mut finish = None;
        if (!p.ignore_eos && self.eos.contains(&s.token)) || p.stop_token_ids.contains(&s.token) {
            finish = Some(FinishReason::Stop);
        }
        let is_eos = self.eos.contains(&s.token);
        let guide_step = st.guide.as_mut().map_or(GuideStep::Continue, |g| g.advance(s.token, is_eos));
        if let GuideStep::Failed(e) = &guide_step {
            tracing::warn!(request_id = id, error = %e, "structured output: the constraint failed; ending the sequence");
        }
        if broken || (guide_step != GuideStep::Continue && is_eos) {
            // The constraint's end (or failure) at EOS: EOS itself is never text.
            finish = Some(FinishReason::Stop);
        }
        let mut text = String::new();
        let mut hit_stop_string = false;
        if let (Some(tok), Some(detok)) = (&self.tokenizer, st.detok.as_mut()) {
            let delta = if finish.is_none() { detok.push(tok, s.token)? } else { String::new() };
            (text, hit_stop_string) = st.stop.push(&delta);
        }
        if hit_stop_string || guide_step != GuideStep::Continue {
            finish = Some(FinishReason::Stop);
        } else if finish.is_none() && (st.generated >= p.max_tokens || total_len >= self.max_len) {
            finish = Some(FinishReason::Length);
        }
        if let (true, false, Some(tok), Some(detok)) =
            (finish.is_some(), hit_stop_string, &self.tokenizer, st.detok.as_mut())
        {
            // Ended by EOS, a stop token or a limit: release the text still held back (an
            // incomplete character, a possible start of a stop string), unless it completes one.
            let (emit, hit) = st.stop.push(&detok.finish(tok)?);
            text.push_str(&emit);
            if !hit {
                text.push_str(&st.stop.flush());
            }
        }
        let prefill_only = st.prefill_only;
        self.scheds[dp].push_token(id, s.token);
        let mut prefilled = false;
        if finish.is_some() {
            self.abort(id);
        } else if prefill_only {
            self.scheds[dp].hold(id);
            prefilled = true;
        }
        Ok(TokenOutput {
            id,
            token: s.token,
            logprob: s.logprob,
            top_logprobs: s.top,
            text,
            finish,
            prefilled,
            cached_tokens,
        })
    }
}
