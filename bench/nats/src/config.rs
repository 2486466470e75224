//! The command line: which workloads to run, at which scale, and how to print them.

use std::path::PathBuf;
use std::time::Duration;

/// Shown on a bad argument and for `--help`.
pub(crate) const USAGE: &str = "usage: linkbus-nats-baseline [core] [reqrep] [jetstream] \
[--quick] [--json] [--server-bin PATH]
  no workload names: run all three
  --quick             divide message counts and durations by 10 (a smoke run)
  --json              print a JSON array instead of a table
  --server-bin PATH   the nats-server binary (default: nats-server on PATH)";

/// One workload, named as on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// Core pub/sub throughput.
    Core,
    /// Request/reply latency.
    Reqrep,
    /// JetStream publish throughput.
    Jetstream,
}

/// Divides the default counts and durations, so that `--quick` stays a smoke run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    /// 1 for a full run, 10 for `--quick`.
    divisor: u32,
}

impl Scale {
    /// A default message count at this scale.
    pub(crate) fn count(&self, count: u64) -> u64 {
        (count / u64::from(self.divisor)).max(1)
    }

    /// A default duration at this scale.
    pub(crate) fn duration(&self, duration: Duration) -> Duration {
        duration / self.divisor
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub(crate) struct Config {
    /// In the order given, without repeats; all three when none was named.
    pub(crate) workloads: Vec<Workload>,
    /// Set by `--quick`; also printed, so a smoke figure is never taken for a real one.
    pub(crate) quick: bool,
    /// Counts and durations for every workload.
    pub(crate) scale: Scale,
    /// Print JSON instead of the table.
    pub(crate) json: bool,
    /// The server to start; a bare name is looked up on PATH.
    pub(crate) server_bin: PathBuf,
}

impl Config {
    /// Parses the arguments after the program name; the error is the message to print.
    pub(crate) fn from_args(args: impl IntoIterator<Item = String>) -> Result<Config, String> {
        let mut config = Config {
            workloads: Vec::new(),
            quick: false,
            scale: Scale { divisor: 1 },
            json: false,
            server_bin: PathBuf::from("nats-server"),
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let workload = match arg.as_str() {
                "core" => Workload::Core,
                "reqrep" => Workload::Reqrep,
                "jetstream" => Workload::Jetstream,
                "--quick" => {
                    config.quick = true;
                    config.scale = Scale { divisor: 10 };
                    continue;
                }
                "--json" => {
                    config.json = true;
                    continue;
                }
                "--server-bin" => {
                    let path = args.next().ok_or("--server-bin needs a path")?;
                    config.server_bin = PathBuf::from(path);
                    continue;
                }
                other => return Err(format!("unknown argument: {other}")),
            };
            if !config.workloads.contains(&workload) {
                config.workloads.push(workload);
            }
        }
        if config.workloads.is_empty() {
            config.workloads = vec![Workload::Core, Workload::Reqrep, Workload::Jetstream];
        }
        Ok(config)
    }
}
