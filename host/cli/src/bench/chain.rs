//! Chains of nodes in this process for the workloads and the demo: keys, configurations
//! (links, routes, queues, codec stages), starting them and waiting for their links.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use linkbus_client::Client;
use linkbus_host::Node;
use linkbus_host::config::{self, Overrides};
use linkbus_proto::secure::Cipher;

use super::NEXT_SCRATCH;
use crate::demo::DemoError;

/// A client of `node`: over its client socket, or in-process.
pub(crate) async fn client_of(node: &Node, in_process: bool) -> Result<Client, linkbus_client::ClientError> {
    if in_process { Ok(node.client()) } else { Client::connect(node.socket_path()).await }
}

/// How a chain is set up: its links' cipher (none: plaintext), the codec stages from its
/// first node to the last's `orders` (zstd, the XChaCha20-Poly1305 payload cipher), and
/// whether payloads are JSON-like text (which compresses) rather than noise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Setup {
    /// The links' Noise cipher; none for plaintext links.
    pub cipher: Option<Cipher>,
    /// Compress with zstd at the first node.
    pub compress: bool,
    /// Seal end to end at the first node, open at the last.
    pub seal: bool,
    /// JSON-like text payloads.
    pub text: bool,
    /// Persistent messages (else volatile).
    pub persistent: bool,
    /// Compress with a dictionary trained on sample records, at the first and last node.
    pub dictionary: bool,
    /// A filter at the first node's `on_send`.
    pub filter: Option<BenchFilter>,
    /// After the messages, a file of this many bytes sent from the first node's files
    /// directory to the last's `orders` (0: none).
    pub file_bytes: u64,
}

/// The filters a chain may run (example modules of `wasm-plugins/built`, built in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BenchFilter {
    /// `drop_by_header` on a header no message has: every message passes (the SDK reads
    /// each, and answers "all pass").
    Pass,
    /// `redact_json` masking the digits of each payload's first `customer` value
    /// ([`crate::demo::redact_customer`] says what arrives).
    Redact,
}

/// The example modules the demo and the benchmarks run, in the binary (so they need no
/// wasm toolchain and no checkout).
const DROP_BY_HEADER: &[u8] = include_bytes!("../../../../wasm-plugins/built/drop_by_header.wasm");
const REDACT_JSON: &[u8] = include_bytes!("../../../../wasm-plugins/built/redact_json.wasm");

impl BenchFilter {
    /// The filter's `plugins.filters` entry, its module written under `dir`.
    fn yaml(self, dir: &Path) -> std::io::Result<String> {
        let (file, bytes, entry) = match self {
            Self::Pass => (
                "drop_by_header.wasm",
                DROP_BY_HEADER,
                "name: pass, hooks: [on_send], config: { key: x-never, value: set }",
            ),
            Self::Redact => (
                "redact_json.wasm",
                REDACT_JSON,
                "name: redact-customers, hooks: [on_send], config: { field: customer, keep_last: 0 }",
            ),
        };
        let path = dir.join(file);
        std::fs::write(&path, bytes)?;
        Ok(format!("{{ {entry}, module: '{}' }}", path.display()))
    }
}

impl Setup {
    /// Noise links with `cipher`, nothing else.
    pub(crate) fn noise(cipher: Cipher) -> Self {
        Self { cipher: Some(cipher), ..Self::default() }
    }

    /// The `plugins` YAML of node `index` of `count` (its stages, with the payload key at
    /// `key` and the dictionary at `dictionary`, and its filter, with its module under `dir`).
    fn plugins_yaml(self, index: usize, count: usize, last: &str, dir: &Path) -> std::io::Result<String> {
        let stages = self.stages_yaml(index, count, last, &dir.join("orders.pkey"), &dir.join("orders.dict"));
        let filters = match self.filter {
            Some(filter) if index == 0 => format!("filters: [ {} ]", filter.yaml(dir)?),
            _ => String::new(),
        };
        Ok(match (stages.is_empty(), filters.is_empty()) {
            (true, true) => String::new(),
            (false, true) => format!("plugins: {{ {stages} }}\n"),
            (true, false) => format!("plugins: {{ {filters} }}\n"),
            (false, false) => format!("plugins: {{ {stages}, {filters} }}\n"),
        })
    }

    /// The `stages:` entry of node `index` of `count` (empty: none), with the payload key at
    /// `key` and the dictionary at `dictionary`.
    fn stages_yaml(self, index: usize, count: usize, last: &str, key: &Path, dictionary: &Path) -> String {
        let mut stages = Vec::new();
        let key = key.display();
        let (dictionaries, named) = if self.dictionary {
            (format!(", dictionaries: {{ orders: '{}' }}", dictionary.display()), ", dictionary: orders")
        } else {
            (String::new(), "")
        };
        if index == 0 {
            if self.compress {
                stages.push(format!(
                    "{{ kind: zstd{dictionaries}, rules: [ {{ to: '{last}:orders', level: 3, min_bytes: 64{named} }} ] }}"
                ));
            }
            if self.seal {
                stages.push(format!(
                    "{{ kind: chacha20poly1305, rules: [ {{ to: '{last}:orders', key: '{key}' }} ] }}"
                ));
            }
        } else if index == count - 1 {
            if self.compress {
                stages.push(format!("{{ kind: zstd{dictionaries} }}"));
            }
            if self.seal {
                stages.push(format!("{{ kind: chacha20poly1305, keys: [ '{key}' ] }}"));
            }
        }
        if stages.is_empty() { String::new() } else { format!("stages: [ {} ]", stages.join(", ")) }
    }
}

/// Starts a chain of `count` nodes (`N0` ... in a line, each dialing the next; the first
/// routes to the last through the second, the last back through the one before it; the
/// last has queue `orders`), over Noise links with fresh keys and `cipher` when there is
/// one, else plaintext, each keeping its data and socket in its own directory under
/// `scratch`.
///
/// # Errors
/// [`DemoError`] when a key, a configuration or a node fails.
pub(crate) async fn start_chain(
    scratch: &Path,
    names: &[&str],
    setup: Setup,
) -> Result<Vec<Node>, DemoError> {
    use linkbus_host::security::write_key_file;
    use linkbus_proto::secure::{Keypair, hex};
    // Each chain in its own directory under `scratch` (a run starts several).
    let dir = scratch.join(format!("chain-{}", NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir)?;
    let mut public = Vec::new();
    for name in names {
        let keys = Keypair::generate()?;
        write_key_file(&dir.join(format!("{name}.key")), &keys.private)?;
        public.push(hex(&keys.public));
    }
    write_key_file(&dir.join("cluster.psk"), &Keypair::generate()?.private)?;
    let payload_key = dir.join("orders.pkey");
    if setup.seal {
        linkbus_encrypt_chacha::write_new_key_file(&payload_key)?;
    }
    let dictionary = dir.join("orders.dict");
    if setup.dictionary {
        let samples = crate::demo::sample_records(4000);
        let trained = linkbus_compress_zstd::train(&samples, 16 * 1024).map_err(std::io::Error::other)?;
        std::fs::write(&dictionary, trained)?;
    }
    let cipher = setup.cipher;
    let (first, last) = (names[0], names[names.len() - 1]);
    let mut nodes: Vec<Node> = Vec::new();
    let mut next_address: Option<String> = None;
    // From the last node back to the first, so each can dial the one after it.
    for (i, name) in names.iter().enumerate().rev() {
        let mut peers = Vec::new();
        if let Some(before) = i.checked_sub(1) {
            peers.push(format!("{{ name: {}, public_key: '{}' }}", names[before], public[before]));
        }
        if let (Some(after), Some(address)) = (names.get(i + 1), &next_address) {
            peers.push(format!("{{ name: {after}, address: '{address}', public_key: '{}' }}", public[i + 1]));
        }
        let mut yaml = format!(
            "node: {{ name: {name}, listen: '{}' }}\npeers: [ {} ]\n",
            if i == 0 { "none" } else { "127.0.0.1:0" },
            peers.join(", ")
        );
        if i == 0 && names.len() > 2 {
            yaml.push_str(&format!("routes: [ {{ to: {last}, via: {} }} ]\n", names[1]));
        }
        if i == names.len() - 1 && names.len() > 2 {
            yaml.push_str(&format!("routes: [ {{ to: {first}, via: {} }} ]\n", names[i - 1]));
        }
        if let Some(cipher) = cipher {
            yaml.push_str(&format!("security: {{ cipher: {} }}\n", cipher.name()));
        }
        yaml.push_str(&setup.plugins_yaml(i, names.len(), last, &dir)?);
        // Every node has `orders` (the last is where messages go; the first takes replies).
        yaml.push_str(
            "queues: [ { name: orders, order: fifo, queue_messages_max: 10000000 }, { name: urgent, order: fifo } ]\n",
        );
        let overrides = Overrides {
            data_dir: Some(dir.join(name)),
            client_socket: Some(dir.join(format!("{name}.sock"))),
            key_file: Some(dir.join(format!("{name}.key"))),
            psk_file: Some(dir.join("cluster.psk")),
            insecure_plaintext: cipher.is_none(),
            ..Overrides::default()
        };
        let mut tree = config::parse_yaml(&yaml)?;
        config::apply_overrides(&mut tree, &overrides);
        let node = Node::start(config::from_value(&tree)?).await?;
        next_address = node.listen_address().map(str::to_owned);
        nodes.push(node);
    }
    nodes.reverse();
    wait_until_linked(&nodes).await?;
    Ok(nodes)
}

/// Longest a chain's links may take to come up.
const LINK_UP_WAIT: Duration = Duration::from_secs(10);

/// Waits until every link of every node in `nodes` is established, so a measurement starts
/// on a running chain (links are permanent: connecting is not part of moving messages, and
/// messages put before would wait in a queue the link then drains in one burst).
async fn wait_until_linked(nodes: &[Node]) -> Result<(), DemoError> {
    let deadline = Instant::now() + LINK_UP_WAIT;
    let all_up = || nodes.iter().all(|n| n.state().links_up());
    while !all_up() {
        if Instant::now() > deadline {
            return Err(DemoError::Io(std::io::Error::other(format!(
                "the nodes' links did not come up within {LINK_UP_WAIT:?}"
            ))));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}
