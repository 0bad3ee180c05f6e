//! The subcommands' options (sweeps, charts, mixed load, tagged batches, soak, multi-turn chats);
//! the plain benchmark's and the shared server and workload options are in the parent module.

use std::path::PathBuf;

use clap::Args;

use super::{parse_range, ServerArgs, WorkloadArgs};

/// The multi-turn chat run.
#[derive(Debug, Clone, Args)]
pub struct MultiTurnArgs {
    /// Server (the chat completions API, whatever --backend says).
    #[command(flatten)]
    pub server: ServerArgs,
    /// Conversations in all.
    #[arg(long, default_value_t = 32)]
    pub num_conversations: usize,
    /// User turns per conversation; each waits for the answer before it.
    #[arg(long, default_value_t = 10)]
    pub turns: usize,
    /// Tokens of the system prompt every conversation shares.
    #[arg(long, default_value_t = 2000)]
    pub system_prompt_len: usize,
    /// Tokens of each user message.
    #[arg(long, default_value_t = 64)]
    pub user_len: usize,
    /// Tokens of each answer (ignore_eos).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Conversations in flight at once.
    #[arg(long, default_value_t = 8)]
    pub max_concurrency: usize,
    /// A tokenizer (a `tokenizer.json`, or a directory holding one) to build prompts with here;
    /// default: the server's /tokenize and /detokenize.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Draw random token ids from LO:HI (exclusive) instead of the ids of a built-in corpus.
    #[arg(long, value_parser = parse_range)]
    pub token_id_range: Option<(u32, u32)>,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the result JSON here.
    #[arg(long)]
    pub save_result: Option<PathBuf>,
}

/// The soak run.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[arg(long, default_value_t = 600)]
    pub duration_s: u64,
    /// Clients at once (2x the server's max_concurrent_requests overloads it).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Share of requests that are bad input.
    #[arg(long, default_value_t = 0.1)]
    pub bad_fraction: f64,
    /// Share of requests whose client hangs up after two chunks.
    #[arg(long, default_value_t = 0.2)]
    pub disconnect_fraction: f64,
    /// Tokens each normal request asks for.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// A request unanswered this long counts as a hang.
    #[arg(long, default_value_t = 120)]
    pub request_timeout_s: u64,
    /// The server's process id: its resident memory is sampled every second.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Most growth of resident memory allowed, first quarter of the run to the last (MiB).
    #[arg(long, default_value_t = 256.0)]
    pub max_rss_growth_mib: f64,
    /// Seed of the workers' choices.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print each unexpected answer.
    #[arg(long)]
    pub verbose: bool,
    /// Write the result JSON here.
    #[arg(long)]
    pub save_result: Option<PathBuf>,
}

/// A sweep over max concurrency or request rate.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Workload of every point.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Max-concurrency values, e.g. 1,2,4,8 (requests released all at once).
    #[arg(long, value_delimiter = ',', conflicts_with = "request_rate")]
    pub max_concurrency: Vec<usize>,
    /// Request-rate values, e.g. 1,2,4 (no concurrency cap).
    #[arg(long, value_delimiter = ',')]
    pub request_rate: Vec<f64>,
    /// With --max-concurrency: send N x concurrency prompts at each point instead of --num-prompts.
    #[arg(long)]
    pub prompts_per_concurrency: Option<usize>,
    /// Directory for the per-point JSON, sweep.csv, sweep.json and the charts.
    #[arg(long, default_value = "sweep-results")]
    pub output_dir: PathBuf,
    /// Label of this result set (legends, file contents).
    #[arg(long, default_value = "cleave")]
    pub label: String,
}

/// Overlay of sweep results.
#[derive(Debug, Clone, Args)]
pub struct ChartArgs {
    /// A sweep directory (holding sweep.json), or benchmark result JSON (vLLM's or cleave-bench's
    /// --save-result: a file, or a directory of them, one point each); repeat for several sets.
    #[arg(long, required = true)]
    pub input: Vec<PathBuf>,
    /// Legend label for each --input, in order (default: the label stored in each set).
    #[arg(long)]
    pub label: Vec<String>,
    /// Output path without extension; .png and .svg are written.
    #[arg(long, default_value = "sweep-chart")]
    pub output: PathBuf,
    /// Chart title.
    #[arg(long)]
    pub title: Option<String>,
}

/// The mixed scenario.
#[derive(Debug, Clone, Args)]
pub struct MixedArgs {
    /// Server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Background streams kept in flight.
    #[arg(long, default_value_t = 4)]
    pub background_concurrency: usize,
    /// Prompt tokens of each background request.
    #[arg(long, default_value_t = 64)]
    pub background_input_len: usize,
    /// Output tokens of each background request (long reasoning).
    #[arg(long, default_value_t = 1024)]
    pub background_output_len: usize,
    /// Prompt tokens of each periodic long prompt.
    #[arg(long, default_value_t = 4096)]
    pub long_input_len: usize,
    /// Output tokens of each long prompt.
    #[arg(long, default_value_t = 16)]
    pub long_output_len: usize,
    /// Seconds between long prompts.
    #[arg(long, default_value_t = 5.0)]
    pub long_interval: f64,
    /// Number of long prompts (the run lasts about num_long * long_interval seconds).
    #[arg(long, default_value_t = 6)]
    pub num_long: usize,
    /// Seconds of background only before the first long prompt.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Draw random token ids from LO:HI (exclusive) instead of a built-in corpus.
    #[arg(long, value_parser = parse_range)]
    pub token_id_range: Option<(u32, u32)>,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Percentiles to report besides the median, comma-separated.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// Write the result JSON here.
    #[arg(long)]
    pub save_result: Option<PathBuf>,
    /// A label stored in the result.
    #[arg(long)]
    pub label: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

/// The batch prompt sender.
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// Server (chat completions are used whatever --endpoint says).
    #[command(flatten)]
    pub server: ServerArgs,
    /// JSON list of {"tag", "prompt", optional "system"}.
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the JSON list of {"tag", "reasoning", "content", "finish_reason", "usage", "error"}.
    #[arg(long)]
    pub output: PathBuf,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub max_concurrency: usize,
    /// max_completion_tokens of each request.
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}
