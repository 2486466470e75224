//! Names: node names, queue names and `node:queue` addresses, each validated on creation.
//!
//! A value of these types is always valid, so code that holds one never checks it again.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use smol_str::SmolStr;

/// Longest node name, in characters (TongLink/Q's rule).
pub const NODE_NAME_CHARS_MAX: usize = 20;
/// Longest queue name, in characters.
pub const QUEUE_NAME_CHARS_MAX: usize = 48;

/// Why a name or an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("{what} name is empty")]
    Empty {
        /// `node` or `queue`.
        what: &'static str,
    },
    /// The name is longer than its limit.
    #[error("{what} name '{name}' is {chars} characters long, at most {max} are allowed")]
    TooLong {
        /// `node` or `queue`.
        what: &'static str,
        /// The offending name.
        name: String,
        /// Its length in characters.
        chars: usize,
        /// The limit.
        max: usize,
    },
    /// The first character is not a letter.
    #[error("{what} name '{name}' must start with a letter")]
    BadStart {
        /// `node` or `queue`.
        what: &'static str,
        /// The offending name.
        name: String,
    },
    /// A character outside the allowed set.
    #[error("{what} name '{name}' contains '{ch}'; allowed are letters, digits{extra}")]
    BadChar {
        /// `node` or `queue`.
        what: &'static str,
        /// The offending name.
        name: String,
        /// The first character that is not allowed.
        ch: char,
        /// The rest of the allowed set, for the message.
        extra: &'static str,
    },
    /// An address without the `:` between node and queue.
    #[error("address '{0}' is not of the form NODE:QUEUE")]
    BadAddress(String),
}

fn check(
    what: &'static str,
    name: &str,
    max: usize,
    extra_chars: &[u8],
    extra: &'static str,
) -> Result<(), NameError> {
    // A good name, the usual case, in one pass over its bytes (all ASCII, so as many bytes
    // as characters); any other is taken apart below for the error.
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || extra_chars.contains(b);
    if bytes.len() <= max && bytes.first().is_some_and(u8::is_ascii_alphabetic) && bytes.iter().all(allowed) {
        return Ok(());
    }
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(NameError::Empty { what });
    };
    let count = name.chars().count();
    if count > max {
        return Err(NameError::TooLong { what, name: name.to_owned(), chars: count, max });
    }
    if !first.is_ascii_alphabetic() {
        return Err(NameError::BadStart { what, name: name.to_owned() });
    }
    let extra_char = |c: char| u8::try_from(c).is_ok_and(|b| extra_chars.contains(&b));
    if let Some(ch) = chars.find(|c| !(c.is_ascii_alphanumeric() || extra_char(*c))) {
        return Err(NameError::BadChar { what, name: name.to_owned(), ch, extra });
    }
    Ok(())
}

/// Longer names a thread made lately, so that one read again (every message names its
/// recipients) shares the string made before instead of being allocated again:
/// a handful of queues is the common case, and a name not among them only costs a scan.
struct Recent {
    names: Vec<SmolStr>,
    next: usize,
}

/// Longer names kept per thread.
const RECENT_NAMES: usize = 16;

thread_local! {
    static RECENT: RefCell<Recent> = const { RefCell::new(Recent { names: Vec::new(), next: 0 }) };
}

/// `name`, `check`ed, as a string: inline when short, else the same text made lately on this
/// thread or a new one, kept.
///
/// Names of up to [`SmolStr::INLINE_CAP`] bytes (23: every node name, most queue names) are
/// held inline and made again from their text, not shared, so copying, comparing and
/// dropping one touches no reference count that other threads touch too.
/// Perf (OPT-36): made with `new_inline`, inlined here, as `SmolStr::new` passes the bytes
/// through two more stack copies, each read back at once as wider words (store-forwarding
/// stalls).
fn made(name: &str, check: impl FnOnce(&str) -> Result<(), NameError>) -> Result<SmolStr, NameError> {
    // Checked first in every case: the names kept are of both kinds.
    check(name)?;
    if name.len() <= SmolStr::INLINE_CAP {
        return Ok(SmolStr::new_inline(name));
    }
    let known = RECENT.with_borrow(|r| r.names.iter().find(|n| same(n, name)).cloned());
    if let Some(known) = known {
        return Ok(known);
    }
    let made = SmolStr::new(name);
    RECENT.with_borrow_mut(|r| {
        let slot = r.next;
        r.next = (slot + 1) % RECENT_NAMES;
        match r.names.get_mut(slot) {
            Some(old) => *old = made.clone(),
            None => r.names.push(made.clone()),
        }
    });
    Ok(made)
}

/// Whether two names are the same text, compared byte by byte in place: names are short,
/// and most candidates differ in length or first byte, where a call to `memcmp` costs more
/// than the comparison.
#[inline]
fn same(known: &str, name: &str) -> bool {
    known.len() == name.len() && known.bytes().zip(name.bytes()).all(|(a, b)| a == b)
}

/// The name of a node: ASCII letters, digits, `.` and `_`, starting with a letter, at most
/// [`NODE_NAME_CHARS_MAX`] characters.
///
/// ```
/// use linkbus_plugin_api::NodeName;
/// assert!(NodeName::new("A.east_1").is_ok());
/// assert!(NodeName::new("1a").is_err());
/// ```
#[derive(Debug, Clone, PartialOrd, Ord)]
pub struct NodeName(SmolStr);

impl NodeName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    /// [`NameError`] naming the rule the name breaks.
    pub fn new(name: &str) -> Result<Self, NameError> {
        made(name, |n| check("node", n, NODE_NAME_CHARS_MAX, b"._", ", '.' and '_'")).map(Self)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name of a queue on a node: ASCII letters, digits, `.`, `_` and `-`, starting with a
/// letter, at most [`QUEUE_NAME_CHARS_MAX`] characters.
#[derive(Debug, Clone, PartialOrd, Ord)]
pub struct QueueName(SmolStr);

impl QueueName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    /// [`NameError`] naming the rule the name breaks.
    pub fn new(name: &str) -> Result<Self, NameError> {
        made(name, |n| check("queue", n, QUEUE_NAME_CHARS_MAX, b"._-", ", '.', '_' and '-'")).map(Self)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a message goes: a queue on a node, written `NODE:QUEUE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    /// The destination node.
    pub node: NodeName,
    /// The queue on that node.
    pub queue: QueueName,
}

impl Address {
    /// Builds an address from its two parts.
    pub fn new(node: NodeName, queue: QueueName) -> Self {
        Self { node, queue }
    }
}

macro_rules! text_impls {
    ($ty:ty) => {
        impl FromStr for $ty {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        // By hand, not derived: the text byte by byte (see `same`); hashed as the text, as
        // `Borrow<str>` requires.
        impl PartialEq for $ty {
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                same(&self.0, &other.0)
            }
        }
        impl Eq for $ty {}
        impl std::hash::Hash for $ty {
            #[inline]
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }
        impl std::borrow::Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}
text_impls!(NodeName);
text_impls!(QueueName);

impl FromStr for Address {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (node, queue) = s.split_once(':').ok_or_else(|| NameError::BadAddress(s.to_owned()))?;
        Ok(Self { node: NodeName::new(node)?, queue: QueueName::new(queue)? })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_made_on_other_threads_are_equal_and_hash_as_their_text() {
        let here = NodeName::new("A.east_1").unwrap();
        let there = std::thread::spawn(|| NodeName::new("A.east_1").unwrap()).join().unwrap();
        assert_eq!(here, there);
        assert_ne!(here, NodeName::new("A.east_2").unwrap());
        assert_ne!(here, NodeName::new("A.east").unwrap());
        let queues: std::collections::HashSet<QueueName> =
            ["orders", "DLQ"].into_iter().map(|q| QueueName::new(q).unwrap()).collect();
        let orders = std::thread::spawn(|| QueueName::new("orders").unwrap()).join().unwrap();
        assert!(queues.contains(&orders) && queues.contains("orders") && !queues.contains("order"));
        // Long names, shared on their thread, are equal across threads too.
        let long = "orders_of_the_eastern_region_2026";
        let there = std::thread::spawn(move || QueueName::new(long).unwrap()).join().unwrap();
        assert!(there.as_str().as_ptr() != QueueName::new(long).unwrap().as_str().as_ptr());
        assert_eq!(there, QueueName::new(long).unwrap());
        // A long queue name kept on this thread is no node name.
        assert!(matches!(NodeName::new(long), Err(NameError::TooLong { chars: 33, .. })));
    }

    #[test]
    fn names_are_inline_or_shared_and_bad_names_are_refused_however_many_good_ones_came_before() {
        // Every node name is held inline: no count shared between threads.
        let longest = NodeName::new(&"A".repeat(NODE_NAME_CHARS_MAX)).unwrap();
        assert!(!longest.0.is_heap_allocated());
        // A long queue name made again is the first one, shared.
        let long = "q".repeat(QUEUE_NAME_CHARS_MAX);
        let (a, again) = (QueueName::new(&long).unwrap(), QueueName::new(&long).unwrap());
        assert!(a.0.is_heap_allocated() && a.as_str().as_ptr() == again.as_str().as_ptr());
        // More names than are kept: each is still itself, and checked.
        let many: Vec<QueueName> =
            (0..3 * RECENT_NAMES).map(|i| QueueName::new(&format!("q{i}")).unwrap()).collect();
        for (i, name) in many.iter().enumerate() {
            assert_eq!(name.as_str(), format!("q{i}"));
        }
        assert!(NodeName::new("1A").is_err());
        assert!(QueueName::new("q 1").is_err());
        // A queue name is not taken for a node name, nor the other way round.
        assert!(NodeName::new("q-1").is_err(), "'-' is allowed in queue names only");
        QueueName::new("q-1").unwrap();
        assert!(NodeName::new("q-1").is_err());
    }

    #[test]
    fn node_names_follow_the_rule() {
        for good in ["A", "a1", "node.east_2", "Abcdefghijklmnopqrst"] {
            assert!(NodeName::new(good).is_ok(), "{good}");
        }
        let too_long = "Abcdefghijklmnopqrstu";
        assert!(matches!(NodeName::new(too_long), Err(NameError::TooLong { chars: 21, .. })));
        assert!(matches!(NodeName::new(""), Err(NameError::Empty { .. })));
        assert!(matches!(NodeName::new("_a"), Err(NameError::BadStart { .. })));
        assert!(matches!(NodeName::new("a-b"), Err(NameError::BadChar { ch: '-', .. })));
        assert!(matches!(NodeName::new("a:b"), Err(NameError::BadChar { ch: ':', .. })));
        assert!(matches!(NodeName::new("é"), Err(NameError::BadStart { .. })));
    }

    proptest::proptest! {
        #[test]
        fn node_names_are_accepted_exactly_by_the_rule(name in "\\PC{0,24}") {
            let mut chars = name.chars();
            let rule = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
                && name.chars().count() <= NODE_NAME_CHARS_MAX;
            proptest::prop_assert_eq!(NodeName::new(&name).is_ok(), rule);
        }
    }

    #[test]
    fn addresses_parse_and_print() {
        let a: Address = "B:orders-eu".parse().unwrap();
        assert_eq!(a.node.as_str(), "B");
        assert_eq!(a.to_string(), "B:orders-eu");
        assert!(matches!("B".parse::<Address>(), Err(NameError::BadAddress(_))));
        assert!("B:".parse::<Address>().is_err());
        assert!("B:a:b".parse::<Address>().is_err());
    }
}
