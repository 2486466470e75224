//! Write linkbus filters in Rust. Implement [`Filter`] for a type and name it in
//! [`export_filter!`]; the macro writes the exports of the filter ABI v1
//! (`docs/filter-abi.md`). No dependencies, no `unsafe`; builds on rustc 1.63.
//!
//! ```ignore
//! struct Keep;
//! impl linkbus_filter_sdk::Filter for Keep {
//!     fn init(_config: &str) -> Result<Self, String> { Ok(Keep) }
//!     fn filter(&mut self, _hook: Hook, _message: &Message) -> Verdict { Verdict::Pass }
//! }
//! linkbus_filter_sdk::export_filter!(Keep);
//! ```

use std::cell::RefCell;

/// Where on its path the message meets the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// At the origin, after the put is checked.
    OnSend,
    /// At the origin, where recipients may be set (content-based routing).
    OnRoute,
    /// At a relay.
    OnForward,
    /// At the destination, before the queue.
    OnDeliver,
}

impl Hook {
    fn from_code(code: i32) -> Option<Self> {
        match code {
            0 => Some(Self::OnSend),
            1 => Some(Self::OnRoute),
            2 => Some(Self::OnForward),
            3 => Some(Self::OnDeliver),
            _ => None,
        }
    }
}

/// A message as a filter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    /// Its payload is sealed end to end: [`Message::payload`] is empty.
    pub sealed: bool,
    /// It is persistent.
    pub persistent: bool,
    /// The node that accepted it.
    pub source: &'a str,
    /// Its sequence number at the source.
    pub sequence: u64,
    /// Priority 0..=9.
    pub priority: u32,
    /// Relays crossed so far.
    pub hop_count: u32,
    /// Its name.
    pub name: &'a str,
    /// Its recipients, `node:queue`.
    pub recipients: Vec<&'a str>,
    /// Its headers.
    pub headers: Vec<(&'a str, &'a str)>,
    /// Its payload.
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// The value of header `key`, if it has one.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// A change to a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderOp {
    /// Set `key` to `value`.
    Set(String, String),
    /// Remove `key`.
    Remove(String),
}

/// What the filter decided for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it go on unchanged.
    Pass,
    /// Remove it, with a reason.
    Drop(String),
    /// Change its payload (when `Some`) and headers.
    Change {
        /// The new payload.
        payload: Option<Vec<u8>>,
        /// Header changes, in order.
        headers: Vec<HeaderOp>,
    },
    /// Replace its recipients (`on_route` only).
    Route(Vec<String>),
}

/// A filter: made once from its configuration, then called for each message.
pub trait Filter: Sized {
    /// Makes the filter from its `config:` value (JSON); an error refuses to start it.
    fn init(config: &str) -> Result<Self, String>;

    /// Decides on one message.
    fn filter(&mut self, hook: Hook, message: &Message) -> Verdict;
}

/// The value of `field` in the flat JSON object `json` (a filter's configuration, or a
/// payload), as text: a string without its quotes (escapes kept as written), or a number,
/// `true`, `false` or `null` as written. `None` when the field is absent.
pub fn json_field<'a>(json: &'a str, field: &str) -> Option<&'a str> {
    let (_, value) = json_field_span(json, field)?;
    Some(value)
}

/// The text of the required `field` of a filter's configuration `json` (for
/// [`Filter::init`]); its absence in the words a node shows.
pub fn config_text(json: &str, field: &str) -> Result<String, String> {
    json_field(json, field).map(str::to_owned).ok_or_else(|| format!("configuration needs \"{}\"", field))
}

/// The `field` of a filter's configuration `json` read as a `T` (a count, a number), or
/// `default` when it is absent (`None`: it is required).
pub fn config_parsed<T: std::str::FromStr>(json: &str, field: &str, default: Option<T>) -> Result<T, String> {
    match json_field(json, field) {
        Some(text) => text.parse().map_err(|_| format!("{}: '{}' is not a valid value", field, text)),
        None => default.ok_or_else(|| format!("configuration needs \"{}\"", field)),
    }
}

/// Where the value of `field` is in `json`: its byte range (inside the quotes for a
/// string), and the value. Looks for the first `"field"` followed by `:`.
pub fn json_field_span<'a>(json: &'a str, field: &str) -> Option<(std::ops::Range<usize>, &'a str)> {
    let quoted = format!("\"{}\"", field);
    let mut from = 0;
    while let Some(found) = json[from..].find(&quoted) {
        let after_key = from + found + quoted.len();
        let rest = &json[after_key..];
        let trimmed = rest.trim_start();
        if let Some(value) = trimmed.strip_prefix(':') {
            let value_at = json.len() - value.trim_start().len();
            let value = &json[value_at..];
            if let Some(body) = value.strip_prefix('"') {
                let mut escaped = false;
                for (i, c) in body.char_indices() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => {
                            let start = value_at + 1;
                            return Some((start..start + i, &body[..i]));
                        }
                        _ => escaped = false,
                    }
                }
                return None;
            }
            let end = value.find(|c: char| c == ',' || c == '}' || c == ']' || c.is_whitespace()).unwrap_or(value.len());
            return Some((value_at..value_at + end, &value[..end]));
        }
        from = after_key;
    }
    None
}

/// The filter's configuration (its `config:` value, as JSON), read again from the node at
/// any time: the same text `Filter::init` was given.
pub fn config() -> String {
    let mut buffer = vec![0; 256];
    let mut len = imports::config_read(&mut buffer);
    if len > buffer.len() as i32 {
        buffer.resize(len as usize, 0);
        len = imports::config_read(&mut buffer);
    }
    buffer.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buffer).into_owned()
}

/// A line in the node's log.
pub fn log(line: &str) {
    imports::log(1, line);
}

/// Adds `delta` to the counter `name`, shown in `linkbus status`.
pub fn counter_add(name: &str, delta: i64) {
    imports::counter_add(name, delta);
}

#[cfg(target_arch = "wasm32")]
mod imports {
    #[link(wasm_import_module = "linkbus")]
    extern "C" {
        #[link_name = "log"]
        fn host_log(level: i32, ptr: i32, len: i32);
        #[link_name = "counter_add"]
        fn host_counter_add(name: i32, len: i32, delta: i64);
        #[link_name = "config_read"]
        fn host_config_read(ptr: i32, len: i32) -> i32;
    }

    pub(crate) fn config_read(buffer: &mut [u8]) -> i32 {
        // SAFETY: the host writes at most `len` bytes at `ptr` of this module's memory, checked.
        #[allow(unsafe_code)]
        unsafe {
            host_config_read(buffer.as_mut_ptr() as i32, buffer.len() as i32)
        }
    }

    pub(crate) fn log(level: i32, line: &str) {
        // SAFETY: the host reads `len` bytes at `ptr` of this module's memory, checked.
        #[allow(unsafe_code)]
        unsafe {
            host_log(level, line.as_ptr() as i32, line.len() as i32)
        }
    }

    pub(crate) fn counter_add(name: &str, delta: i64) {
        // SAFETY: as `log`.
        #[allow(unsafe_code)]
        unsafe {
            host_counter_add(name.as_ptr() as i32, name.len() as i32, delta)
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imports {
    pub(crate) fn log(_level: i32, _line: &str) {}
    pub(crate) fn counter_add(_name: &str, _delta: i64) {}
    pub(crate) fn config_read(_buffer: &mut [u8]) -> i32 {
        0
    }
}

thread_local! {
    /// Where the host writes a batch (`linkbus_alloc`), and where verdicts are written.
    static BUFFERS: RefCell<(Vec<u8>, Vec<u8>)> = RefCell::new((Vec::new(), Vec::new()));
}

/// `linkbus_alloc`: room for `len` bytes the host will write; its address.
#[doc(hidden)]
pub fn alloc(len: i32) -> i32 {
    BUFFERS.with(|b| {
        let input = &mut b.borrow_mut().0;
        // Zeroed only where it grows: the host writes every byte of the block.
        let len = len.max(0) as usize;
        if input.len() < len {
            input.resize(len, 0);
        } else {
            input.truncate(len);
        }
        input.as_mut_ptr() as i32
    })
}

/// `linkbus_filter`: decides on the batch in the input buffer with `filter`.
#[doc(hidden)]
pub fn run<F: Filter>(filter: &mut F, hook: i32, ptr: i32, len: i32) -> i64 {
    BUFFERS.with(|b| {
        let (input, output) = &mut *b.borrow_mut();
        let hook = match Hook::from_code(hook) {
            Some(hook) => hook,
            None => return -2,
        };
        if ptr != input.as_ptr() as i32 || len as usize != input.len() {
            return -2;
        }
        let messages = match decode_batch(input) {
            Some(messages) => messages,
            None => return -2,
        };
        output.clear();
        put_u32(output, messages.len() as u32);
        let mut all_pass = true;
        for message in &messages {
            let verdict = filter.filter(hook, message);
            all_pass &= verdict == Verdict::Pass;
            encode_verdict(output, &verdict);
        }
        if all_pass {
            // The host needs nothing read back.
            return -1;
        }
        ((output.as_ptr() as i64) << 32) | output.len() as i64
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let lo = self.u32()? as u64;
        let hi = self.u32()? as u64;
        Some(lo | hi << 32)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

fn decode_batch(bytes: &[u8]) -> Option<Vec<Message<'_>>> {
    let mut r = Reader { bytes, at: 0 };
    let count = r.u32()? as usize;
    let mut messages = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        let flags = r.u32()?;
        let source = r.str()?;
        let sequence = r.u64()?;
        let priority = r.u32()?;
        let hop_count = r.u32()?;
        let name = r.str()?;
        let recipients = (0..r.u32()?).map(|_| r.str()).collect::<Option<Vec<_>>>()?;
        let headers = (0..r.u32()?).map(|_| Some((r.str()?, r.str()?))).collect::<Option<Vec<_>>>()?;
        let payload = r.bytes()?;
        messages.push(Message {
            sealed: flags & 1 != 0,
            persistent: flags & 2 != 0,
            source,
            sequence,
            priority,
            hop_count,
            name,
            recipients,
            headers,
            payload,
        });
    }
    (r.at == bytes.len()).then(|| messages)
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

fn encode_verdict(out: &mut Vec<u8>, verdict: &Verdict) {
    match verdict {
        Verdict::Pass => out.push(0),
        Verdict::Drop(reason) => {
            out.push(1);
            put_bytes(out, reason.as_bytes());
        }
        Verdict::Change { payload, headers } => {
            out.push(2);
            match payload {
                Some(p) => {
                    out.push(1);
                    put_bytes(out, p);
                }
                None => out.push(0),
            }
            put_u32(out, headers.len() as u32);
            for op in headers {
                match op {
                    HeaderOp::Set(k, v) => {
                        out.push(0);
                        put_bytes(out, k.as_bytes());
                        put_bytes(out, v.as_bytes());
                    }
                    HeaderOp::Remove(k) => {
                        out.push(1);
                        put_bytes(out, k.as_bytes());
                    }
                }
            }
        }
        Verdict::Route(recipients) => {
            out.push(3);
            put_u32(out, recipients.len() as u32);
            for r in recipients {
                put_bytes(out, r.as_bytes());
            }
        }
    }
}

/// Writes the exports of the filter ABI v1 for the [`Filter`] type `$filter`.
#[macro_export]
macro_rules! export_filter {
    ($filter:ty) => {
        thread_local! {
            static LINKBUS_FILTER: ::std::cell::RefCell<Option<$filter>> = ::std::cell::RefCell::new(None);
        }

        #[no_mangle]
        pub extern "C" fn linkbus_abi_v1() -> i32 {
            1
        }

        #[no_mangle]
        pub extern "C" fn linkbus_alloc(len: i32) -> i32 {
            $crate::alloc(len)
        }

        #[no_mangle]
        pub extern "C" fn linkbus_init(ptr: i32, len: i32) -> i32 {
            let config = $crate::input_str(ptr, len);
            match <$filter as $crate::Filter>::init(&config) {
                Ok(filter) => {
                    LINKBUS_FILTER.with(|f| *f.borrow_mut() = Some(filter));
                    0
                }
                Err(why) => {
                    $crate::log(&why);
                    1
                }
            }
        }

        #[no_mangle]
        pub extern "C" fn linkbus_filter(hook: i32, ptr: i32, len: i32) -> i64 {
            LINKBUS_FILTER.with(|f| match f.borrow_mut().as_mut() {
                Some(filter) => $crate::run(filter, hook, ptr, len),
                None => -3,
            })
        }
    };
}

/// The input buffer as text (the configuration `linkbus_init` reads).
#[doc(hidden)]
pub fn input_str(ptr: i32, len: i32) -> String {
    BUFFERS.with(|b| {
        let input = &b.borrow().0;
        if ptr != input.as_ptr() as i32 || len as usize != input.len() {
            return String::new();
        }
        String::from_utf8_lossy(input).into_owned()
    })
}
