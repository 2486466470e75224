//! Link security as configured: the mode, this node's static key, the cluster's pre-shared
//! key, the peers' public keys, and the replay check of incoming handshakes.
//!
//! Key files hold 64 hex digits; `linkbus keygen` writes them with mode 0600, and a node
//! refuses to use a key file that group or others may read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use linkbus_plugin_api::{ConfigErrors, ConfigIssue, NodeName};
use linkbus_proto::secure::{Cipher, KEY_BYTES, Keypair, Mode, SecureChannel, SecureError, hex, parse_key};

use crate::config::Config;

/// The security of one node's links.
pub struct Security {
    /// Plaintext (only when configured) or Noise.
    pub mode: Mode,
    /// The cipher of the Noise links this node dials.
    pub cipher: Cipher,
    keys: Option<Keypair>,
    psk: Option<[u8; KEY_BYTES]>,
    peer_keys: Vec<(NodeName, [u8; KEY_BYTES])>,
    /// The newest handshake time seen from each peer; an older or equal one is a replay.
    stamps: Mutex<HashMap<NodeName, u64>>,
    /// How far ahead of our clock a handshake stamp may be.
    skew_ms_max: u64,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("mode", &self.mode)
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// Why a handshake's stamp is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Not newer than the last handshake from the peer that completed: a replay.
    Replayed,
    /// Further ahead of this node's clock than `security.clock_skew_max_s` allows.
    Ahead {
        /// By how much, in milliseconds.
        by_ms: u64,
        /// The limit, in seconds.
        max_s: u64,
    },
}

/// Where the node's private key is read from.
pub fn key_path(config: &Config) -> PathBuf {
    config.security.key_file.clone().unwrap_or_else(|| config.node.data_dir.join("node.key"))
}

/// Reads a key file: 64 hex digits, not readable by group or others.
///
/// # Errors
/// A message saying what is wrong and how to fix it.
pub fn read_key_file(path: &Path) -> Result<[u8; KEY_BYTES], String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:o}, which others may read; run chmod 600 on it",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_key(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes a key file with mode 0600, refusing to overwrite one.
///
/// # Errors
/// The I/O error, or `AlreadyExists`.
pub fn write_key_file(path: &Path, key: &[u8; KEY_BYTES]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(file, "{}", hex(key))
}

/// Checks the keys of one cluster's configurations against each other (`linkbus config
/// check a.yaml b.yaml …`): every `peers[].public_key` naming a node of the set must be the
/// public key of that node's key file, both ends of a link must agree on plaintext or Noise,
/// and the nodes must hold the same cluster key. Returns one line per problem.
pub fn check_cluster_keys(configs: &[Config]) -> Vec<String> {
    let mut problems = Vec::new();
    // Each node's own public key and cluster key, when it uses Noise and they can be read.
    let loaded: Vec<Option<(Security, Option<[u8; KEY_BYTES]>)>> = configs
        .iter()
        .map(|c| {
            let security = Security::load(c).ok()?;
            let psk = c.security.psk_file.as_deref().and_then(|p| read_key_file(p).ok());
            Some((security, psk))
        })
        .collect();
    for (config, own) in configs.iter().zip(&loaded) {
        let name = &config.node.name;
        for peer in &config.peers {
            let Some(i) = configs.iter().position(|c| c.node.name == peer.name) else { continue };
            let (other, theirs) = (&configs[i], &loaded[i]);
            if config.security.insecure_plaintext != other.security.insecure_plaintext {
                let mode = |c: &Config| if c.security.insecure_plaintext { "plaintext" } else { "Noise" };
                problems.push(format!(
                    "node {name} links to {} with {} but {} requires {} (security.insecure_plaintext)",
                    peer.name,
                    mode(config),
                    peer.name,
                    mode(other)
                ));
                continue;
            }
            if config.security.insecure_plaintext {
                continue;
            }
            let Some(actual) = theirs.as_ref().and_then(|(s, _)| s.public_key()) else { continue };
            match peer.public_key {
                Some(listed) if listed != actual => problems.push(format!(
                    "node {name}'s peers[{}].public_key is {}, but {}'s key file ({}) holds the key of {}",
                    peer.name,
                    hex(&listed),
                    peer.name,
                    key_path(other).display(),
                    hex(&actual)
                )),
                _ => {}
            }
            let psks = (own.as_ref().and_then(|o| o.1), theirs.as_ref().and_then(|t| t.1));
            if let (Some(ours), Some(other_psk)) = psks
                && ours != other_psk
                && name < &peer.name
            {
                problems.push(format!(
                    "nodes {name} and {} link to each other but hold different cluster keys (security.psk_file)",
                    peer.name
                ));
            }
        }
    }
    problems
}

impl Security {
    /// Loads what `config` asks for; every problem is reported with its YAML path.
    ///
    /// # Errors
    /// [`ConfigErrors`] for unreadable, too open or malformed key files.
    pub fn load(config: &Config) -> Result<Self, ConfigErrors> {
        let stamps = Mutex::new(HashMap::new());
        let skew_ms_max = config.security.clock_skew_max_s.saturating_mul(1000);
        let cipher = config.security.cipher.unwrap_or_else(Cipher::fastest);
        // A node without peers has no links to protect (and needs no keys).
        if config.security.insecure_plaintext || config.peers.is_empty() {
            let mode = if config.security.insecure_plaintext { Mode::Plaintext } else { Mode::Noise };
            return Ok(Self {
                mode,
                cipher,
                keys: None,
                psk: None,
                peer_keys: Vec::new(),
                stamps,
                skew_ms_max,
            });
        }
        let mut issues = Vec::new();
        let mut issue = |path: &str, message: String| issues.push(ConfigIssue { path: path.into(), message });
        let keys = match read_key_file(&key_path(config)) {
            Ok(private) => {
                Keypair::from_private(private).map_err(|e| issue("security.key_file", e.to_string())).ok()
            }
            Err(e) => {
                issue("security.key_file", format!("{e} (make one with `linkbus keygen --out PATH`)"));
                None
            }
        };
        let psk = match &config.security.psk_file {
            Some(path) => read_key_file(path).map_err(|e| issue("security.psk_file", e)).ok(),
            None => {
                issue(
                    "security.psk_file",
                    "is required for Noise links (make one with `linkbus keygen --psk --out PATH`)".into(),
                );
                None
            }
        };
        if !issues.is_empty() {
            return Err(ConfigErrors(issues));
        }
        let peer_keys = config.peers.iter().filter_map(|p| Some((p.name.clone(), p.public_key?))).collect();
        Ok(Self { mode: Mode::Noise, cipher, keys, psk, peer_keys, stamps, skew_ms_max })
    }

    /// This node's public key, when it has one.
    pub fn public_key(&self) -> Option<[u8; KEY_BYTES]> {
        self.keys.as_ref().map(|k| k.public)
    }

    /// The channel for dialing `peer`.
    ///
    /// # Errors
    /// [`SecureError`] when the peer has no key or a key cannot be used.
    pub fn dialer(&self, peer: &NodeName, unix_ms: u64) -> Result<SecureChannel, SecureError> {
        match (self.mode, &self.keys, &self.psk) {
            (Mode::Plaintext, _, _) => Ok(SecureChannel::plaintext_dialer()),
            (Mode::Noise, Some(keys), Some(psk)) => {
                let remote = self
                    .key_of(peer)
                    .ok_or_else(|| SecureError::Key(format!("no public key for peer {peer}")))?;
                SecureChannel::noise_dialer(self.cipher, keys, &remote, psk, unix_ms)
            }
            (Mode::Noise, _, _) => Err(SecureError::Key("this node has no keys (it has no peers)".into())),
        }
    }

    /// The channel for an accepted connection.
    ///
    /// # Errors
    /// [`SecureError`] when a key cannot be used.
    pub fn listener(&self) -> Result<SecureChannel, SecureError> {
        match (self.mode, &self.keys, &self.psk) {
            (Mode::Plaintext, _, _) => Ok(SecureChannel::listener(None)),
            (Mode::Noise, Some(keys), Some(psk)) => Ok(SecureChannel::listener(Some((keys, psk)))),
            (Mode::Noise, _, _) => Err(SecureError::Key("this node has no keys (it has no peers)".into())),
        }
    }

    fn key_of(&self, peer: &NodeName) -> Option<[u8; KEY_BYTES]> {
        self.peer_keys.iter().find(|(name, _)| name == peer).map(|(_, key)| *key)
    }

    /// The peer whose static key is `key`.
    pub fn identify(&self, key: &[u8; KEY_BYTES]) -> Option<&NodeName> {
        self.peer_keys.iter().find(|(_, k)| k == key).map(|(name, _)| name)
    }

    /// Checks that a handshake from `peer` stamped `unix_ms` is newer than the last one that
    /// completed (else it is a replay) and not from too far in the future (`now_ms` is our
    /// clock; `security.clock_skew_max_s` of difference is tolerated).
    ///
    /// # Errors
    /// [`Stale`] saying which.
    pub fn check_fresh(&self, peer: &NodeName, unix_ms: u64, now_ms: u64) -> Result<(), Stale> {
        if unix_ms > now_ms.saturating_add(self.skew_ms_max) {
            return Err(Stale::Ahead { by_ms: unix_ms - now_ms, max_s: self.skew_ms_max / 1000 });
        }
        let stamps = self.stamps.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if stamps.get(peer).is_some_and(|last| unix_ms <= *last) {
            return Err(Stale::Replayed);
        }
        Ok(())
    }

    /// Records the stamp of a handshake from `peer` that completed (its `Hello` decrypted).
    pub fn record_handshake(&self, peer: &NodeName, unix_ms: u64) {
        let mut stamps = self.stamps.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = stamps.entry(peer.clone()).or_insert(0);
        *last = (*last).max(unix_ms);
    }
}
