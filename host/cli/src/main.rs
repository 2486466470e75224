//! The `linkbus` binary: parses arguments, sets up logging, runs the command.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::process::ExitCode;

use clap::Parser;
mod bench;
mod cli;
mod demo;

use cli::{Cli, Command, ConfigCommand, NodeCommand};
use tracing_subscriber::EnvFilter;
// Registers the `wasm` filter plugin (`inventory` needs the crate referenced to keep it).
use linkbus_filter_wasm as _;

/// Perf (OPT-35, LEV-21): a message's boxed content is freed on another runtime worker than
/// the one that made it, which mimalloc does without a lock and glibc's allocator does not.
/// A program embedding `linkbus-host` sets its own global allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Cli::parse();
    let default_level = match args.command {
        Command::Node(_) => "info",
        // Its nodes use plaintext links on purpose (and say so loudly at `warn`).
        Command::Bench(_) => "error",
        // What the filter logs (`linkbus.log`) is part of what `filter test` shows.
        Command::Filter(_) => "warn,linkbus_filter_wasm=info",
        _ => "warn",
    };
    let filter = args.log.as_deref().map_or_else(|| EnvFilter::new(default_level), EnvFilter::new);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    if let Command::Config(ConfigCommand::Check { files }) = &args.command {
        return cli::config_check(files);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match args.command {
            Command::Node(NodeCommand::Run(run)) => cli::node_run(run).await,
            Command::Put(put) => cli::put(put).await,
            Command::Get(get) => cli::get(get).await,
            Command::Status(target) => cli::status(target).await,
            Command::Link(command) => cli::link(command).await,
            Command::Route(command) => cli::route(command).await,
            Command::Reload(target) => cli::reload(target).await,
            Command::Queue(command) => cli::queue(command).await,
            Command::Dlq(command) => cli::dlq(command).await,
            Command::Events(args) => cli::events(args).await,
            Command::Result(args) => cli::result(args).await,
            Command::File(command) => cli::file::run(command).await,
            Command::Demo(demo) => cli::demo(demo).await,
            Command::Bench(args) => cli::bench(args).await,
            Command::Keygen(args) => cli::keygen(&args),
            Command::Zstd(command) => cli::zstd(command),
            Command::Filter(command) => cli::filter(command),
            Command::Plugins(args) => cli::plugins(args).await,
            Command::Config(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
