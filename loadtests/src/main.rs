//! `cleave-bench`: see the crate documentation and `cleave-bench --help`.

use anyhow::Result;
use clap::Parser;

use cleave_bench::cli::{Cli, Command};
use cleave_bench::{batch, bench, chart, mixed, multi_turn, soak, sweep};

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Chart(args)) = cli.command {
        return chart::main(args);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            None => bench::main(cli.bench).await,
            Some(Command::Sweep(a)) => sweep::main(a).await,
            Some(Command::Mixed(a)) => mixed::main(a).await,
            Some(Command::Batch(a)) => batch::main(a).await,
            Some(Command::Soak(a)) => soak::main(a).await,
            Some(Command::MultiTurn(a)) => multi_turn::main(a).await,
            Some(Command::Chart(_)) => unreachable!(),
        }
    })
}
