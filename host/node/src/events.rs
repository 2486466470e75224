//! Node events: typed records of what happened (a link came up or went down, a message
//! expired or was dead-lettered, a queue was full, a message's result came back), put as event messages into the node's
//! `EVENT` queue and copied to the queues that subscribe to their kind (`events.subscriptions`
//! in YAML), on this node or another.
//!
//! An event message has kind `Event`, the system priority, its kind as its name and in the
//! `linkbus.event` header, one header per field, and a line of text as its payload. Events
//! never wait and never block the node: when the `EVENT` queue or a subscriber's way is full
//! the event is dropped there (and counted). No event is raised about an event message, so
//! subscriptions cannot feed each other in a loop.

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, RwLock};

use linkbus_plugin_api::{Address, Batch, NodeName, Store, StoreError};

/// Header naming an event message's kind.
pub const EVENT_KIND_HEADER: &str = "linkbus.event";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A link's handshake completed (a renegotiation of its sequence numbers).
    LinkUp,
    /// A link's connection ended.
    LinkDown,
    /// A link stopped until an operator resets it.
    LinkStopped,
    /// Messages' lifetime ran out before they were delivered.
    Expired,
    /// A message went to the dead-letter queue.
    DeadLetter,
    /// A put was refused because a queue or transmission queue stayed full.
    QueueFull,
    /// The final outcome of a message of this node for one recipient (see `results`).
    Result,
    /// A file was received whole into this node's files directory (see `files`).
    FileReceived,
}

impl EventKind {
    /// Every kind, for `all` in subscriptions.
    pub const ALL: [EventKind; 8] = [
        Self::LinkUp,
        Self::LinkDown,
        Self::LinkStopped,
        Self::Expired,
        Self::DeadLetter,
        Self::QueueFull,
        Self::Result,
        Self::FileReceived,
    ];

    /// The kind's name in configuration, headers and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LinkUp => "link_up",
            Self::LinkDown => "link_down",
            Self::LinkStopped => "link_stopped",
            Self::Expired => "expired",
            Self::DeadLetter => "dead_letter",
            Self::QueueFull => "queue_full",
            Self::Result => "result",
            Self::FileReceived => "file_received",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown event kind '{s}'; expected all or one of {}", known.join(", "))
        })
    }
}

/// One event: its kind, named fields and a line of text for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Details, each also a header of the event message.
    pub fields: Vec<(&'static str, String)>,
    /// A line for people.
    pub text: String,
}

impl Event {
    /// An event of `kind` with `text` and no fields yet.
    pub fn new(kind: EventKind, text: impl Into<String>) -> Self {
        Self { kind, fields: Vec::new(), text: text.into() }
    }

    /// Adds a field.
    #[must_use]
    pub fn with(mut self, key: &'static str, value: impl ToString) -> Self {
        self.fields.push((key, value.to_string()));
        self
    }
}

/// Store space of the subscriptions made by clients (key: the queue address, value: the
/// kinds, comma-separated).
pub(crate) const SUBSCRIPTIONS_SPACE: &str = "subscriptions";

/// One subscription in force: its kinds, its queue, and whether a client made it (else the
/// configuration declares it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The kinds copied.
    pub kinds: Vec<EventKind>,
    /// The queue that gets the copies.
    pub to: Address,
    /// Made by a client (kept in the store), not declared in the configuration.
    pub from_client: bool,
}

/// Distinct (origin, queue) pairs whose dropped event copies are counted one by one; the
/// rest are counted together.
const DROPPED_PAIRS_MAX: usize = 256;

/// Event copies that were dropped (no such queue, no room, no way there), counted per node
/// that raised them and queue they were for, with the last reason: shown by `linkbus
/// status` (and, for this node's own subscriptions, `linkbus events ls`).
#[derive(Debug, Default)]
pub struct DroppedCopies {
    /// Every copy dropped, whether or not its pair is known.
    total: std::sync::atomic::AtomicU64,
    pairs: Mutex<Vec<Dropped>>,
}

/// Copies of one origin's events for one queue that were dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The node that raised the events; `None` for the pairs beyond the counted ones.
    pub origin: Option<NodeName>,
    /// The queue they were for (`None` likewise).
    pub to: Option<Address>,
    /// How many.
    pub count: u64,
    /// The last one's dead-letter code and reason.
    pub last: (String, String),
}

impl DroppedCopies {
    /// Counts a dropped copy (in the total only; see [`DroppedCopies::count`]).
    pub fn count_one(&self) {
        self.total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every copy dropped.
    pub fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a dropped copy of `origin`'s events for `to`.
    pub fn count(&self, origin: &NodeName, to: &Address, code: &str, reason: &str) {
        let mut pairs = self.pairs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = pairs.iter().position(|d| d.origin.as_ref() == Some(origin) && d.to.as_ref() == Some(to));
        let index = match known {
            Some(i) => i,
            None if pairs.len() < DROPPED_PAIRS_MAX => {
                let (origin, to) = (Some(origin.clone()), Some(to.clone()));
                pairs.push(Dropped { origin, to, count: 0, last: Default::default() });
                pairs.len() - 1
            }
            None => match pairs.iter().position(|d| d.origin.is_none()) {
                Some(i) => i,
                None => {
                    pairs.push(Dropped { origin: None, to: None, count: 0, last: Default::default() });
                    pairs.len() - 1
                }
            },
        };
        if let Some(d) = pairs.get_mut(index) {
            d.count += 1;
            d.last = (code.to_owned(), reason.to_owned());
        }
    }

    /// Every count, in the order first seen.
    pub fn all(&self) -> Vec<Dropped> {
        self.pairs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The count of `origin`'s copies for `to`.
    pub fn of(&self, origin: &NodeName, to: &Address) -> u64 {
        let pairs = self.pairs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pairs
            .iter()
            .find(|d| d.origin.as_ref() == Some(origin) && d.to.as_ref() == Some(to))
            .map_or(0, |d| d.count)
    }
}

/// The subscriptions in force: those of the configuration, then those clients made, which
/// are kept in the node's store (so they last as long as its data).
#[derive(Debug)]
pub struct Subscriptions {
    list: RwLock<Vec<Subscription>>,
    /// See [`Subscriptions::changes`].
    changes: tokio::sync::Mutex<()>,
}

impl Subscriptions {
    /// The configuration's subscriptions plus the clients' ones recorded in `store`.
    ///
    /// # Errors
    /// When the store fails.
    pub fn load(config: &[crate::config::Subscription], store: &dyn Store) -> Result<Self, StoreError> {
        let mut list: Vec<Subscription> = config
            .iter()
            .map(|s| Subscription { kinds: s.kinds.clone(), to: s.to.clone(), from_client: false })
            .collect();
        // Collected first: the loop below deletes entries it reads.
        let stored: Vec<_> =
            linkbus_plugin_api::store::scan_pages(store, SUBSCRIPTIONS_SPACE).collect::<Result<_, _>>()?;
        for (key, value) in stored {
            let to = std::str::from_utf8(&key).ok().and_then(|k| k.parse::<Address>().ok());
            let kinds: Option<Vec<EventKind>> = std::str::from_utf8(&value).ok().and_then(|v| match v {
                "all" => Some(EventKind::ALL.to_vec()),
                v => v.split(',').map(|k| k.parse().ok()).collect(),
            });
            match (to, kinds) {
                (Some(to), _) if list.iter().any(|s| s.to == to) => {
                    tracing::warn!(%to, "A client subscription of a queue the configuration now subscribes; removed.");
                    let mut batch = Batch::new();
                    batch.delete(SUBSCRIPTIONS_SPACE, key.clone());
                    store.write(batch, true)?;
                }
                (Some(to), Some(kinds)) => list.push(Subscription { kinds, to, from_client: true }),
                _ => {
                    tracing::warn!(key = %String::from_utf8_lossy(&key), "Stored subscription unreadable; ignored.")
                }
            }
        }
        Ok(Self { list: RwLock::new(list), changes: tokio::sync::Mutex::new(()) })
    }

    /// Removes the client subscriptions whose queue `check` refuses, saying why in the log
    /// (a queue or peer dropped from the configuration since); returns the store batch that
    /// forgets them, for the store thread to write.
    pub fn remove_unreachable(&self, check: impl Fn(&Address) -> Result<(), String>) -> Batch {
        let mut list = self.list.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut batch = Batch::new();
        list.retain(|s| match check(&s.to) {
            Err(reason) if s.from_client => {
                tracing::warn!(to = %s.to, reason, "A client subscription's queue cannot be reached any more; removed.");
                batch.delete(SUBSCRIPTIONS_SPACE, s.to.to_string().into_bytes());
                false
            }
            _ => true,
        });
        batch
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Subscription>> {
        self.list.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The queues subscribed to `kind`.
    pub fn targets(&self, kind: EventKind) -> Vec<Address> {
        self.read().iter().filter(|s| s.kinds.contains(&kind)).map(|s| s.to.clone()).collect()
    }

    /// Every subscription in force.
    pub fn all(&self) -> Vec<Subscription> {
        self.read().clone()
    }

    /// Client subscription changes one at a time: each is planned, written by the store
    /// thread and synced, then applied (the list's lock is never held across the sync, so
    /// events never wait for it).
    pub fn changes(&self) -> &tokio::sync::Mutex<()> {
        &self.changes
    }

    /// The store write that subscribes `to` (checked by the caller) to `kinds`, replacing
    /// the kinds of a client subscription of the same queue, and the kinds as kept; apply
    /// them with [`Subscriptions::apply_subscribe`] once the write is durable.
    ///
    /// # Errors
    /// A reason when the configuration already subscribes that queue.
    pub fn plan_subscribe(
        &self,
        to: &Address,
        kinds: &[EventKind],
    ) -> Result<(Batch, Vec<EventKind>), String> {
        if self.read().iter().any(|s| &s.to == to && !s.from_client) {
            return Err(format!(
                "{to} is subscribed in the configuration (events.subscriptions); change it there"
            ));
        }
        let mut kinds = kinds.to_vec();
        kinds.sort_by_key(|k| EventKind::ALL.iter().position(|a| a == k));
        kinds.dedup();
        // Every kind is stored as `all`, so kinds added later are included.
        let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let value = if kinds.len() == EventKind::ALL.len() { "all".to_owned() } else { names.join(",") };
        let mut batch = Batch::new();
        batch.put(SUBSCRIPTIONS_SPACE, to.to_string().into_bytes(), value.into_bytes());
        Ok((batch, kinds))
    }

    /// Puts in force what [`Subscriptions::plan_subscribe`] planned.
    pub fn apply_subscribe(&self, to: &Address, kinds: Vec<EventKind>) {
        let mut list = self.list.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        list.retain(|s| &s.to != to);
        list.push(Subscription { kinds, to: to.clone(), from_client: true });
    }

    /// The store write that ends the client subscription of `to`; apply it with
    /// [`Subscriptions::apply_unsubscribe`] once the write is durable.
    ///
    /// # Errors
    /// A reason when there is none (or the configuration declares it).
    pub fn plan_unsubscribe(&self, to: &Address) -> Result<Batch, String> {
        match self.read().iter().find(|s| &s.to == to) {
            None => return Err(format!("{to} has no subscription")),
            Some(s) if !s.from_client => {
                return Err(format!(
                    "{to} is subscribed in the configuration (events.subscriptions); change it there"
                ));
            }
            Some(_) => {}
        }
        let mut batch = Batch::new();
        batch.delete(SUBSCRIPTIONS_SPACE, to.to_string().into_bytes());
        Ok(batch)
    }

    /// Ends what [`Subscriptions::plan_unsubscribe`] planned.
    pub fn apply_unsubscribe(&self, to: &Address) {
        self.list.write().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|s| &s.to != to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the node does (with its store thread): plan, write synced, apply.
    fn subscribe(
        subs: &Subscriptions,
        to: &Address,
        kinds: &[EventKind],
        store: &dyn Store,
    ) -> Result<(), String> {
        let (batch, kinds) = subs.plan_subscribe(to, kinds)?;
        store.write(batch, true).map_err(|e| e.to_string())?;
        subs.apply_subscribe(to, kinds);
        Ok(())
    }

    fn unsubscribe(subs: &Subscriptions, to: &Address, store: &dyn Store) -> Result<(), String> {
        store.write(subs.plan_unsubscribe(to)?, true).map_err(|e| e.to_string())?;
        subs.apply_unsubscribe(to);
        Ok(())
    }

    #[test]
    fn client_subscriptions_are_stored_and_config_ones_are_left_alone() {
        let store = linkbus_store_memory::MemoryStore::new();
        let ops: Address = "B:ops".parse().unwrap();
        let audit: Address = "A:audit".parse().unwrap();
        let config = [crate::config::Subscription {
            kinds: vec![EventKind::LinkUp],
            to: audit.clone(),
            path: "events.subscriptions[0]".into(),
        }];
        let subs = Subscriptions::load(&config, &store).unwrap();
        assert!(
            subscribe(&subs, &audit, &[EventKind::Result], &store).unwrap_err().contains("configuration")
        );
        subscribe(&subs, &ops, &[EventKind::Result, EventKind::LinkDown, EventKind::Result], &store).unwrap();
        assert_eq!(subs.targets(EventKind::Result), std::slice::from_ref(&ops));
        assert_eq!(subs.targets(EventKind::LinkUp), std::slice::from_ref(&audit));
        // Subscribing again replaces the kinds.
        subscribe(&subs, &ops, &[EventKind::Expired], &store).unwrap();
        assert!(subs.targets(EventKind::Result).is_empty());

        // What a client made is read back from the store; the configuration's is not stored.
        let again = Subscriptions::load(&config, &store).unwrap();
        assert_eq!(again.all(), subs.all());
        assert!(unsubscribe(&again, &audit, &store).unwrap_err().contains("configuration"));
        unsubscribe(&again, &ops, &store).unwrap();
        assert!(unsubscribe(&again, &ops, &store).unwrap_err().contains("no subscription"));
        assert_eq!(Subscriptions::load(&config, &store).unwrap().all().len(), 1);

        // `all` stays `all`; a queue gone from reach, or now subscribed by the configuration,
        // is removed at the next start.
        subscribe(&subs, &ops, &EventKind::ALL, &store).unwrap();
        assert!(store.get(SUBSCRIPTIONS_SPACE, b"B:ops").unwrap().is_some_and(|v| &v[..] == b"all"));
        let gone: Address = "C:gone".parse().unwrap();
        subscribe(&subs, &gone, &[EventKind::Result], &store).unwrap();
        let mut config = config.to_vec();
        config.push(crate::config::Subscription {
            kinds: vec![EventKind::LinkUp],
            to: ops.clone(),
            path: "p".into(),
        });
        let again = Subscriptions::load(&config, &store).unwrap();
        let forget = again
            .remove_unreachable(|to| if to.node.as_str() == "C" { Err("no peer".into()) } else { Ok(()) });
        store.write(forget, true).unwrap();
        assert!(again.all().iter().all(|s| !s.from_client), "{:?}", again.all());
        assert!(
            store
                .scan(SUBSCRIPTIONS_SPACE, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, 10)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn kinds_read_back_and_unknown_ones_are_explained() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>(), Ok(kind));
        }
        let err = "link_flap".parse::<EventKind>().unwrap_err();
        assert!(err.contains("expected all or one of link_up"), "{err}");
    }
}
