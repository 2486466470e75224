//! The newcomer's first command: `linkbus demo` delivers 10,000 messages intact and exits 0.

use crate::support;

use support::{Scratch, stderr, stdout};

#[test]
fn demo_delivers_every_message_intact() {
    let s = Scratch::new();
    let out = s.run(&["demo", "--messages", "10000"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("sent      10000 buffer messages"), "{text}");
    assert!(
        text.contains("received  10000 (10000 intact, 0 out of order, 0 duplicates, 0 missing)"),
        "{text}"
    );
    assert!(text.contains("messages/s"), "{text}");
    // Compressed with a dictionary, then sealed end to end; no data directory holds a
    // payload's plaintext.
    assert!(text.contains("stage     zstd at A: 10000 messages") && text.contains("ratio"), "{text}");
    // The cipher sealed the file's 128 chunks too (its rule names C:orders).
    assert!(text.contains("stage     chacha20poly1305 at A: 10128 messages"), "{text}");
    assert!(
        text.contains("file      32 MiB from A's files directory to C:orders through B (delivered)")
            && text.contains("C's copy has the same BLAKE3 digest"),
        "{text}"
    );
    for node in ["A", "B", "C"] {
        assert!(text.contains(&format!("node {node}'s data directory")) && !text.contains("HOLD"), "{text}");
    }
}
