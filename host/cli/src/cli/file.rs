//! `linkbus file`: send a file from a node's files directory, list the transfers under way.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use linkbus_client::{Client, FileDirection, SendFile};
use linkbus_plugin_api::MessageId;

use super::{Target, parse_duration};

/// `linkbus file`.
#[derive(Debug, Subcommand)]
pub(crate) enum FileCommand {
    /// Send a file from the node's files directory to queues (their nodes write it into
    /// their own files directory); shows the progress, and exits with each recipient's
    /// result.
    Send(SendArgs),
    /// List the file transfers under way at a node, both ways, with their progress.
    Ls(Target),
}

/// `linkbus file send`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// Which node sends it.
    #[command(flatten)]
    pub target: Target,
    /// Recipient queue as NODE:QUEUE; repeatable.
    #[arg(long = "to", required = true, value_name = "NODE:QUEUE")]
    pub to: Vec<String>,
    /// The file, relative to the node's files directory (quote names with spaces).
    pub file: String,
    /// The name it takes at the recipients (default: the same).
    #[arg(long = "as", value_name = "NAME")]
    pub name: Option<String>,
    /// Priority level of its chunks, 0..=9.
    #[arg(long, default_value_t = 4)]
    pub priority: u8,
    /// Lifetime of the whole transfer, like `30s`, `2h` (default: the node's).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Remove the file once every recipient confirmed it has all of it.
    #[arg(long)]
    pub delete_after: bool,
    /// How long to wait for the results (0: print the transfer's id and return).
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub wait: Duration,
}

/// Runs `linkbus file`.
///
/// # Errors
/// A refused send, a failed recipient, a connection failure.
pub(crate) async fn run(command: FileCommand) -> anyhow::Result<()> {
    match command {
        FileCommand::Send(args) => send(args).await,
        FileCommand::Ls(target) => ls(&mut target.connect().await?).await,
    }
}

async fn send(args: SendArgs) -> anyhow::Result<()> {
    let mut client = args.target.connect().await?;
    let request = SendFile {
        source: args.file.clone(),
        name: args.name,
        to: args.to,
        priority: args.priority,
        lifetime_ms: args.ttl.map(|t| t.as_millis() as u64),
        delete_after: args.delete_after,
    };
    let id = client.send_file(request).await?;
    if args.wait.is_zero() {
        println!("{id}");
        return Ok(());
    }
    let bar = progress_bar(&args.file);
    let deadline = tokio::time::Instant::now() + args.wait;
    loop {
        let results = client.results(std::slice::from_ref(&id), Duration::from_millis(200)).await?;
        let settled = results
            .first()
            .and_then(Option::as_ref)
            .is_none_or(|r| r.recipients.iter().all(|(_, o)| o.is_some()));
        if settled || tokio::time::Instant::now() >= deadline {
            break;
        }
        show_progress(&mut client, &id, &bar).await?;
    }
    bar.finish_and_clear();
    super::put::print_results(&mut client, std::slice::from_ref(&id), Duration::ZERO).await
}

fn progress_bar(file: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let style =
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(file.to_owned());
    bar
}

/// Shows the slowest recipient's confirmed bytes.
async fn show_progress(client: &mut Client, id: &MessageId, bar: &ProgressBar) -> anyhow::Result<()> {
    let all = client.file_transfers().await?;
    let mine: Vec<_> = all.iter().filter(|t| &t.id == id && t.direction == FileDirection::Out).collect();
    if let Some(size) = mine.first().map(|t| t.size) {
        bar.set_length(size);
        bar.set_position(mine.iter().map(|t| t.done_bytes).min().unwrap_or(0));
        if let Some(note) = mine.iter().find(|t| !t.note.is_empty()).map(|t| &t.note) {
            bar.set_message(note.clone());
        }
    }
    Ok(())
}

async fn ls(client: &mut Client) -> anyhow::Result<()> {
    let all = client.file_transfers().await?;
    let mut out = std::io::stdout().lock();
    if all.is_empty() {
        writeln!(out, "no file transfers under way")?;
        return Ok(());
    }
    writeln!(out, "{:<4} {:<24} {:<24} {:>14} {:>6}  NAME", "WAY", "ID", "PEER", "BYTES", "DONE")?;
    for t in &all {
        let way = if t.direction == FileDirection::Out { "out" } else { "in" };
        let percent = if t.size == 0 { 100.0 } else { t.done_bytes as f64 * 100.0 / t.size as f64 };
        let note = if t.note.is_empty() { String::new() } else { format!("  ({})", t.note) };
        writeln!(
            out,
            "{way:<4} {:<24} {:<24} {:>14} {percent:>5.1}%  {}{note}",
            t.id.to_string(),
            t.peer,
            t.size,
            t.name
        )?;
    }
    Ok(())
}
