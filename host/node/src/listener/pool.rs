//! The connections in the handshake, and which one goes when there are too many.
//!
//! A connection starts *anonymous*: nothing it sent proved anything. Anonymous connections
//! are bounded per source address (`links.handshakes_per_address_max`; an IPv6 address
//! counts by its /64, which one host usually holds whole) and in all
//! (`links.handshakes_max`). At the first bound the oldest of that address goes. When the
//! whole pool is full, the oldest connection of the address that opened the most
//! connections recently goes (a count that halves every [`RATE_HALF_LIFE`], as HAProxy
//! tracks a source's connection rate): a peer redialing with backoff opens a connection
//! now and then, a flood many a second from each of its addresses, so the flood's
//! connections go first. A flood from one address only ever pushes out its own connections;
//! one from many addresses keeps a peer out only if each of them opens connections no
//! faster than the peer redials.
//!
//! A connection whose first handshake message proved a configured peer's static key (Noise
//! `IK`: the message decrypts only for a sender holding that key, and its clock reading is
//! newer than the last accepted) is *identified*: it leaves the anonymous pool, so no
//! amount of anonymous traffic can push it out while it finishes the handshake, a round
//! trip later. Identified connections are bounded per peer
//! (`links.handshakes_per_peer_max`; the oldest of that peer goes).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use linkbus_plugin_api::NodeName;
use tokio::task::AbortHandle;

/// The pool's bounds (from `links:`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolLimits {
    /// Anonymous connections in all.
    pub(crate) anonymous_max: usize,
    /// Anonymous connections from one source address.
    pub(crate) per_address_max: usize,
    /// Identified connections of one peer.
    pub(crate) per_peer_max: usize,
}

/// One connection in the handshake.
#[derive(Debug)]
struct Waiting {
    id: u64,
    /// The source address, as counted (IPv6 by its /64).
    source: String,
    task: Option<AbortHandle>,
}

/// Who dropped a connection, for the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// Its source address had too many connections in the handshake.
    Address(String),
    /// The anonymous pool was full; it was the oldest of the busiest address.
    Full(String),
    /// Its peer had too many identified connections in the handshake.
    Peer(NodeName),
}

/// How fast a source's count of recent connections decays.
pub(crate) const RATE_HALF_LIFE: Duration = Duration::from_secs(10);

/// Sources whose recent connections are counted; beyond it the least active are forgotten
/// (a forgotten source counts from zero, like a new one).
const SOURCES_TRACKED_MAX: usize = 4096;

/// A source's recent connections, decaying.
#[derive(Debug, Clone, Copy)]
struct Rate {
    count: f64,
    at: Instant,
}

impl Rate {
    fn at(self, now: Instant) -> f64 {
        let halves = now.saturating_duration_since(self.at).as_secs_f64() / RATE_HALF_LIFE.as_secs_f64();
        self.count * 0.5f64.powf(halves)
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// In order of arrival.
    anonymous: VecDeque<Waiting>,
    /// In order of identification, with the handshake's clock reading.
    identified: VecDeque<(NodeName, u64, Waiting)>,
    /// Recent connections per source.
    rates: HashMap<String, Rate>,
}

impl Inner {
    /// Counts a connection from `source`.
    fn count(&mut self, source: &str, now: Instant) {
        let count = self.rates.get(source).map_or(0.0, |r| r.at(now)) + 1.0;
        self.rates.insert(source.to_owned(), Rate { count, at: now });
        if self.rates.len() > SOURCES_TRACKED_MAX {
            let mut all: Vec<(String, f64)> = self.rates.drain().map(|(s, r)| (s, r.at(now))).collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            all.truncate(SOURCES_TRACKED_MAX / 2);
            self.rates = all.into_iter().map(|(s, count)| (s, Rate { count, at: now })).collect();
        }
    }

    /// The source among the anonymous connections that opened the most recently; of
    /// equals, the one whose connection is oldest.
    fn busiest(&self, now: Instant) -> Option<String> {
        let mut best: Option<(&str, f64)> = None;
        for w in &self.anonymous {
            let rate = self.rates.get(&w.source).map_or(0.0, |r| r.at(now));
            if best.is_none_or(|(_, b)| rate > b) {
                best = Some((&w.source, rate));
            }
        }
        best.map(|(s, _)| s.to_owned())
    }
}

/// See the module doc; shared between the accept loop and the handshake tasks.
#[derive(Debug)]
pub(crate) struct HandshakePool {
    limits: PoolLimits,
    inner: Mutex<Inner>,
}

/// A handshake task's place in the pool; leaving it (or being aborted) frees the place.
#[derive(Debug)]
pub(crate) struct Slot {
    pool: Arc<HandshakePool>,
    id: u64,
}

impl HandshakePool {
    pub(crate) fn new(limits: PoolLimits) -> Arc<Self> {
        Arc::new(Self { limits, inner: Mutex::new(Inner::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes room for a connection from `address` (aborting what must go, returned for the
    /// log) and admits it: `start` spawns its task given its slot.
    pub(crate) fn admit(
        self: &Arc<Self>,
        address: &str,
        now: Instant,
        start: impl FnOnce(Slot) -> AbortHandle,
    ) -> Vec<Eviction> {
        let source = source_of(address);
        let mut inner = self.lock();
        inner.count(&source, now);
        let mut evicted = Vec::new();
        let from_source = inner.anonymous.iter().filter(|w| w.source == source).count();
        if from_source >= self.limits.per_address_max {
            if let Some(i) = inner.anonymous.iter().position(|w| w.source == source)
                && let Some(w) = inner.anonymous.remove(i)
            {
                abort(w);
                evicted.push(Eviction::Address(source.clone()));
            }
        } else if inner.anonymous.len() >= self.limits.anonymous_max
            && let Some(busiest) = inner.busiest(now)
            && let Some(i) = inner.anonymous.iter().position(|w| w.source == busiest)
            && let Some(w) = inner.anonymous.remove(i)
        {
            abort(w);
            evicted.push(Eviction::Full(busiest));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        // Registered before the task can run to completion, under the same lock, so its
        // slot always finds its entry (or finds it gone because it was evicted).
        let task = start(Slot { pool: self.clone(), id });
        inner.anonymous.push_back(Waiting { id, source, task: Some(task) });
        evicted
    }

    /// Connections in the handshake: anonymous, identified.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.anonymous.len(), inner.identified.len())
    }
}

impl Slot {
    /// The connection proved it is `peer`, with a handshake stamped `stamp`: it leaves the
    /// anonymous pool. Returns an eviction when the peer already had its most identified
    /// connections (the oldest went), or `Err` when a connection with the same handshake is
    /// already here (a replay of it: refuse this one, so a replay never pushes out the
    /// genuine one).
    pub(crate) fn identified(&self, peer: &NodeName, stamp: u64) -> Result<Option<Eviction>, Replayed> {
        let mut inner = self.pool.lock();
        if inner.identified.iter().any(|(p, s, _)| p == peer && *s == stamp) {
            return Err(Replayed);
        }
        let Some(i) = inner.anonymous.iter().position(|w| w.id == self.id) else { return Ok(None) };
        let Some(waiting) = inner.anonymous.remove(i) else { return Ok(None) };
        let mut evicted = None;
        let of_peer = inner.identified.iter().filter(|(p, _, _)| p == peer).count();
        if of_peer >= self.pool.limits.per_peer_max
            && let Some(j) = inner.identified.iter().position(|(p, _, _)| p == peer)
            && let Some((_, _, w)) = inner.identified.remove(j)
        {
            abort(w);
            evicted = Some(Eviction::Peer(peer.clone()));
        }
        inner.identified.push_back((peer.clone(), stamp, waiting));
        Ok(evicted)
    }
}

/// A handshake with the same peer and clock reading as one already in the pool.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Replayed;

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.pool.lock();
        // Only the own entry, never its task: dropping the slot ends the task anyway.
        if let Some(i) = inner.anonymous.iter().position(|w| w.id == self.id) {
            inner.anonymous.remove(i);
        } else if let Some(i) = inner.identified.iter().position(|(_, _, w)| w.id == self.id) {
            inner.identified.remove(i);
        }
    }
}

fn abort(mut waiting: Waiting) {
    if let Some(task) = waiting.task.take() {
        task.abort();
    }
}

/// What a connection's source counts as: its IP address (IPv6 by its /64); a transport
/// address that is not an IP socket address counts whole.
fn source_of(address: &str) -> String {
    match address.parse::<SocketAddr>().map(|a| a.ip()) {
        Ok(IpAddr::V4(ip)) => ip.to_string(),
        Ok(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = ip.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Err(_) => address.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> PoolLimits {
        PoolLimits { anonymous_max: 6, per_address_max: 3, per_peer_max: 2 }
    }

    /// Admits a connection whose task never ends; returns its slot (kept, or the entry
    /// leaves) and what it pushed out.
    fn admit(pool: &Arc<HandshakePool>, address: &str) -> (Slot, Vec<Eviction>) {
        admit_at(pool, address, Instant::now())
    }

    fn admit_at(pool: &Arc<HandshakePool>, address: &str, now: Instant) -> (Slot, Vec<Eviction>) {
        let mut slot = None;
        let evicted = pool.admit(address, now, |s| {
            slot = Some(s);
            tokio::spawn(std::future::pending::<()>()).abort_handle()
        });
        (slot.expect("started"), evicted)
    }

    #[tokio::test]
    async fn one_address_only_pushes_out_its_own_connections() {
        let pool = HandshakePool::new(limits());
        let _peer = admit(&pool, "10.0.0.2:4000");
        let mut kept = Vec::new();
        for port in 0..50 {
            let (slot, evicted) = admit(&pool, &format!("10.0.0.9:{port}"));
            if port >= 3 {
                assert_eq!(evicted, [Eviction::Address("10.0.0.9".into())]);
            }
            kept.push(slot);
        }
        assert_eq!(pool.counts(), (4, 0), "the peer's connection and the flood's last three");
    }

    #[tokio::test]
    async fn a_full_pool_pushes_out_the_busiest_address_and_spares_identified_connections() {
        let pool = HandshakePool::new(limits());
        let (peer, _) = admit(&pool, "10.0.0.2:4000");
        assert_eq!(peer.identified(&NodeName::new("B").unwrap(), 1), Ok(None));
        let mut kept = Vec::new();
        for i in 0..40 {
            let (slot, evicted) = admit(&pool, &format!("10.0.1.{}:1", i % 4));
            if i >= 6 {
                assert_eq!(evicted.len(), 1, "one goes for each that comes: {evicted:?}");
            }
            kept.push(slot);
        }
        assert_eq!(pool.counts(), (6, 1), "the identified one stays");
    }

    #[tokio::test]
    async fn a_full_pool_keeps_the_connection_of_an_address_that_rarely_connects() {
        let pool = HandshakePool::new(PoolLimits { anonymous_max: 64, per_address_max: 8, per_peer_max: 4 });
        let t0 = Instant::now();
        let mut kept = Vec::new();
        // 200 addresses take turns at 3,000 connections a second, each holding one at most.
        let flood = |i: u32| format!("10.1.{}.{}:1", i % 200 / 100, i % 100);
        for i in 0..3_000 {
            kept.push(admit_at(&pool, &flood(i), t0 + Duration::from_micros(u64::from(i) * 333)).0);
        }
        let at = t0 + Duration::from_secs(1);
        let (peer, _) = admit_at(&pool, "10.0.0.2:4000", at);
        for i in 3_000..6_000 {
            let (slot, evicted) =
                admit_at(&pool, &flood(i), at + Duration::from_micros(u64::from(i - 3_000) * 333));
            assert!(!evicted.iter().any(|e| *e == Eviction::Full("10.0.0.2".into())), "the peer's stays");
            kept.push(slot);
        }
        assert_eq!(peer.identified(&NodeName::new("B").unwrap(), 1), Ok(None));
        assert_eq!(pool.counts(), (63, 1), "it was still there to be identified");
    }

    #[tokio::test]
    async fn identified_connections_are_bounded_per_peer_and_leave_when_done() {
        let pool = HandshakePool::new(limits());
        let b = NodeName::new("B").unwrap();
        let (one, _) = admit(&pool, "10.0.0.2:1");
        let (two, _) = admit(&pool, "10.0.0.2:2");
        let (three, _) = admit(&pool, "10.0.0.2:3");
        assert_eq!(one.identified(&b, 1), Ok(None));
        assert_eq!(two.identified(&b, 2), Ok(None));
        assert_eq!(three.identified(&b, 3), Ok(Some(Eviction::Peer(b.clone()))));
        assert_eq!(pool.counts(), (0, 2));
        drop(three);
        drop(one);
        assert_eq!(pool.counts(), (0, 1), "an evicted slot's drop takes nothing else");
        drop(two);
        assert_eq!(pool.counts(), (0, 0));
    }

    #[tokio::test]
    async fn a_replayed_handshake_never_pushes_out_the_genuine_one() {
        let pool = HandshakePool::new(limits());
        let b = NodeName::new("B").unwrap();
        let (genuine, _) = admit(&pool, "10.0.0.2:1");
        assert_eq!(genuine.identified(&b, 7), Ok(None));
        for port in 0..10 {
            let (replay, _) = admit(&pool, &format!("10.0.0.66:{port}"));
            assert_eq!(replay.identified(&b, 7), Err(Replayed));
        }
        assert_eq!(pool.counts().1, 1, "the genuine one is still there");
    }

    #[test]
    fn sources_count_by_host_and_ipv6_by_its_64() {
        assert_eq!(source_of("127.0.0.3:5000"), "127.0.0.3");
        assert_eq!(source_of("[2001:db8:1:2:3:4:5:6]:7"), "2001:db8:1:2::/64");
        assert_eq!(source_of("[::ffff:10.1.2.3]:7"), "10.1.2.3");
        assert_eq!(source_of("unix:/tmp/x"), "unix:/tmp/x");
    }
}
