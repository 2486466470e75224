//! `linkbus-nats-baseline`: measures NATS on this machine, as the baseline that
//! `linkbus bench` figures are compared against. Every workload gets its own
//! `nats-server` on 127.0.0.1 with a fresh JetStream store.
//!
//! Modules, one line each:
//! - `config`: the command line (workload names, `--quick`, `--json`, `--server-bin`).
//! - `server`: starts `nats-server` and kills it when dropped.
//! - `payload`: makes each payload from its index and checks it where it arrives.
//! - `latency`: percentiles of measured durations.
//! - `pubsub`: NATS core pub/sub throughput (workload `core`).
//! - `reqrep`: request/reply round-trip latency.
//! - `jetstream`: JetStream publish throughput, windowed and 16 publishers.
//! - `report`: result rows, printed as a table or as JSON.

mod config;
mod jetstream;
mod latency;
mod payload;
mod pubsub;
mod report;
mod reqrep;
mod server;

use std::process::ExitCode;

use config::{Config, Workload};
use report::Row;
use server::Server;

/// Every fallible step returns this; the tool only prints it.
type Error = async_nats::Error;

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|arg| arg == "-h" || arg == "--help") {
        println!("{}", config::USAGE);
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_args(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}\n\n{}", config::USAGE);
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&config)) {
        Ok(rows) if config.json => println!("{}", report::to_json(&rows)),
        Ok(rows) => print!("{}", report::to_table(&rows)),
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Runs the chosen workloads in turn, each against a server of its own.
async fn run(config: &Config) -> Result<Vec<Row>, Error> {
    let version = server::version(&config.server_bin)?;
    eprintln!("{version}, 127.0.0.1, {} run", if config.quick { "quick" } else { "full" });
    let mut rows = Vec::new();
    for workload in &config.workloads {
        let server = Server::start(&config.server_bin).await?;
        let measured = match workload {
            Workload::Core => pubsub::measure(server.url(), &config.scale).await?,
            Workload::Reqrep => reqrep::measure(server.url(), &config.scale).await?,
            Workload::Jetstream => jetstream::measure(server.url(), &config.scale).await?,
        };
        rows.extend(measured);
    }
    Ok(rows)
}
