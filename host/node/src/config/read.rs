//! Reading configuration: YAML text to a [`ConfigValue`] tree, command-line overrides applied
//! to that tree, then the tree read into a [`Config`] with every problem collected and
//! reported with its YAML path.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use linkbus_plugin_api::registry::{self, BuildContext, Builder};
use linkbus_plugin_api::{
    ConfigErrors, ConfigIssue, ConfigValue, Diagnostics, NodeName, QueueName, Reliability, Section,
};
use linkbus_proto::secure::Cipher;

use super::{
    Config, EventSettings, LinkSettings, LogSettings, MessageSettings, NodeSettings, PACKET_OVERHEAD_BYTES,
    PeerConfig, PluginChoice, PluginSettings, QUEUE_MESSAGES_MAX_DEFAULT, QUOTA_MAX, QueueConfig, QueueOrder,
    RouteConfig, SecuritySettings, Subscription, WhenFull,
};

const MS_MAX: u64 = 24 * 3_600_000;
const BYTES_MAX: u64 = 1 << 40;

/// Command-line values that override (or, without a file, make up) the configuration.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--name`.
    pub name: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--peer NAME=ADDRESS`, repeatable: replaces a peer of that name or adds one.
    pub peers: Vec<String>,
    /// `--queue NAME[:fifo|:priority]`, repeatable: replaces a queue or adds one.
    pub queues: Vec<String>,
    /// `--route PATTERN=VIA`, repeatable: added after the file's routes.
    pub routes: Vec<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--files-dir`.
    pub files_dir: Option<PathBuf>,
    /// `--socket`.
    pub client_socket: Option<PathBuf>,
    /// `--insecure-plaintext`.
    pub insecure_plaintext: bool,
    /// `--key-file`.
    pub key_file: Option<PathBuf>,
    /// `--psk-file`.
    pub psk_file: Option<PathBuf>,
}

impl Overrides {
    /// A node named `name` that dials and listens to no one (`listen: none`), its data in
    /// `dir/NAME` and its client socket at `dir/NAME.sock`: a program's own node, or a
    /// benchmark's.
    pub fn local(name: &str, dir: &Path) -> Self {
        Self {
            name: Some(name.to_owned()),
            listen: Some("none".into()),
            data_dir: Some(dir.join(name)),
            client_socket: Some(dir.join(format!("{name}.sock"))),
            ..Self::default()
        }
    }
}

fn one_issue(path: &str, message: impl std::fmt::Display) -> ConfigErrors {
    ConfigErrors(vec![ConfigIssue { path: path.to_owned(), message: message.to_string() }])
}

/// Parses YAML text (YAML 1.2 booleans only; duplicate keys refused).
///
/// # Errors
/// The parser's error with line and column.
pub fn parse_yaml(text: &str) -> Result<ConfigValue, ConfigErrors> {
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options::<ConfigValue>(text, options).map_err(|e| one_issue("", e))
}

/// Reads `path`, applies `overrides`, reads the result into a [`Config`] and loads the
/// native plugin libraries it names ([`Config::load_libraries`]).
///
/// # Errors
/// Every problem found, each with its YAML path (a read or syntax error is the only one).
pub fn load_file(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let mut tree = match path {
        None => ConfigValue::Map(Vec::new()),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| one_issue("", format!("cannot read {}: {e}", path.display())))?;
            parse_yaml(&text).map_err(|mut e| {
                for issue in &mut e.0 {
                    issue.message = format!("{}: {}", path.display(), issue.message);
                }
                e
            })?
        }
    };
    apply_overrides(&mut tree, overrides);
    let mut config = from_value(&tree)?;
    config.load_libraries()?;
    Ok(config)
}

fn entries(value: &mut ConfigValue) -> Option<&mut Vec<(String, ConfigValue)>> {
    if *value == ConfigValue::Null {
        *value = ConfigValue::Map(Vec::new());
    }
    match value {
        ConfigValue::Map(entries) => Some(entries),
        _ => None,
    }
}

fn slot<'a>(map: &'a mut Vec<(String, ConfigValue)>, key: &str) -> &'a mut ConfigValue {
    let index = match map.iter().position(|(k, _)| k == key) {
        Some(i) => i,
        None => {
            map.push((key.to_owned(), ConfigValue::Null));
            map.len() - 1
        }
    };
    &mut map[index].1
}

/// The entries of the list item whose `name` is `name`.
fn named_item<'a>(list: &'a mut ConfigValue, name: &str) -> Option<&'a mut Vec<(String, ConfigValue)>> {
    let ConfigValue::Seq(items) = list else { return None };
    items.iter_mut().find_map(|item| match item {
        ConfigValue::Map(entries)
            if entries.iter().any(|(k, v)| k == "name" && *v == ConfigValue::Str(name.into())) =>
        {
            Some(entries)
        }
        _ => None,
    })
}

/// Replaces the list item whose `name` is `name`, or appends `item`.
fn upsert(list: &mut ConfigValue, name: &str, item: ConfigValue) {
    if *list == ConfigValue::Null {
        *list = ConfigValue::Seq(Vec::new());
    }
    let ConfigValue::Seq(items) = list else { return };
    let same = |v: &ConfigValue| matches!(v, ConfigValue::Map(e) if e.iter().any(|(k, v)| k == "name" && *v == ConfigValue::Str(name.into())));
    match items.iter_mut().find(|v| same(v)) {
        Some(existing) => *existing = item,
        None => items.push(item),
    }
}

fn text(s: &str) -> ConfigValue {
    ConfigValue::Str(s.to_owned())
}

/// Writes the command-line overrides into the tree, where [`from_value`] then checks them
/// like any other value. A tree that is not a mapping is left for the reader to report.
pub fn apply_overrides(tree: &mut ConfigValue, o: &Overrides) {
    let Some(root) = entries(tree) else { return };
    if let Some(node) = entries(slot(root, "node")) {
        let path = |p: &PathBuf| text(&p.to_string_lossy());
        for (key, value) in [
            ("name", o.name.as_deref().map(text)),
            ("listen", o.listen.as_deref().map(text)),
            ("data_dir", o.data_dir.as_ref().map(path)),
            ("files_dir", o.files_dir.as_ref().map(path)),
            ("client_socket", o.client_socket.as_ref().map(path)),
        ] {
            if let Some(value) = value {
                *slot(node, key) = value;
            }
        }
    }
    let security_paths = [("key_file", o.key_file.as_ref()), ("psk_file", o.psk_file.as_ref())];
    if (o.insecure_plaintext || security_paths.iter().any(|(_, p)| p.is_some()))
        && let Some(security) = entries(slot(root, "security"))
    {
        if o.insecure_plaintext {
            *slot(security, "insecure_plaintext") = ConfigValue::Bool(true);
        }
        for (key, path) in security_paths {
            if let Some(path) = path {
                *slot(security, key) = text(&path.to_string_lossy());
            }
        }
    }
    for peer in &o.peers {
        let (name, address) = peer.split_once('=').unwrap_or((peer, ""));
        let peers = slot(root, "peers");
        if let Some(entries) = named_item(peers, name) {
            // A peer from the file keeps its other keys (public key, permanence).
            if !address.is_empty() {
                *slot(entries, "address") = text(address);
            }
            continue;
        }
        let mut item = vec![("name".to_owned(), text(name))];
        if !address.is_empty() {
            item.push(("address".to_owned(), text(address)));
        }
        upsert(peers, name, ConfigValue::Map(item));
    }
    for route in &o.routes {
        let (to, via) = route.split_once('=').unwrap_or((route, ""));
        let item = vec![("to".to_owned(), text(to)), ("via".to_owned(), text(via))];
        let routes = slot(root, "routes");
        if *routes == ConfigValue::Null {
            *routes = ConfigValue::Seq(Vec::new());
        }
        if let ConfigValue::Seq(items) = routes {
            items.push(ConfigValue::Map(item));
        }
    }
    for queue in &o.queues {
        let (name, order) = queue.split_once(':').map_or((queue.as_str(), None), |(n, o)| (n, Some(o)));
        let mut item = vec![("name".to_owned(), text(name))];
        if let Some(order) = order {
            item.push(("order".to_owned(), text(order)));
        }
        upsert(slot(root, "queues"), name, ConfigValue::Map(item));
    }
}

/// Reads a whole configuration tree, collecting every problem.
///
/// # Errors
/// Every problem found, in document order, each with its YAML path.
pub fn from_value(tree: &ConfigValue) -> Result<Config, ConfigErrors> {
    let diag = Diagnostics::new();
    let config = Section::new(&diag, "", tree).map(|root| {
        let node = read_node(&root);
        let peers = read_peers(&root);
        let routes = read_routes(&root, &peers);
        let messages = read_messages(&root);
        let queues = read_queues(&root, &messages);
        let links = read_links(&root);
        let plugins = read_plugins(&root);
        let security = read_security(&root);
        let events = read_events(&root);
        let log = read_log(&root);
        root.finish();
        // Invalid parts were reported and replaced by defaults, so the relations between the
        // valid parts are still checked and every error comes out at once.
        let config = Config { node, peers, routes, queues, messages, links, plugins, security, events, log };
        check_relations(&config, &diag);
        config
    });
    diag.finish()?;
    config.ok_or_else(|| one_issue("", "configuration is invalid"))
}

fn read_node(root: &Section<'_>) -> NodeSettings {
    let d = NodeSettings::default();
    let Some(s) = root.section("node") else { return d };
    let name = s.required("name", |s, k| s.parsed::<NodeName>(k));
    let listen = match s.get("listen") {
        None => d.listen,
        Some(ConfigValue::Str(a)) if a == "none" => None,
        Some(_) => s.string("listen"),
    };
    let client_socket = s.string("client_socket").map(PathBuf::from);
    let name = name.unwrap_or(d.name);
    let data_dir = s.string("data_dir").map_or_else(|| super::default_data_dir(&name), PathBuf::from);
    let files_dir = s.string("files_dir").map(PathBuf::from);
    let data_free_bytes_min = s.number("data_free_bytes_min", d.data_free_bytes_min, 0, BYTES_MAX);
    s.finish();
    NodeSettings { name, listen, client_socket, data_dir, files_dir, data_free_bytes_min }
}

fn read_peers(root: &Section<'_>) -> Vec<PeerConfig> {
    let diag = root.diagnostics();
    let mut peers: Vec<PeerConfig> = Vec::new();
    for (path, value) in root.list("peers") {
        let Some(s) = Section::new(diag, path.clone(), value) else { continue };
        let name = s.required("name", |s, k| s.parsed::<NodeName>(k));
        let address = s.string("address");
        let permanent = s.bool("permanent", true);
        let public_key = s
            .string("public_key")
            .and_then(|k| linkbus_proto::secure::parse_key(&k).map_err(|e| s.error("public_key", e)).ok());
        s.finish();
        let Some(name) = name else { continue };
        if peers.iter().any(|p| p.name == name) {
            diag.error(format!("{path}.name"), format!("peer '{name}' is listed twice"));
        }
        peers.push(PeerConfig { name, address, permanent, public_key });
    }
    peers
}

fn read_routes(root: &Section<'_>, peers: &[PeerConfig]) -> Vec<RouteConfig> {
    let diag = root.diagnostics();
    let mut routes = Vec::new();
    for (path, value) in root.list("routes") {
        let Some(s) = Section::new(diag, path.clone(), value) else { continue };
        let to = s.required("to", |s, k| {
            let text = s.string(k)?;
            linkbus_plugin_api::Pattern::new(&text).map_err(|e| s.error(k, e)).ok()
        });
        let via = s.required("via", |s, k| s.parsed::<NodeName>(k));
        if let Some(via) = via.as_ref().filter(|v| !peers.iter().any(|p| &p.name == *v)) {
            s.error("via", format!("'{via}' is not a peer of this node"));
        }
        s.finish();
        if let (Some(to), Some(via)) = (to, via) {
            routes.push(RouteConfig { to, via });
        }
    }
    routes
}

fn read_queues(root: &Section<'_>, messages: &MessageSettings) -> Vec<QueueConfig> {
    let diag = root.diagnostics();
    let mut queues: Vec<QueueConfig> = Vec::new();
    for (path, value) in root.list("queues") {
        let Some(s) = Section::new(diag, path.clone(), value) else { continue };
        let name = s.required("name", |s, k| s.parsed::<QueueName>(k));
        let order = s.parsed::<QueueOrder>("order").unwrap_or_default();
        let queue_messages_max = s.number("queue_messages_max", QUEUE_MESSAGES_MAX_DEFAULT, 1, 1 << 40);
        let message_bytes_max =
            s.number("message_bytes_max", messages.message_bytes_max, 0, messages.message_bytes_max);
        let reliability = match s.string("reliability").as_deref() {
            None | Some("volatile") => Reliability::Volatile,
            Some("persistent") => Reliability::Persistent,
            Some(other) => {
                s.error(
                    "reliability",
                    format!("unknown reliability '{other}'; expected volatile or persistent"),
                );
                Reliability::Volatile
            }
        };
        let when_full = match s.string("when_full").as_deref() {
            None | Some("block") => WhenFull::Block,
            Some("reject") => WhenFull::Reject,
            Some(other) => {
                s.error("when_full", format!("unknown choice '{other}'; expected block or reject"));
                WhenFull::Block
            }
        };
        let backout_threshold = s.get("backout_threshold").map(|_| {
            u16::try_from(s.number("backout_threshold", 1, 1, u64::from(u16::MAX))).unwrap_or(u16::MAX)
        });
        let backout_queue = s.parsed::<QueueName>("backout_queue");
        if backout_queue.is_some() && backout_threshold.is_none() {
            s.error(
                "backout_queue",
                "needs backout_threshold (the backouts after which a message goes there)",
            );
        }
        s.finish();
        let Some(name) = name else { continue };
        if crate::queue::is_reserved(&name) {
            diag.error(format!("{path}.name"), format!("queue name '{name}' is reserved for the node"));
        }
        if queues.iter().any(|q| q.name == name) {
            diag.error(format!("{path}.name"), format!("queue '{name}' is declared twice"));
        }
        queues.push(QueueConfig {
            name,
            order,
            queue_messages_max,
            message_bytes_max,
            reliability,
            when_full,
            backout_threshold,
            backout_queue,
        });
    }
    check_backout_queues(diag, &queues);
    queues
}

/// Each `backout_queue` names another queue of this node (or the dead-letter queue).
fn check_backout_queues(diag: &Diagnostics, queues: &[QueueConfig]) {
    for (i, q) in queues.iter().enumerate() {
        let Some(to) = &q.backout_queue else { continue };
        let path = format!("queues[{i}].backout_queue");
        if to == &q.name {
            diag.error(path, format!("'{to}' is this queue itself"));
        } else if to.as_str() != crate::flow::dead_letter::DEAD_LETTER_QUEUE
            && !queues.iter().any(|other| &other.name == to)
        {
            diag.error(
                path,
                format!("no queue '{to}' on this node (declare it, or leave it out for the DLQ)"),
            );
        }
    }
}

fn read_messages(root: &Section<'_>) -> MessageSettings {
    let d = MessageSettings::default();
    let Some(s) = root.section("messages") else { return d };
    let settings = MessageSettings {
        lifetime_default_s: s.number("lifetime_default_s", d.lifetime_default_s, 0, u64::from(u32::MAX)),
        message_bytes_max: s.number("message_bytes_max", d.message_bytes_max, 0, 1 << 32),
        dead_letter_messages_max: s.number(
            "dead_letter_messages_max",
            d.dead_letter_messages_max,
            1,
            1 << 40,
        ),
        result_wait_ms: s.number("result_wait_ms", d.result_wait_ms, 100, 1 << 40),
        results_pending_max: s.number("results_pending_max", d.results_pending_max, 1, 1 << 32),
        hop_count_max: s.number("hop_count_max", d.hop_count_max, 1, u64::from(u8::MAX) - 1),
    };
    s.finish();
    settings
}

fn read_log(root: &Section<'_>) -> LogSettings {
    let d = LogSettings::default();
    let Some(s) = root.section("log") else { return d };
    let settings = LogSettings {
        repeats_max: s.number("repeats_max", d.repeats_max, 0, u64::from(u32::MAX)),
        interval_ms: s.number("interval_ms", d.interval_ms, 100, MS_MAX),
    };
    s.finish();
    settings
}

fn read_links(root: &Section<'_>) -> LinkSettings {
    let d = LinkSettings::default();
    let Some(s) = root.section("links") else { return d };
    let settings = LinkSettings {
        frame_bytes_max: s.number("frame_bytes_max", d.frame_bytes_max, 2048, BYTES_MAX),
        packet_bytes_max: s.number("packet_bytes_max", d.packet_bytes_max, 1024, 16 << 20),
        priority_quotas: read_quotas(&s, d.priority_quotas),
        file_quota: s.number("file_quota", d.file_quota, 1, QUOTA_MAX),
        forward_share: s.number("forward_share", d.forward_share, 1, 99),
        in_flight_messages_max: s.number("in_flight_messages_max", d.in_flight_messages_max, 1, 1 << 20),
        in_flight_bytes_max: s.number("in_flight_bytes_max", d.in_flight_bytes_max, 1, BYTES_MAX),
        queue_messages_max: s.number("queue_messages_max", d.queue_messages_max, 1, 1 << 40),
        queue_bytes_max: s.number("queue_bytes_max", d.queue_bytes_max, 1, BYTES_MAX),
        queue_pace_bytes: s.number("queue_pace_bytes", d.queue_pace_bytes, 0, BYTES_MAX),
        reorder_messages_max: s.number("reorder_messages_max", d.reorder_messages_max, 1, 1 << 20),
        reorder_bytes_max: s.number("reorder_bytes_max", d.reorder_bytes_max, 0, BYTES_MAX),
        recycled_bytes_max: s.number("recycled_bytes_max", d.recycled_bytes_max, 0, BYTES_MAX),
        ack_delay_ms: s.number("ack_delay_ms", d.ack_delay_ms, 0, 1_000),
        retransmit_timeout_ms: s.number("retransmit_timeout_ms", d.retransmit_timeout_ms, 1, MS_MAX),
        reconnect_backoff_min_ms: s.number("reconnect_backoff_min_ms", d.reconnect_backoff_min_ms, 1, MS_MAX),
        reconnect_backoff_max_ms: s.number("reconnect_backoff_max_ms", d.reconnect_backoff_max_ms, 1, MS_MAX),
        connect_timeout_ms: s.number("connect_timeout_ms", d.connect_timeout_ms, 1, MS_MAX),
        handshake_timeout_ms: s.number("handshake_timeout_ms", d.handshake_timeout_ms, 1, MS_MAX),
        handshakes_max: s.number("handshakes_max", d.handshakes_max, 1, 1 << 20),
        handshakes_per_address_max: s.number(
            "handshakes_per_address_max",
            d.handshakes_per_address_max,
            1,
            1 << 20,
        ),
        handshakes_per_peer_max: s.number("handshakes_per_peer_max", d.handshakes_per_peer_max, 1, 1 << 10),
        // A node answers at most one ping per 100 ms (throttling), so faster keepalives would
        // time out against it.
        ping_interval_ms: s.number("ping_interval_ms", d.ping_interval_ms, 100, MS_MAX),
        pong_timeout_ms: s.number("pong_timeout_ms", d.pong_timeout_ms, 200, MS_MAX),
    };
    s.finish();
    settings
}

/// `links.priority_quotas`: ten integers in 1..=QUOTA_MAX, level 0 first.
fn read_quotas(s: &Section<'_>, default: [u64; 10]) -> [u64; 10] {
    let Some(value) = s.get("priority_quotas") else { return default };
    let ConfigValue::Seq(items) = value else {
        s.error("priority_quotas", format!("expected a list of 10 integers, found {}", value.type_name()));
        return default;
    };
    if items.len() != default.len() {
        s.error("priority_quotas", format!("expected 10 quotas (levels 0..=9), found {}", items.len()));
        return default;
    }
    let mut quotas = default;
    for ((slot, item), level) in quotas.iter_mut().zip(items).zip(0..) {
        match item {
            ConfigValue::Uint(n) if (1..=QUOTA_MAX).contains(n) => *slot = *n,
            other => s.diagnostics().error(
                format!("{}[{level}]", s.path_of("priority_quotas")),
                format!("expected an integer in 1..={QUOTA_MAX}, found {}", describe(other)),
            ),
        }
    }
    quotas
}

fn describe(value: &ConfigValue) -> String {
    match value {
        ConfigValue::Uint(n) => n.to_string(),
        ConfigValue::Int(n) => n.to_string(),
        other => other.type_name().to_owned(),
    }
}

fn read_events(root: &Section<'_>) -> EventSettings {
    let d = EventSettings::default();
    let Some(s) = root.section("events") else { return d };
    let queue_messages_max = s.number("queue_messages_max", d.queue_messages_max, 1, 1 << 40);
    let diag = s.diagnostics();
    let mut subscriptions = Vec::new();
    for (path, value) in s.list("subscriptions") {
        let Some(sub) = Section::new(diag, path.clone(), value) else { continue };
        let to = sub.required("to", |s, k| s.parsed::<linkbus_plugin_api::Address>(k));
        let mut kinds = Vec::new();
        for (kind_path, kind) in sub.list("kinds") {
            match kind {
                ConfigValue::Str(k) if k == "all" => kinds.extend(crate::events::EventKind::ALL),
                ConfigValue::Str(k) => match k.parse() {
                    Ok(kind) => kinds.push(kind),
                    Err(e) => diag.error(kind_path, e),
                },
                other => {
                    diag.error(kind_path, format!("expected an event kind, found {}", other.type_name()))
                }
            }
        }
        if sub.get("kinds").is_none() {
            sub.error("kinds", "is required (a list of event kinds, or [all])");
        } else if kinds.is_empty() {
            sub.error("kinds", "is empty: name the event kinds, or [all]");
        }
        sub.finish();
        if let Some(to) = to {
            kinds.dedup();
            subscriptions.push(Subscription { kinds, to, path });
        }
    }
    s.finish();
    EventSettings { queue_messages_max, subscriptions }
}

fn read_security(root: &Section<'_>) -> SecuritySettings {
    let d = SecuritySettings::default();
    let Some(s) = root.section("security") else { return d };
    let settings = SecuritySettings {
        insecure_plaintext: s.bool("insecure_plaintext", false),
        key_file: s.string("key_file").map(PathBuf::from),
        psk_file: s.string("psk_file").map(PathBuf::from),
        clock_skew_max_s: s.number("clock_skew_max_s", d.clock_skew_max_s, 1, 7 * 86_400),
        cipher: s.string("cipher").and_then(|name| match name.as_str() {
            "auto" => None,
            name => Cipher::from_name(name).or_else(|| {
                s.error("cipher", format!("unknown cipher '{name}'; expected auto, {}", Cipher::names()));
                None
            }),
        }),
    };
    s.finish();
    settings
}

fn read_plugins(root: &Section<'_>) -> PluginSettings {
    let d = PluginSettings::default();
    let Some(s) = root.section("plugins") else { return d };
    let transport = read_choice(&s, "transport", d.transport.clone()).unwrap_or(d.transport);
    let store = read_choice(&s, "store", d.store.clone()).unwrap_or(d.store);
    let router = read_choice(&s, "router", d.router.clone()).unwrap_or(d.router);
    let stages = read_stages(&s);
    let filters = super::filters::read_filters(&s);
    let files = read_choice_as(&s, "files", "handler", d.files.clone()).unwrap_or(d.files);
    s.finish();
    PluginSettings {
        transport,
        store,
        router,
        stages,
        filters,
        files,
        registry: linkbus_plugin_api::Registry::built_in(),
    }
}

/// The extension points a stage may serve, in the registry's words.
const STAGE_KINDS: [&str; 2] = ["compressor", "cipher"];

/// The registered stage plugin named `kind` (a compressor or a cipher).
pub(crate) fn find_stage(kind: &str) -> Option<&'static linkbus_plugin_api::PluginEntry> {
    STAGE_KINDS.iter().find_map(|point| registry::find(point, kind))
}

/// `plugins.stages`: each entry a registered compressor or cipher, with its own section;
/// codec ids unique, and no compressor after a cipher (ciphertext does not shrink).
fn read_stages(plugins: &Section<'_>) -> Vec<PluginChoice> {
    let diag = plugins.diagnostics();
    let mut stages = Vec::new();
    let mut cipher_seen: Option<String> = None;
    for (path, value) in plugins.list("stages") {
        let Some(section) = Section::new(diag, path.clone(), value) else { continue };
        let Some(kind) = section.required("kind", Section::string) else { continue };
        let twice = stages.iter().any(|s: &PluginChoice| s.kind == kind);
        if let Some(library) = super::native::read_library(&section, "stage") {
            if twice {
                section
                    .error("kind", format!("stage '{kind}' is listed twice; give one entry all its rules"));
            }
            // Checked once the library is loaded (`Config::load_libraries`), its place in
            // the order too.
            stages.push(PluginChoice { kind, library: Some(library), section: value.clone() });
            continue;
        }
        if section.get("library").is_some() {
            continue; // `read_library` said why.
        }
        let Some(entry) = find_stage(&kind) else {
            let known: Vec<_> = STAGE_KINDS.iter().flat_map(|point| registry::names(point)).collect();
            section.error("kind", format!("no stage plugin named '{kind}'; available: {}", known.join(", ")));
            continue;
        };
        match (entry.factory.kind(), &cipher_seen) {
            ("compressor", Some(cipher)) => section.error(
                "kind",
                format!("compressor '{kind}' comes after cipher '{cipher}': sealed bytes do not shrink, list it first"),
            ),
            ("cipher", _) => cipher_seen = Some(kind.clone()),
            _ => {}
        }
        if twice {
            section.error("kind", format!("stage '{kind}' is listed twice; give one entry all its rules"));
        }
        (entry.check)(&section);
        section.finish();
        stages.push(PluginChoice { kind, library: None, section: value.clone() });
    }
    stages
}

fn read_choice(plugins: &Section<'_>, point: &'static str, default: PluginChoice) -> Option<PluginChoice> {
    read_choice_as(plugins, point, point, default)
}

/// [`read_choice`] of key `key` for extension point `point` (`files:` chooses a `handler`).
fn read_choice_as(
    plugins: &Section<'_>,
    key: &'static str,
    point: &'static str,
    default: PluginChoice,
) -> Option<PluginChoice> {
    let Some(value) = plugins.get(key) else { return Some(default) };
    let section = Section::new(plugins.diagnostics(), plugins.path_of(key), value)?;
    let kind = section.required("kind", Section::string)?;
    if let Some(library) = super::native::read_library(&section, point) {
        // The plugin's own check reads the rest of the section once the library is loaded
        // (`Config::load_libraries`), and reports the keys it does not know.
        return Some(PluginChoice { kind, library: Some(library), section: value.clone() });
    }
    if section.get("library").is_some() {
        return None; // `read_library` said why.
    }
    let Some(entry) = registry::find(point, &kind) else {
        let known = registry::names(point).join(", ");
        let native = if super::native::NATIVE_POINTS.contains(&point) {
            " (or a native library's: `library:`)"
        } else {
            ""
        };
        section.error("kind", format!("no {point} plugin named '{kind}'; available: {known}{native}"));
        return None;
    };
    (entry.check)(&section);
    section.finish();
    Some(PluginChoice { kind, library: None, section: value.clone() })
}

fn check_relations(config: &Config, diag: &Diagnostics) {
    let frame_needed = config.links.packet_bytes_max + PACKET_OVERHEAD_BYTES;
    if config.links.frame_bytes_max < frame_needed {
        diag.error(
            "links.frame_bytes_max",
            format!(
                "{} is too small for links.packet_bytes_max {} plus {PACKET_OVERHEAD_BYTES} bytes of packet header",
                config.links.frame_bytes_max, config.links.packet_bytes_max
            ),
        );
    }
    if config.links.reconnect_backoff_min_ms > config.links.reconnect_backoff_max_ms {
        diag.error("links.reconnect_backoff_min_ms", "is larger than links.reconnect_backoff_max_ms");
    }
    if config.links.ack_delay_ms >= config.links.retransmit_timeout_ms {
        // The sender would write everything again while the acknowledgement waits.
        diag.error("links.ack_delay_ms", "must be less than links.retransmit_timeout_ms");
    }
    if config.links.pong_timeout_ms < config.links.ping_interval_ms {
        diag.error("links.pong_timeout_ms", "must be at least links.ping_interval_ms");
    }
    let transport = build_transport(config);
    let check = |path: &str, address: &str| {
        if let Some(Err(e)) = transport.as_ref().map(|t| t.check_address(address)) {
            diag.error(path, e);
        }
    };
    let mut seen_addresses = HashSet::new();
    for (i, peer) in config.peers.iter().enumerate() {
        if !config.security.insecure_plaintext && peer.public_key.is_none() {
            diag.error(
                format!("peers[{i}].public_key"),
                "is required for Noise links (or set security.insecure_plaintext: true)",
            );
        }
        if peer.name == config.node.name {
            diag.error(format!("peers[{i}].name"), format!("'{}' is this node's own name", peer.name));
        }
        if let Some(address) = &peer.address {
            check(&format!("peers[{i}].address"), address);
            if !seen_addresses.insert(address.clone()) {
                diag.error(format!("peers[{i}].address"), format!("address {address} is used by two peers"));
            }
        }
    }
    if let Some(listen) = &config.node.listen {
        check("node.listen", listen);
    }

    for sub in &config.events.subscriptions {
        let path = format!("{}.to", sub.path);
        if sub.to.node == config.node.name {
            let local = config.queues.iter().any(|q| q.name == sub.to.queue);
            if !local && sub.to.queue.as_str() != crate::flow::dead_letter::DEAD_LETTER_QUEUE {
                diag.error(path, format!("queue '{}' is not declared on this node", sub.to.queue));
            }
        } else if !config.peers.iter().any(|p| p.name == sub.to.node)
            && !config.routes.iter().any(|r| r.to.matches(&sub.to.node))
        {
            diag.error(path, format!("node '{}' is not a peer, and no route matches it", sub.to.node));
        }
    }
}

/// The configured transport, built only to check addresses (building a transport opens
/// nothing).
fn build_transport(config: &Config) -> Option<Box<dyn linkbus_plugin_api::Transport>> {
    let t = &config.plugins.transport;
    let found = config.plugins.registry.find("transport", &t.kind, t.library_path());
    let Some(Builder::Transport(build)) = found.map(|p| &p.builder) else { return None };
    let ctx = BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() };
    build(&config.plugins.transport.section, &ctx).ok()
}

#[cfg(test)]
mod tests;
