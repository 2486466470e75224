//! The bytes of the filter ABI v1 (`docs/filter-abi.md`) on the host's side: a batch of
//! messages written for the guest, and the guest's verdicts read back, every length and
//! name checked against the message limits before anything is kept. Nothing a guest writes
//! can make this code panic or allocate past the verdict buffer's own size.

use linkbus_plugin_api::message::{
    HEADER_KEY_BYTES_MAX, HEADER_VALUE_BYTES_MAX, HEADERS_MAX, RECIPIENTS_MAX,
};
use linkbus_plugin_api::{Address, HeaderChange, Message, Reliability, Verdict};

/// Where a filter is called, as the ABI numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiHook {
    /// At the origin, after the put is checked.
    OnSend = 0,
    /// At the origin, where recipients may be set.
    OnRoute = 1,
    /// At a relay.
    OnForward = 2,
    /// At the destination, before the queue.
    OnDeliver = 3,
}

/// Longest drop reason kept, in bytes (a longer one is cut).
pub const REASON_BYTES_MAX: usize = 1024;

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Writes `messages` as a batch; a sealed message's payload is written empty (a filter
/// never sees a sealed payload, nor the bytes of one).
pub fn encode_batch(messages: &[&Message], out: &mut Vec<u8>) {
    put_u32(out, messages.len());
    for message in messages {
        let content = &message.content;
        let sealed = message.is_encoded();
        let flags = u32::from(sealed)
            | u32::from(content.reliability == Reliability::Persistent) << 1
            | u32::from(content.results) << 2;
        out.extend_from_slice(&flags.to_le_bytes());
        put_bytes(out, message.id.source.as_str().as_bytes());
        out.extend_from_slice(&message.id.sequence.to_le_bytes());
        out.extend_from_slice(&u32::from(content.priority.code()).to_le_bytes());
        out.extend_from_slice(&u32::from(message.hop_count).to_le_bytes());
        put_bytes(out, content.name.as_bytes());
        put_u32(out, content.recipients.len());
        for to in &content.recipients {
            let (node, queue) = (to.node.as_str().as_bytes(), to.queue.as_str().as_bytes());
            put_u32(out, node.len() + 1 + queue.len());
            out.extend_from_slice(node);
            out.push(b':');
            out.extend_from_slice(queue);
        }
        put_u32(out, content.headers.len());
        for (key, value) in &content.headers {
            put_bytes(out, key.as_bytes());
            put_bytes(out, value.as_bytes());
        }
        put_bytes(out, if sealed { &[] } else { &content.payload });
    }
}

/// Reads what a guest wrote, refusing anything out of bounds.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.bytes.len());
        let end =
            end.ok_or_else(|| format!("{what}: {n} bytes at {} run past the verdicts' end", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<usize, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn bytes(&mut self, max: usize, what: &str) -> Result<&'a [u8], String> {
        let n = self.u32(what)?;
        if n > max {
            return Err(format!("{what} of {n} bytes is over {max}"));
        }
        self.take(n, what)
    }

    fn str(&mut self, max: usize, what: &str) -> Result<&'a str, String> {
        std::str::from_utf8(self.bytes(max, what)?).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn count(&mut self, max: usize, what: &str) -> Result<usize, String> {
        let n = self.u32(what)?;
        if n > max {
            return Err(format!("{n} {what} is over {max}"));
        }
        Ok(n)
    }
}

/// Reads the guest's verdicts on a batch of `count` messages at `hook`, each payload at
/// most `payload_bytes_max`.
///
/// # Errors
/// What is wrong, in words: a count other than the batch's, a length past the end or over a
/// limit, an unknown tag, a bad address, a route outside `on_route`, bytes left over.
pub fn decode_verdicts(
    bytes: &[u8],
    count: usize,
    hook: AbiHook,
    payload_bytes_max: usize,
) -> Result<Vec<Verdict>, String> {
    let mut r = Reader { bytes, at: 0 };
    let got = r.u32("verdict count")?;
    if got != count {
        return Err(format!("{got} verdicts for a batch of {count}"));
    }
    let mut verdicts = Vec::with_capacity(count);
    for index in 0..count {
        let verdict = match r.u8("verdict")? {
            0 => Verdict::Pass,
            1 => {
                let reason = r.bytes(usize::MAX, "drop reason")?;
                let reason = String::from_utf8_lossy(&reason[..reason.len().min(REASON_BYTES_MAX)]);
                Verdict::Drop { reason: reason.into_owned() }
            }
            2 => {
                let payload = match r.u8("payload flag")? {
                    0 => None,
                    1 => Some(bytes::Bytes::copy_from_slice(r.bytes(payload_bytes_max, "payload")?)),
                    other => return Err(format!("message {index}: payload flag {other}")),
                };
                let n = r.count(HEADERS_MAX * 2, "header changes")?;
                let mut headers = Vec::with_capacity(n);
                for _ in 0..n {
                    let op = r.u8("header change")?;
                    let key = r.str(HEADER_KEY_BYTES_MAX, "header key")?.to_owned();
                    if key.is_empty() || key.starts_with("linkbus.") {
                        return Err(format!(
                            "message {index}: header key '{key}' may not be set by a filter"
                        ));
                    }
                    headers.push(match op {
                        0 => {
                            HeaderChange::Set(key, r.str(HEADER_VALUE_BYTES_MAX, "header value")?.to_owned())
                        }
                        1 => HeaderChange::Remove(key),
                        other => return Err(format!("message {index}: header change {other}")),
                    });
                }
                Verdict::Change { payload, headers }
            }
            3 if hook == AbiHook::OnRoute => {
                let n = r.count(RECIPIENTS_MAX, "recipients")?;
                if n == 0 {
                    return Err(format!("message {index}: a route names no recipient"));
                }
                let recipients = (0..n)
                    .map(|_| {
                        let text = r.str(256, "recipient")?;
                        text.parse::<Address>()
                            .map_err(|e| format!("message {index}: recipient '{text}': {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Verdict::Route(recipients)
            }
            3 => return Err(format!("message {index}: a route outside on_route")),
            other => return Err(format!("message {index}: unknown verdict {other}")),
        };
        verdicts.push(verdict);
    }
    if r.at != bytes.len() {
        return Err(format!("{} bytes after the last verdict", bytes.len() - r.at));
    }
    Ok(verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdicts(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    fn len(n: usize) -> Vec<u8> {
        (n as u32).to_le_bytes().to_vec()
    }

    #[test]
    fn verdicts_are_read_and_checked() {
        let good = verdicts(&[
            &len(3),
            &[0],
            &[1],
            &len(4),
            b"spam",
            &[2, 1],
            &len(2),
            b"{}",
            &len(2),
            &[0],
            &len(1),
            b"k",
            &len(1),
            b"v",
            &[1],
            &len(1),
            b"x",
        ]);
        let read = decode_verdicts(&good, 3, AbiHook::OnDeliver, 1024).unwrap();
        assert_eq!(read[0], Verdict::Pass);
        assert_eq!(read[1], Verdict::Drop { reason: "spam".into() });
        assert_eq!(
            read[2],
            Verdict::Change {
                payload: Some(bytes::Bytes::from_static(b"{}")),
                headers: vec![HeaderChange::Set("k".into(), "v".into()), HeaderChange::Remove("x".into())]
            }
        );
        for (bytes, count, hook, says) in [
            (verdicts(&[&len(2), &[0]]), 2, AbiHook::OnSend, "run past"),
            (verdicts(&[&len(1), &[0]]), 2, AbiHook::OnSend, "1 verdicts for a batch of 2"),
            (verdicts(&[&len(1), &[9]]), 1, AbiHook::OnSend, "unknown verdict 9"),
            (verdicts(&[&len(1), &[0], &[0]]), 1, AbiHook::OnSend, "after the last"),
            (verdicts(&[&len(1), &[3], &len(1), &len(3), b"C:q"]), 1, AbiHook::OnSend, "outside on_route"),
            (verdicts(&[&len(1), &[3], &len(1), &len(3), b"C/q"]), 1, AbiHook::OnRoute, "recipient 'C/q'"),
            (verdicts(&[&len(1), &[2, 1], &len(2000)]), 1, AbiHook::OnSend, "over 1024"),
            (
                verdicts(&[&len(1), &[2, 0], &len(1), &[0], &len(11), b"linkbus.x=1", &len(0)]),
                1,
                AbiHook::OnSend,
                "may not be set",
            ),
        ] {
            let error = decode_verdicts(&bytes, count, hook, 1024).unwrap_err();
            assert!(error.contains(says), "{says}: {error}");
        }
        let routed = verdicts(&[&len(1), &[3], &len(2), &len(8), b"C:orders", &len(12), b"AUDIT:review"]);
        assert_eq!(
            decode_verdicts(&routed, 1, AbiHook::OnRoute, 0).unwrap(),
            [Verdict::Route(vec!["C:orders".parse().unwrap(), "AUDIT:review".parse().unwrap()])]
        );
    }

    #[test]
    fn any_bytes_are_refused_or_read_without_a_panic() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8 % 5).collect();
            let _ = decode_verdicts(&bytes, (seed % 3) as usize, AbiHook::OnRoute, 16);
        }
    }
}
