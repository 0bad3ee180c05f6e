//! vLLM's parallel-layout flags, as `generate` and `kernels-check` take them (`serve` takes them
//! as overrides of its YAML instead).

use cleave_engine::ParallelConfig;

/// One copy of the model over `tensor_parallel_size x data_parallel_size` GPUs.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ParallelArgs {
    /// Ranks splitting attention heads and MLPs (vLLM's flag).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Ranks each attending their own sequences, exchanging tokens in the MoE layers.
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: usize,
    /// Place whole routed experts per rank instead of splitting each expert.
    #[arg(long)]
    pub enable_expert_parallel: bool,
}

impl Default for ParallelArgs {
    fn default() -> Self {
        let p = ParallelConfig::default();
        ParallelArgs {
            tensor_parallel_size: p.tensor_parallel_size,
            data_parallel_size: p.data_parallel_size,
            enable_expert_parallel: p.enable_expert_parallel,
        }
    }
}

impl ParallelArgs {
    pub fn config(&self) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: self.tensor_parallel_size,
            data_parallel_size: self.data_parallel_size,
            enable_expert_parallel: self.enable_expert_parallel,
        }
    }
}
