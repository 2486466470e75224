//! `linkbus bench`: its arguments and the run.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

/// `linkbus bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The workloads to run (w1, w2, w3, w4, w5, w6, w7); all when none is named.
    #[arg(value_parser = ["w1", "w2", "w3", "w4", "w5", "w6", "w7"])]
    pub workloads: Vec<String>,
    /// Print the rows as JSON (after the table).
    #[arg(long)]
    pub json: bool,
    /// A hundredth of the messages and 0.2 s timed cases: shows that everything runs, not
    /// how fast.
    #[arg(long)]
    pub quick: bool,
    /// Only the cases of this payload size in bytes (w1: 64, 1024, 65536, 1048576; w4: 1024;
    /// w5: 1024, 65536; the others have one size and ignore it); for profiling one case.
    #[arg(long, value_parser = parse_bench_size)]
    pub size: Option<usize>,
    /// Runs each throughput case (w1, w4, w5, w6) this many times, its baseline in every round
    /// too, and reports the medians with the spread (this machine may be noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=50))]
    pub rounds: u16,
    /// A native store library `w2` runs on too, one row per store it offers (by default
    /// `liblinkbus_store_sqlite.so` beside this binary, when there: `cargo build --release
    /// -p linkbus-store-sqlite` puts it there).
    #[arg(long, value_name = "LIBRARY")]
    pub store_library: Option<PathBuf>,
}

/// Checks a `linkbus bench --size`: one of the sizes the workloads have cases of.
///
/// # Errors
/// The sizes there are, when `text` is not one of them.
fn parse_bench_size(text: &str) -> Result<usize, String> {
    let sizes = crate::bench::W1_SIZES;
    text.parse::<usize>().ok().filter(|size| sizes.contains(size)).ok_or_else(|| {
        let list: Vec<String> = sizes.iter().map(ToString::to_string).collect();
        format!("no workload has cases of {text} bytes; the sizes are {}", list.join(", "))
    })
}

/// Runs `linkbus bench`.
///
/// # Errors
/// A node or client failure, or a delivery that lost, damaged or duplicated a message.
pub(crate) async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let mut scale = if args.quick { crate::bench::Scale::QUICK } else { crate::bench::Scale::FULL };
    scale.only_size = args.size;
    scale.rounds = usize::from(args.rounds);
    println!(
        "linkbus bench: nodes in this process on 127.0.0.1, fjall stores in a temporary directory; {} cores",
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    );
    let library = args.store_library.or_else(crate::bench::sqlite_beside_this_binary);
    let rows = crate::bench::run(&args.workloads, scale, library.as_deref(), true).await?;
    if let (Some(size), true) = (args.size, rows.is_empty()) {
        bail!("none of the named workloads has a case of {size} bytes (w4 has 1024; w5 1024 and 65536)");
    }
    if args.json {
        println!("{}", crate::bench::to_json(&rows));
    }
    Ok(())
}
