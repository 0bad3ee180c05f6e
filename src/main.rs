//! `cleave`: serve DeepSeek-V3/R1-class models with disaggregated prefill and decode.

mod generate;
mod model_dir;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cleave", version, about = "Disaggregated prefill/decode serving for DeepSeek-V3/R1-class models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate from one prompt on one rank and print the result.
    Generate(generate::Args),
    /// Serve a deployment behind the OpenAI-compatible HTTP API.
    Serve(serve::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => serve::run(args),
    }
}
