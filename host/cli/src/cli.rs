//! The `linkbus` command line: argument definitions and what each command does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use linkbus_plugin_api::{Address, MessageId};

use linkbus_client::Client;
use linkbus_client::protocol::GetGroups;
use linkbus_host::config::{self, Overrides};

mod bench;
mod dlq;
mod events;
pub(crate) mod file;
mod filter;
mod keys;
mod put;
pub(crate) use bench::{BenchArgs, bench};
pub(crate) use dlq::dlq;
pub(crate) use events::events;
pub(crate) use filter::{FilterCommand, filter};
pub(crate) use keys::{keygen, zstd};
pub(crate) use put::put;

/// linkbus: a multi-node message bus with permanent links and exactly-once delivery.
#[derive(Debug, Parser)]
#[command(name = "linkbus", version, about)]
pub(crate) struct Cli {
    /// Log filter (`error`, `warn`, `info`, `debug`, or a tracing filter); also `LINKBUS_LOG`.
    #[arg(long, global = true, env = "LINKBUS_LOG")]
    pub log: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run and manage nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Send a message (or each line of standard input) through a local node.
    Put(PutArgs),
    /// Send files from a node's files directory; list the transfers under way.
    #[command(subcommand)]
    File(file::FileCommand),
    /// Take messages from a queue of a local node and print one per line.
    Get(GetArgs),
    /// Show a local node's links and queues.
    Status(Target),
    /// Manage a local node's links.
    #[command(subcommand)]
    Link(LinkCommand),
    /// Ask a local node how it routes messages.
    #[command(subcommand)]
    Route(RouteCommand),
    /// Make a local node read its configuration file again and take up its routes (also
    /// SIGHUP); a bad file is refused and the running configuration stays.
    Reload(Target),
    /// Look at a local node's queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Look at and replay a local node's dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Take and print the events of a local node (its `EVENT` queue), one per line.
    Events(EventsArgs),
    /// Print what became of messages put with `--results`: one line per recipient.
    Result(ResultArgs),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run three nodes in this process and send messages from A to C through the relay B.
    Demo(DemoArgs),
    /// Measure named workloads against their baselines, side by side, with nodes in this
    /// process: w1 (two nodes against raw TCP), w2 (persistent puts against a sync each),
    /// w3 (ping-pong latency against raw TCP), w4 (a relay against w1), w5 (Noise against
    /// plaintext), w6 (a 1 GiB file against a socket copy), w7 (urgent latency while the
    /// link is saturated).
    Bench(BenchArgs),
    /// Make a node key (prints its public half), a cluster pre-shared key, or a payload key.
    Keygen(KeygenArgs),
    /// Work with zstd compression dictionaries.
    #[command(subcommand)]
    Zstd(ZstdCommand),
    /// Work with WebAssembly filters.
    #[command(subcommand)]
    Filter(FilterCommand),
    /// List plugins: a running node's (`--node`), a configuration's (`--config`, loading
    /// the native libraries it names), or this build's own; with each one's version, origin
    /// (built in, or a library's or module's path and SHA-256) and whether it is used.
    Plugins(PluginsArgs),
}

/// `linkbus plugins`.
#[derive(Debug, Args)]
pub(crate) struct PluginsArgs {
    /// A running node's name, found in the runtime directory (`LINKBUS_RUNTIME_DIR`).
    #[arg(long, conflicts_with_all = ["socket", "config"])]
    pub node: Option<String>,
    /// A running node's client socket, instead of a name.
    #[arg(long, conflicts_with = "config")]
    pub socket: Option<PathBuf>,
    /// A configuration file: what a node started from it would load.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `linkbus zstd ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ZstdCommand {
    /// Train a dictionary from sample messages (each file one sample, or each line with
    /// `--lines`); prints its id. Name it in the zstd stage's `dictionaries` on both ends.
    Train {
        /// Where to write the dictionary (an existing file is never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Largest dictionary, in bytes.
        #[arg(long, default_value_t = 16 * 1024)]
        size: usize,
        /// Take each line of each file as one sample (JSON lines, logs).
        #[arg(long)]
        lines: bool,
        /// The sample files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// `linkbus node ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum NodeCommand {
    /// Run a node in the foreground until Ctrl-C or SIGTERM.
    Run(RunArgs),
}

/// `linkbus node run`: a config file and/or flags (flags win).
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The node's YAML configuration file.
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Node name (overrides `node.name`).
    #[arg(long)]
    pub name: Option<String>,
    /// Link listen address, or `none` (overrides `node.listen`).
    #[arg(long)]
    pub listen: Option<String>,
    /// A peer as NAME=ADDRESS, or NAME alone for a peer that dials in; repeatable.
    #[arg(long = "peer", value_name = "NAME=ADDRESS")]
    pub peers: Vec<String>,
    /// A local queue as NAME, NAME:fifo or NAME:priority; repeatable.
    #[arg(long = "queue", value_name = "NAME[:ORDER]")]
    pub queues: Vec<String>,
    /// A static route as PATTERN=VIA: nodes matching PATTERN ('?' any one character, a
    /// final '*' any rest) are reached through neighbour VIA; repeatable, after the file's.
    #[arg(long = "route", value_name = "PATTERN=VIA")]
    pub routes: Vec<String>,
    /// Data directory (overrides `node.data_dir`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Directory files are sent from and received into (overrides `node.files_dir`).
    #[arg(long)]
    pub files_dir: Option<PathBuf>,
    /// Client socket path (overrides `node.client_socket`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Plaintext links, no authentication (tests and benchmarks only; logged loudly).
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// This node's private key file (overrides `security.key_file`).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The cluster's pre-shared key file (overrides `security.psk_file`).
    #[arg(long)]
    pub psk_file: Option<PathBuf>,
}

/// `linkbus queue ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// One line per queue: order, depth, pending, limit, age of the oldest message.
    Ls {
        /// Which node.
        #[command(flatten)]
        target: Target,
    },
    /// One queue in detail, with its depth per priority.
    Stat {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// The queue.
        name: String,
    },
}

/// `linkbus events`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct EventsArgs {
    /// Which node.
    #[command(flatten)]
    pub target: Target,
    /// Keep waiting for new events until interrupted.
    #[arg(long)]
    pub follow: bool,
    /// Take the events (acknowledged once printed) instead of reading copies: they leave
    /// the queue, so nobody else sees them.
    #[arg(long)]
    pub take: bool,
    /// Manage subscriptions instead.
    #[command(subcommand)]
    pub command: Option<EventsCommand>,
}

/// `linkbus events ...`: subscriptions copy chosen kinds of events to a queue.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Copy events of some kinds to a queue, here or on a peer (replaces the kinds of an
    /// earlier subscription of that queue made this way).
    Subscribe {
        /// Which node raises the events.
        #[command(flatten)]
        target: Target,
        /// Event kinds, comma-separated (link_up, link_down, link_stopped, expired,
        /// dead_letter, queue_full, result, file_received), or `all`.
        #[arg(long, value_delimiter = ',', required = true)]
        kinds: Vec<String>,
        /// The queue that gets the copies, as NODE:QUEUE.
        #[arg(long)]
        to: Address,
    },
    /// End a subscription made with `subscribe`.
    Unsubscribe {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// The subscribed queue, as NODE:QUEUE.
        #[arg(long)]
        to: Address,
    },
    /// List the subscriptions in force (from the configuration and from `subscribe`).
    Ls {
        /// Which node.
        #[command(flatten)]
        target: Target,
    },
}

/// `linkbus result`.
#[derive(Debug, Args)]
pub(crate) struct ResultArgs {
    /// Which node (the one that accepted the messages).
    #[command(flatten)]
    pub target: Target,
    /// Wait up to this long for every final result, e.g. `30s` (default: answer at once).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// Message ids as printed by `linkbus put` (`NODE/SEQUENCE`).
    #[arg(required = true, value_parser = linkbus_host::results::parse_id)]
    pub ids: Vec<MessageId>,
}

/// `linkbus dlq ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters without taking them: id, reason code, recipients, size, reason.
    Ls {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// Most messages to list.
        #[arg(long, default_value_t = 100)]
        count: u32,
    },
    /// Put dead letters again to their recipients (as new messages of this node); those
    /// that fail again stay in the dead-letter queue.
    Replay {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// Most messages to replay.
        #[arg(long, default_value_t = 1000)]
        count: u32,
    },
}

/// `linkbus link ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LinkCommand {
    /// Accept a peer's sequence numbers after they went backwards (its data was wiped or
    /// restored), restarting the link the node stopped because of it.
    Reset {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// The peer whose link to reset.
        #[arg(value_parser = parse_node_name)]
        peer: String,
    },
}

/// `linkbus route ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum RouteCommand {
    /// Print how a message to each destination node would leave the node: the rule that
    /// matched, the next hop, and why the other candidates lost.
    Explain {
        /// Which node.
        #[command(flatten)]
        target: Target,
        /// The destination nodes.
        #[arg(required = true, value_parser = parse_node_name)]
        destinations: Vec<String>,
    },
}

/// `linkbus keygen`.
#[derive(Debug, Args)]
pub(crate) struct KeygenArgs {
    /// Where to write the key (mode 0600; an existing file is never overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Write a cluster pre-shared key instead of a node key pair.
    #[arg(long, conflicts_with = "payload")]
    pub psk: bool,
    /// Write a payload key (end-to-end encryption, the `chacha20poly1305` stage) and print
    /// its id; give the file to the origin and to every destination that opens its messages.
    #[arg(long)]
    pub payload: bool,
}

/// Which local node a client command talks to.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The node's name, found in the runtime directory (`LINKBUS_RUNTIME_DIR`).
    #[arg(long, required_unless_present = "socket")]
    pub node: Option<String>,
    /// The node's client socket, instead of a name.
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// `linkbus put`.
#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    /// Which node accepts the message.
    #[command(flatten)]
    pub target: Target,
    /// Recipient as NODE:QUEUE; repeat for a recipient list.
    #[arg(long = "to", required = true, value_name = "NODE:QUEUE")]
    pub to: Vec<Address>,
    /// Priority 0..=9 (higher first).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: u8,
    /// Lifetime, e.g. `30s`, `5m`, `2h` (default: the node's `messages.lifetime_default_s`).
    #[arg(long, value_parser = parse_duration, conflicts_with = "ttl")]
    pub lifetime: Option<Duration>,
    /// Lifetime in seconds (the same as `--lifetime Ns`).
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,
    /// Persistent (LOG_ON): synced to the node's store before the put returns (durable with
    /// a durable store).
    #[arg(long, conflicts_with = "volatile")]
    pub persistent: bool,
    /// Volatile: kept in memory only. With neither flag, a message is persistent when a
    /// queue of the accepting node among its recipients is persistent by default, else
    /// volatile.
    #[arg(long)]
    pub volatile: bool,
    /// No-wait put: fail at once when a queue is full; refused for persistent messages.
    #[arg(long, conflicts_with_all = ["timeout", "transaction"])]
    pub no_wait: bool,
    /// Put all the messages (every line of standard input) in one transaction: all are
    /// queued, or none (at most 10,000 messages and 64 MiB).
    #[arg(long)]
    pub transaction: bool,
    /// Put the messages as one message group with this id: line N is member N (from 0), the
    /// last line closes the group. Recipients hold the members until all have come.
    #[arg(long, value_name = "ID")]
    pub group: Option<String>,
    /// Ask for a result per recipient (delivered, expired, failed): see them with
    /// `linkbus result ID` or as `result` events.
    #[arg(long)]
    pub results: bool,
    /// Ask for results and wait up to this long for them, e.g. `30s`; prints one line per
    /// recipient and fails unless every recipient got the message.
    #[arg(long, value_parser = parse_duration, value_name = "TIMEOUT")]
    pub wait_result: Option<Duration>,
    /// Message name (a user label).
    #[arg(long = "name", default_value = "")]
    pub label: String,
    /// A header as KEY=VALUE; repeatable.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// How long to wait for room when the destination queue is full (0s: fail at once).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// The payload, or `-` to send each line of standard input as one message.
    pub message: String,
}

/// `linkbus get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    /// Which node holds the queue.
    #[command(flatten)]
    pub target: Target,
    /// The queue.
    pub queue: String,
    /// How many messages to take.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// How long to wait for them, e.g. `5s` (default: do not wait).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// Largest message (encoded, in bytes) to take: a larger one at the head fails the get
    /// with its size and stays in the queue.
    #[arg(long, default_value_t = u64::MAX, hide_default_value = true)]
    pub max_bytes: u64,
    /// After each payload, a tab and the message's headers as `KEY=VALUE`, separated by
    /// `; ` (the node's own `linkbus.*` headers left out).
    #[arg(long)]
    pub headers: bool,
    /// Take whole message groups (`--count` of them), each only once all its members have
    /// arrived, members in index order; messages outside groups stay.
    #[arg(long, conflicts_with = "members")]
    pub group: bool,
    /// Take members of groups still arriving too, one by one in index order (acknowledged
    /// as they are taken). Without it, a group's members wait until the group is complete.
    #[arg(long)]
    pub members: bool,
}

/// `linkbus config ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate configuration files, reporting every error with its YAML path.
    Check {
        /// The files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// `linkbus demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How many messages A sends to C (through B).
    #[arg(long, default_value_t = 10_000)]
    pub messages: usize,
    /// Payload bytes per message (at least 11).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
}

/// Checks a node name.
///
/// # Errors
/// The naming rule the text breaks.
fn parse_node_name(text: &str) -> Result<String, String> {
    linkbus_plugin_api::NodeName::new(text).map(|n| n.to_string()).map_err(|e| e.to_string())
}

/// Parses `500ms`, `5s`, `2m`, `1h`, or a bare number of seconds.
///
/// # Errors
/// A message naming the accepted forms.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("'{text}' is not a duration like 500ms, 5s, 2m or 1h"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit '{unit}' in '{text}'; use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{text}': {e}"))
}

impl Target {
    fn socket_path(&self) -> PathBuf {
        match (&self.socket, &self.node) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => linkbus_client::runtime_dir::socket_for(name),
            (None, None) => linkbus_client::runtime_dir::socket_for("A"),
        }
    }

    async fn connect(&self) -> anyhow::Result<Client> {
        let path = self.socket_path();
        Client::connect(&path).await.with_context(|| match &self.node {
            Some(name) => format!(
                "is node {name} running? (runtime directory {})",
                linkbus_client::runtime_dir::runtime_dir().display()
            ),
            None => "is the node running?".to_owned(),
        })
    }
}

/// Runs `linkbus node run`.
///
/// # Errors
/// Configuration errors (all of them), or a node that fails to start.
pub(crate) async fn node_run(args: RunArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        name: args.name,
        listen: args.listen,
        peers: args.peers,
        queues: args.queues,
        routes: args.routes,
        data_dir: args.data_dir,
        files_dir: args.files_dir,
        client_socket: args.socket,
        insecure_plaintext: args.insecure_plaintext,
        key_file: args.key_file,
        psk_file: args.psk_file,
    };
    let config = config::load_file(args.config.as_deref(), &overrides)?;
    let source = linkbus_host::node::ReloadSource { path: args.config, overrides };
    linkbus_host::run_reloadable(config, source, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        () = term => {}
    }
}

/// Runs `linkbus result`.
///
/// # Errors
/// A connection failure, ids from another node, or a recipient that did not get its message.
pub(crate) async fn result(args: ResultArgs) -> anyhow::Result<()> {
    let mut client = args.target.connect().await?;
    put::print_results(&mut client, &args.ids, args.wait).await
}

/// Runs `linkbus get`; fails when fewer than `--count` messages arrived within `--wait`.
///
/// # Errors
/// An unknown queue, a connection failure, or too few messages.
pub(crate) async fn get(args: GetArgs) -> anyhow::Result<()> {
    let mut client = args.target.connect().await?;
    let deadline = tokio::time::Instant::now() + args.wait;
    let mut got = 0u32;
    let mut out = std::io::stdout().lock();
    let groups = match (args.group, args.members) {
        (true, _) => GetGroups::Whole,
        (_, true) => GetGroups::Members,
        _ => GetGroups::Complete,
    };
    while got < args.count {
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        // Pending, and acknowledged only once written out: a get killed halfway loses
        // nothing (the node gives unacknowledged messages back when the connection ends).
        // (The node hands a group out pending to its last member, so each batch is
        // acknowledged whole; members taken one by one are acknowledged at once: the rest
        // of their group may be long in coming.)
        let want = args.count - got;
        let deliveries = if args.members {
            let messages = client.get_members(&args.queue, want, wait).await?;
            messages.into_iter().map(|message| linkbus_client::Delivery { tag: 0, message }).collect()
        } else {
            client.get_pending_with(&args.queue, want, wait, args.max_bytes, groups).await?
        };
        if deliveries.is_empty() {
            break;
        }
        got += if args.group { 1 } else { u32::try_from(deliveries.len()).unwrap_or(u32::MAX) };
        let mut tags = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            write_delivery(&mut out, &d.message, args.headers)?;
            tags.push(d.tag);
        }
        out.flush()?;
        if !args.members {
            client.ack(&args.queue, &tags).await?;
        }
    }
    out.flush()?;
    if got < args.count {
        let what = if args.group { "groups" } else { "messages" };
        bail!("{got} of {} {what} arrived within {:?}", args.count, args.wait);
    }
    Ok(())
}

/// Writes a message's payload (and with `headers`, a tab and its user headers) as a line.
fn write_delivery(
    out: &mut impl Write,
    message: &linkbus_plugin_api::Message,
    headers: bool,
) -> std::io::Result<()> {
    out.write_all(&message.content.payload)?;
    if headers {
        let headers: Vec<String> = (message.content.headers.iter())
            .filter(|(k, _)| !k.starts_with("linkbus."))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(out, "\t{}", headers.join("; "))?;
    }
    out.write_all(b"\n")
}

/// Runs `linkbus status`.
///
/// # Errors
/// A connection failure.
pub(crate) async fn status(target: Target) -> anyhow::Result<()> {
    print!("{}", target.connect().await?.status().await?);
    Ok(())
}

/// Runs `linkbus queue ...`.
///
/// # Errors
/// When the node cannot be reached or has no such queue.
pub(crate) async fn queue(command: QueueCommand) -> anyhow::Result<()> {
    let (target, name) = match command {
        QueueCommand::Ls { target } => (target, String::new()),
        QueueCommand::Stat { target, name } => (target, name),
    };
    print!("{}", target.connect().await?.queues(&name).await?);
    Ok(())
}

/// Runs `linkbus route ...`.
///
/// # Errors
/// When the node cannot be reached.
pub(crate) async fn route(command: RouteCommand) -> anyhow::Result<()> {
    match command {
        RouteCommand::Explain { target, destinations } => {
            let mut client = target.connect().await?;
            for destination in destinations {
                print!("{}", client.explain_route(&destination).await?);
            }
        }
    }
    Ok(())
}

/// Runs `linkbus plugins`.
///
/// # Errors
/// When the node cannot be reached, or the configuration or a library it names is bad.
pub(crate) async fn plugins(args: PluginsArgs) -> anyhow::Result<()> {
    if args.node.is_some() || args.socket.is_some() {
        let target = Target { node: args.node, socket: args.socket };
        print!("{}", target.connect().await?.plugins().await?);
        return Ok(());
    }
    let config = match &args.config {
        Some(file) => config::load_file(Some(file), &Overrides::default())?,
        // Defaults alone: this build's own plugins.
        None => config::from_value(&config::parse_yaml("node: { name: A }")?)?,
    };
    print!("{}", config::plugins_table(&config, &[]));
    Ok(())
}

/// Runs `linkbus reload`.
///
/// # Errors
/// When the node cannot be reached or refuses the new configuration.
pub(crate) async fn reload(target: Target) -> anyhow::Result<()> {
    print!("{}", target.connect().await?.reload().await?);
    Ok(())
}

/// Runs `linkbus link ...`.
///
/// # Errors
/// When the node cannot be reached or has no such link.
pub(crate) async fn link(command: LinkCommand) -> anyhow::Result<()> {
    match command {
        LinkCommand::Reset { target, peer } => print!("{}", target.connect().await?.reset_link(&peer).await?),
    }
    Ok(())
}

/// Reads a configuration file and the key files it names.
fn check_file(file: &Path) -> Result<config::Config, linkbus_plugin_api::ConfigErrors> {
    let config = config::load_file(Some(file), &Overrides::default())?;
    linkbus_host::security::Security::load(&config)?;
    Ok(config)
}

/// Runs `linkbus config check`: prints every file's errors, and with several files checks
/// them together as one cluster (links listed at both ends, no routing loop); fails if
/// anything is wrong.
pub(crate) fn config_check(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    let mut configs = Vec::new();
    for file in files {
        match check_file(file) {
            Ok(c) => {
                println!(
                    "{}: ok (node {}, {} peers, {} routes, {} queues)",
                    file.display(),
                    c.node.name,
                    c.peers.len(),
                    c.routes.len(),
                    c.queues.len()
                );
                configs.push(c);
            }
            Err(errors) => {
                failed = true;
                println!("{}: {errors}", file.display());
            }
        }
    }
    let mut names: Vec<&linkbus_plugin_api::NodeName> = configs.iter().map(|c| &c.node.name).collect();
    names.sort_unstable();
    let repeated = names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0].clone());
    if let Some(name) = repeated {
        println!(
            "cluster: not checked as one cluster: node {name} has more than one file (give one cluster's files)"
        );
    } else if configs.len() > 1 {
        let mut problems = linkbus_host::routing::check_cluster(&configs);
        problems.extend(linkbus_host::security::check_cluster_keys(&configs));
        for problem in &problems {
            println!("cluster: {problem}");
        }
        if problems.is_empty() {
            println!(
                "cluster: ok ({} nodes checked together: links listed at both ends with each other's keys, one cluster key, no routing loop)",
                configs.len()
            );
        }
        failed |= !problems.is_empty();
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Runs `linkbus demo`; succeeds only when every message arrived intact.
///
/// # Errors
/// A node or client failure, or any lost, damaged, duplicated or reordered message.
pub(crate) async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    println!(
        "linkbus demo: nodes A, B and C in one process, Noise-encrypted TCP links on 127.0.0.1, A reaching C through B by a static route, fjall stores in a temporary directory"
    );
    let report = crate::demo::run(args.messages, args.size).await?;
    println!("{report}");
    if !report.is_perfect() {
        bail!("the demo did not deliver every message intact exactly once and in order");
    }
    println!("result    ok: every message arrived intact, once, in order");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
