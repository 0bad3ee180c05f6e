//! Launcher of the sampling kernel (`cu/sample.cu`).

use crate::{Arg, Gpu, KernelError, Result};

/// Shape of one sampling launch: `rows` sampled rows of a `[_, vocab]` f32 logits matrix.
#[derive(Debug, Clone, Copy)]
pub struct SampleLaunch {
    pub rows: usize,
    pub vocab: usize,
}

/// Per-row parameter words the kernel reads: row, temperature, top_k, top_p, min_p, u.
pub const SAMPLE_PARAM_WORDS: usize = 6;

impl Gpu {
    /// Samples one token per row: `params` holds [`SAMPLE_PARAM_WORDS`] u32 per row, `out` receives
    /// `(token, logprob bits)` per row.
    pub fn sample_rows(&self, logits: u64, params: u64, out: u64, s: SampleLaunch) -> Result<()> {
        if s.vocab == 0 || s.vocab > i32::MAX as usize {
            return Err(KernelError::Invalid(format!("sample_rows: vocabulary of {}", s.vocab)));
        }
        self.launch_rows(
            "sample_rows",
            s.rows,
            1024,
            &[Arg::Ptr(logits), Arg::Ptr(params), Arg::Ptr(out), Arg::I32(s.vocab as i32)],
        )
    }
}
