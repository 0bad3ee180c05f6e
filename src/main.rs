//! `cleave`: serve DeepSeek-V3/R1-class models with disaggregated prefill and decode.

mod gen_checkpoint;
mod gen_tokenizer;
mod generate;
mod kernels_check;
mod logging;
mod model_dir;
mod parallel_args;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cleave", version, about = "Disaggregated prefill/decode serving for DeepSeek-V3/R1-class models")]
struct Cli {
    /// Log lines as text or as one JSON object per line (on stderr; RUST_LOG sets the level).
    #[arg(long, value_enum, global = true, default_value = "text")]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate from one prompt on one rank and print the result.
    Generate(generate::Args),
    /// Check every CUDA kernel against the CPU backend, the golden checkpoints end to end, and
    /// benchmark (exits 0 with a message when no GPU is present).
    KernelsCheck(kernels_check::Args),
    /// Write a random-weight checkpoint at a real model shape (performance work).
    GenCheckpoint(gen_checkpoint::Args),
    /// Serve a deployment behind the OpenAI-compatible HTTP API.
    Serve(serve::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::KernelsCheck(args) => kernels_check::run(args),
        Command::GenCheckpoint(args) => gen_checkpoint::run(args),
        Command::Serve(args) => serve::run(args),
    }
}
