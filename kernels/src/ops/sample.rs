//! Launcher of the sampling kernel (`cu/sample.cu`).

use crate::{Arg, Gpu, KernelError, Result};

/// Shape of one sampling launch: `rows` sampled rows of a `[_, vocab]` f32 logits matrix.
#[derive(Debug, Clone, Copy)]
pub struct SampleLaunch {
    pub rows: usize,
    pub vocab: usize,
}

impl SampleLaunch {
    /// u32 words of one row's token mask (one bit per token).
    pub fn mask_words(&self) -> usize {
        self.vocab.div_ceil(32)
    }
}

/// Per-row parameter words the kernel reads: row, temperature, top_k, top_p, min_p, u, and the
/// row's mask index ([`NO_MASK`] for none).
pub const SAMPLE_PARAM_WORDS: usize = 7;

/// The mask index of a row without a mask.
pub const NO_MASK: u32 = u32::MAX;

impl Gpu {
    /// Samples one token per row: `params` holds [`SAMPLE_PARAM_WORDS`] u32 per row, `masks` the
    /// masks the rows index ([`SampleLaunch::mask_words`] each; 0 when no row has one), `out`
    /// receives `(token, logprob bits)` per row.
    ///
    /// # Safety
    /// `logits` holds the f32 rows the parameters name (`vocab` each), `params` `s.rows` rows of
    /// [`SAMPLE_PARAM_WORDS`] u32, `masks` (when non-zero) every mask a row indexes, `out` `2 * s.rows`
    /// u32: device addresses of this context.
    pub unsafe fn sample_rows(&self, logits: u64, params: u64, masks: u64, out: u64, s: SampleLaunch) -> Result<()> {
        if s.vocab == 0 || s.vocab > i32::MAX as usize {
            return Err(KernelError::Invalid(format!("sample_rows: vocabulary of {}", s.vocab)));
        }
        self.launch_rows(
            "sample_rows",
            s.rows,
            1024,
            &[
                Arg::Ptr(logits),
                Arg::Ptr(params),
                Arg::Ptr(masks),
                Arg::Ptr(out),
                Arg::I32(s.vocab as i32),
                Arg::I32(s.mask_words() as i32),
            ],
        )
    }
}
