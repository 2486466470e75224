//! The node's configuration: one typed tree, read from one YAML file (plus command-line
//! overrides) by [`load_file`], with a default for every key.
//!
//! The fully commented `examples/config/node.yaml` shows every key with its default; a test
//! keeps it equal to [`Config::defaults_for`].

mod filters;
mod native;
mod read;

use std::path::PathBuf;

use linkbus_plugin_api::{ConfigValue, NodeName, QueueName, Reliability};
use linkbus_proto::secure::Cipher;

pub use filters::{DropPolicy, FILTER_KIND_DEFAULT, FailurePolicy, FilterChoice};
pub use native::plugins_table;
pub use read::{Overrides, apply_overrides, from_value, load_file, parse_yaml};

/// Bytes an encoded message may need beyond its payload: the largest envelope a message can
/// have (48 KiB name, 64 recipients, 64 headers of 4 KiB: about 330 KiB), rounded up. A link
/// accepts encoded messages of up to `messages.message_bytes_max` plus this.
pub const ENVELOPE_BYTES_MAX: u64 = 512 * 1024;

/// Default quotas of priority levels 0..=9: each level gets one more share than the one
/// below it.
pub const PRIORITY_QUOTAS_DEFAULT: [u64; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// Largest quota a level may have.
pub const QUOTA_MAX: u64 = 1000;

/// Bytes a frame needs beyond the packet it carries (header, channel, numbers, CRCs), rounded
/// up: `links.frame_bytes_max` must exceed `links.packet_bytes_max` by this.
pub const PACKET_OVERHEAD_BYTES: u64 = 64;

/// Everything a node needs to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Identity and local resources.
    pub node: NodeSettings,
    /// Neighbours this node keeps links to.
    pub peers: Vec<PeerConfig>,
    /// Static routes to nodes that are not neighbours, in the order written.
    pub routes: Vec<RouteConfig>,
    /// Local queues.
    pub queues: Vec<QueueConfig>,
    /// Defaults for messages accepted from clients.
    pub messages: MessageSettings,
    /// Link protocol limits and timers.
    pub links: LinkSettings,
    /// The plugin chosen for each extension point.
    pub plugins: PluginSettings,
    /// Link security.
    pub security: SecuritySettings,
    /// The `EVENT` queue and who gets copies of events.
    pub events: EventSettings,
    /// How repeated warnings are aggregated.
    pub log: LogSettings,
}

/// `log:` — repeated warnings (a refused connection, a dead letter) are logged one by one up
/// to `repeats_max` per reason and interval, then counted and summarised in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// Warnings of one reason logged one by one per interval.
    pub repeats_max: u64,
    /// The interval, in milliseconds.
    pub interval_ms: u64,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { repeats_max: 5, interval_ms: 10_000 }
    }
}

/// `events:` — the node's `EVENT` queue and subscriptions.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSettings {
    /// Most events the `EVENT` queue holds; when it is full the oldest are dropped (it is
    /// read as a log: `linkbus events` reads copies).
    pub queue_messages_max: u64,
    /// Queues that get a copy of chosen kinds of events.
    pub subscriptions: Vec<Subscription>,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self { queue_messages_max: 100_000, subscriptions: Vec::new() }
    }
}

/// One subscription: events of these kinds are copied to `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// The kinds.
    pub kinds: Vec<crate::events::EventKind>,
    /// The queue that gets them, on this node or another.
    pub to: linkbus_plugin_api::Address,
    /// Where it is declared (`events.subscriptions[2]`), for error messages.
    pub path: String,
}

/// `node:` — who this node is and where it keeps things.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// The node's name (required).
    pub name: NodeName,
    /// Address peers connect to; `None` when this node only dials out.
    pub listen: Option<String>,
    /// Unix socket for clients; `None` puts it in the runtime directory as `NAME.sock`.
    pub client_socket: Option<PathBuf>,
    /// Directory for the store and other state.
    pub data_dir: PathBuf,
    /// Directory files are sent from and received into (`node.files_dir`, TongLink/Q's
    /// FILESDIR); `None` is `files` in the data directory. See [`NodeSettings::files_dir`].
    pub files_dir: Option<PathBuf>,
    /// Free bytes the data directory's file system must keep: below it persistent messages
    /// are refused (puts, commits, deliveries from links) until a quarter more is free again;
    /// 0 turns the check off.
    pub data_free_bytes_min: u64,
}

/// `peers[]:` — one neighbour.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerConfig {
    /// Its node name.
    pub name: NodeName,
    /// Where to dial it; `None` when it always dials us.
    pub address: Option<String>,
    /// Keep the link up at all times, reconnecting with backoff.
    pub permanent: bool,
    /// Its static public key (Noise links); required unless links are plaintext.
    pub public_key: Option<[u8; 32]>,
}

/// `routes[]:` — destinations matching `to` go through neighbour `via`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// The destination pattern.
    pub to: linkbus_plugin_api::Pattern,
    /// The neighbour (a peer) they go through.
    pub via: NodeName,
}

/// `security:` — how links are protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecuritySettings {
    /// Plaintext links (no authentication, no encryption): tests and benchmarks only; a
    /// warning is logged at every start.
    pub insecure_plaintext: bool,
    /// This node's private key file; `None` means `node.key` in the data directory.
    pub key_file: Option<PathBuf>,
    /// The cluster's pre-shared key file; required for Noise links when there are peers.
    pub psk_file: Option<PathBuf>,
    /// How far ahead of this node's clock a peer's handshake may be stamped, in seconds
    /// (a stamp further ahead is refused, so a handshake recorded from a node with a wrong
    /// clock cannot be replayed later). Message lifetimes never compare clocks.
    pub clock_skew_max_s: u64,
    /// The cipher of the Noise links this node dials (`security.cipher`); `None` (`auto`)
    /// takes the faster on this CPU. A node answers a link in whichever cipher its dialer
    /// chose.
    pub cipher: Option<Cipher>,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        Self {
            insecure_plaintext: false,
            key_file: None,
            psk_file: None,
            clock_skew_max_s: 600,
            cipher: None,
        }
    }
}

/// Order in which a queue hands out messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// Strict arrival order.
    Fifo,
    /// Higher priority first, arrival order within a level (IBM MQ's default).
    #[default]
    Priority,
}

impl std::str::FromStr for QueueOrder {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fifo" => Ok(Self::Fifo),
            "priority" => Ok(Self::Priority),
            other => Err(format!("unknown order '{other}'; expected fifo or priority")),
        }
    }
}

impl QueueOrder {
    /// The name used in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Priority => "priority",
        }
    }
}

/// `queues[]:` — one local queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Its name, unique on this node.
    pub name: QueueName,
    /// Hand-out order.
    pub order: QueueOrder,
    /// Most messages held; a local put beyond it is refused, a delivery from a link goes
    /// to the dead-letter queue.
    pub queue_messages_max: u64,
    /// Largest payload this queue takes.
    pub message_bytes_max: u64,
    /// Reliability of puts that do not choose one.
    pub reliability: Reliability,
    /// What a put from a client of this node finds when the queue is full.
    pub when_full: WhenFull,
    /// Backouts after which a message leaves for [`QueueConfig::backout_queue`] instead of
    /// coming back (a poison message); `None`: it always comes back.
    pub backout_threshold: Option<u16>,
    /// Where such a message goes: a queue of this node (`None`: the dead-letter queue).
    pub backout_queue: Option<QueueName>,
}

/// What a put from a client finds when its queue is full. (A message arriving from a link
/// for a full queue goes to the dead-letter queue either way.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// It waits for room up to the put's timeout (a try-put or no-wait put does not wait).
    #[default]
    Block,
    /// It is refused at once, whatever the put's timeout.
    Reject,
}

/// Defaults of [`QueueConfig`], also used for the built-in queues.
pub const QUEUE_MESSAGES_MAX_DEFAULT: u64 = 100_000;

/// `messages:` — node-wide message limits and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageSettings {
    /// Lifetime of messages whose sender sets none, in seconds (`0`: unlimited).
    pub lifetime_default_s: u64,
    /// Largest payload accepted at all, in bytes.
    pub message_bytes_max: u64,
    /// Most messages the dead-letter queue `DLQ` holds.
    pub dead_letter_messages_max: u64,
    /// How long past a message's lifetime its origin waits for results before it reports
    /// "result wait timed out", in milliseconds.
    pub result_wait_ms: u64,
    /// Most messages whose results the origin waits for at once; a put asking for results
    /// beyond it is refused.
    pub results_pending_max: u64,
    /// Most relays a message may pass: a node that receives one that has already been
    /// forwarded this often dead-letters it (`hop_limit`), so a routing loop cannot keep it.
    pub hop_count_max: u64,
}

/// `links:` — the link protocol's limits and timers.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSettings {
    /// Longest frame accepted, in bytes.
    pub frame_bytes_max: u64,
    /// Most message bytes in one packet: messages are cut into packets of this size (the
    /// last one of a message up to a sixteenth more), which interleave with other channels'
    /// packets.
    pub packet_bytes_max: u64,
    /// Share of a busy link each priority level 0..=9 gets, relative to the others (its
    /// quota of packets per round); the system class always goes first.
    pub priority_quotas: [u64; 10],
    /// Share of a busy link file transfers get, on the same scale.
    pub file_quota: u64,
    /// Percent of a busy link's turns that messages this node relays for others get while
    /// its own messages of the same class wait too (1..=99).
    pub forward_share: u64,
    /// Messages sent to a neighbour and not yet acknowledged.
    pub in_flight_messages_max: u64,
    /// Bytes of messages sent to a neighbour and not yet acknowledged.
    pub in_flight_bytes_max: u64,
    /// Messages waiting for a neighbour per priority class (its transmission queue); a put
    /// beyond it waits for room or is refused.
    pub queue_messages_max: u64,
    /// Bytes (encoded messages) waiting for a neighbour per priority class; a put beyond it
    /// waits for room or is refused, except into an empty class.
    pub queue_bytes_max: u64,
    /// Bytes of this node's own messages a priority class holds before a client's put into
    /// it waits (up to a second per put call) for the link to take some, while the link is
    /// up and taking messages: a producer faster than its link keeps the link's pace instead
    /// of filling the class to `queue_bytes_max` (0: never held back).
    pub queue_pace_bytes: u64,
    /// Messages from a neighbour held ahead of a gap until it fills.
    pub reorder_messages_max: u64,
    /// Bytes of messages from a neighbour held ahead of a gap.
    pub reorder_bytes_max: u64,
    /// Bytes of large message buffers (256 KiB and more; a message of several packets is
    /// gathered in one) kept after use for the next large messages, all links together;
    /// 0 keeps none.
    pub recycled_bytes_max: u64,
    /// Time an acknowledgement may wait to travel with other frames (0: written at once).
    pub ack_delay_ms: u64,
    /// Time a message may go unacknowledged before it is written again.
    pub retransmit_timeout_ms: u64,
    /// First reconnect delay, doubled after each failure.
    pub reconnect_backoff_min_ms: u64,
    /// Longest reconnect delay.
    pub reconnect_backoff_max_ms: u64,
    /// Time a connection attempt may take.
    pub connect_timeout_ms: u64,
    /// Time the peer's hello may take.
    pub handshake_timeout_ms: u64,
    /// Incoming connections in the handshake that proved nothing yet (each may hold up to
    /// 64 KiB for `handshake_timeout_ms`); beyond it the oldest of the address holding the
    /// most is dropped.
    pub handshakes_max: u64,
    /// Of those, the most from one source address (an IPv6 one by its /64); beyond it that
    /// address's oldest is dropped, so one address cannot push out others.
    pub handshakes_per_address_max: u64,
    /// Incoming connections in the handshake that proved one peer's key (kept apart from
    /// the others, so no flood pushes them out); beyond it that peer's oldest is dropped.
    pub handshakes_per_peer_max: u64,
    /// Silence after which a ping is sent.
    pub ping_interval_ms: u64,
    /// Time an unanswered ping may take before the connection is dropped.
    pub pong_timeout_ms: u64,
}

/// One extension point's choice: the plugin's name and its own section.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginChoice {
    /// The registered plugin name (`kind:`).
    pub kind: String,
    /// The native plugin library it comes from (`library:`), if not built in.
    pub library: Option<LibraryChoice>,
    /// The whole section, handed to the plugin.
    pub section: ConfigValue,
}

impl PluginChoice {
    fn named(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            library: None,
            section: ConfigValue::Map(vec![("kind".into(), ConfigValue::Str(kind.into()))]),
        }
    }

    /// The canonical path of the library the plugin comes from, once loaded.
    pub fn library_path(&self) -> Option<&std::path::Path> {
        self.library.as_ref().and_then(|l| l.loaded.as_deref())
    }
}

/// A native plugin library named in a plugin's section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryChoice {
    /// `library:`, as written (relative to the working directory).
    pub path: PathBuf,
    /// `sha256:`, the digest its bytes must have.
    pub sha256: Option<[u8; 32]>,
    /// Its canonical path once [`Config::load_libraries`] loaded it.
    pub loaded: Option<PathBuf>,
}

/// `plugins:` — the plugin set.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// How links reach peers.
    pub transport: PluginChoice,
    /// Where queues and link state are kept.
    pub store: PluginChoice,
    /// Which neighbour a message to a distant node goes through.
    pub router: PluginChoice,
    /// The stages on messages' way, in order (`stages:`): at the origin each acts in this
    /// order (compression before encryption); the destination undoes the codecs a message
    /// records, in reverse.
    pub stages: Vec<PluginChoice>,
    /// User filters, in the order they run (`filters:`); taken up by `linkbus reload`.
    pub filters: Vec<FilterChoice>,
    /// What reads and writes file messages (`files:`, default `file`).
    pub files: PluginChoice,
    /// The plugins to choose from: the built-in ones, and those of the libraries loaded.
    pub registry: linkbus_plugin_api::Registry,
}

impl NodeSettings {
    /// The files directory: `files_dir`, or `files` in the data directory.
    pub fn files_dir(&self) -> PathBuf {
        self.files_dir.clone().unwrap_or_else(|| self.data_dir.join("files"))
    }
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            name: NodeName::new("A").expect("valid"),
            listen: Some("127.0.0.1:7400".into()),
            client_socket: None,
            data_dir: PathBuf::from("linkbus-data"),
            files_dir: None,
            data_free_bytes_min: 64 << 20,
        }
    }
}

impl Default for MessageSettings {
    fn default() -> Self {
        Self {
            lifetime_default_s: 86_400,
            message_bytes_max: 4 << 20,
            dead_letter_messages_max: 1_000_000,
            result_wait_ms: 60_000,
            results_pending_max: 100_000,
            hop_count_max: 16,
        }
    }
}

impl Default for LinkSettings {
    fn default() -> Self {
        Self {
            frame_bytes_max: 1 << 20,
            packet_bytes_max: 64 << 10,
            priority_quotas: PRIORITY_QUOTAS_DEFAULT,
            file_quota: 5,
            forward_share: 50,
            in_flight_messages_max: 4096,
            in_flight_bytes_max: 64 << 20,
            queue_messages_max: 1_000_000,
            queue_bytes_max: 256 << 20,
            queue_pace_bytes: 4 << 20,
            reorder_messages_max: 1024,
            reorder_bytes_max: 16 << 20,
            recycled_bytes_max: 16 << 20,
            ack_delay_ms: 2,
            retransmit_timeout_ms: 10_000,
            reconnect_backoff_min_ms: 100,
            reconnect_backoff_max_ms: 5_000,
            connect_timeout_ms: 5_000,
            handshake_timeout_ms: 5_000,
            handshakes_max: 64,
            handshakes_per_address_max: 8,
            handshakes_per_peer_max: 4,
            ping_interval_ms: 5_000,
            pong_timeout_ms: 10_000,
        }
    }
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self {
            transport: PluginChoice::named("tcp"),
            store: PluginChoice::named("fjall"),
            router: PluginChoice::named("static"),
            stages: Vec::new(),
            filters: Vec::new(),
            files: PluginChoice::named("file"),
            registry: linkbus_plugin_api::Registry::built_in(),
        }
    }
}

/// Where node `name` keeps its data unless told otherwise: `linkbus-data/NAME` in the
/// working directory (so two nodes started from one directory never share a store).
pub fn default_data_dir(name: &NodeName) -> PathBuf {
    PathBuf::from("linkbus-data").join(name.as_str())
}

impl Config {
    /// The configuration of a node called `name` with every other key at its default.
    pub fn defaults_for(name: NodeName) -> Self {
        Self {
            node: NodeSettings { data_dir: default_data_dir(&name), name, ..NodeSettings::default() },
            peers: Vec::new(),
            routes: Vec::new(),
            queues: Vec::new(),
            messages: MessageSettings::default(),
            links: LinkSettings::default(),
            plugins: PluginSettings::default(),
            security: SecuritySettings::default(),
            events: EventSettings::default(),
            log: LogSettings::default(),
        }
    }

    /// The queue named `name`, if configured.
    pub fn queue(&self, name: &str) -> Option<&QueueConfig> {
        self.queues.iter().find(|q| q.name.as_str() == name)
    }
}
