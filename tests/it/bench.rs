//! `linkbus bench --quick` runs every workload with its baseline side by side and prints the
//! table and, with `--json`, one object per row. (How fast is for BENCHMARKS.md, not for a
//! test: nothing here compares numbers.)

use crate::support;

use support::{Scratch, stderr, stdout};

#[test]
fn bench_runs_every_workload_against_its_baseline() {
    let s = Scratch::new();
    let out = s.run(&["bench", "--quick", "--json"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    check_full_run(&stdout(&out));
    assert!(!stderr(&out).contains("WARN"), "plaintext warnings are not shown: {}", stderr(&out));

    let one = s.run(&["bench", "--quick", "w4"]);
    assert!(one.status.success(), "{}", stderr(&one));
    let rows: Vec<String> = stdout(&one).lines().filter(|l| l.starts_with('w')).map(str::to_owned).collect();
    assert_eq!(rows.len(), 1, "only w4 (its w1 baseline is measured, not shown): {rows:?}");
    let sized = s.run(&["bench", "--quick", "w1", "--size", "1024"]);
    assert!(sized.status.success(), "{}", stderr(&sized));
    let rows: Vec<String> =
        stdout(&sized).lines().filter(|l| l.starts_with('w')).map(str::to_owned).collect();
    assert!(
        rows.len() == 3 && rows.iter().all(|r| r.contains("1 KiB")),
        "only the 1 KiB cases of w1: {rows:?}"
    );
    let rounds = s.run(&["bench", "--quick", "w1", "--size", "64", "--rounds", "3"]);
    assert!(rounds.status.success(), "{}", stderr(&rounds));
    let text = stdout(&rounds);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('w')).collect();
    assert!(
        rows.len() == 3 && rows.iter().all(|r| r.contains("median of 3 rounds; ratio per round")),
        "{text}"
    );
    let odd = s.run(&["bench", "w1", "--size", "100"]);
    assert!(!odd.status.success());
    assert!(stderr(&odd).contains("the sizes are 64, 1024, 65536, 1048576"), "{}", stderr(&odd));
    let empty = s.run(&["bench", "--quick", "w4", "--size", "64"]);
    assert!(!empty.status.success());
    assert!(
        stderr(&empty).contains("none of the named workloads has a case of 64 bytes"),
        "{}",
        stderr(&empty)
    );
    let bad = s.run(&["bench", "w9"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("w9"), "{}", stderr(&bad));
}

/// The rows of a full `--json` run: every workload's, in order, each saying what it is.
fn check_full_run(text: &str) {
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('w')).collect();
    let workloads: Vec<&str> = rows.iter().filter_map(|l| l.split_whitespace().next()).collect();
    let expected = [
        "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w2", "w2", "w2", "w2", "w3",
        "w3", "w4", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w5", "w6",
        "w7", "w7",
    ];
    assert_eq!(workloads, expected, "{text}");
    assert!(rows[0].contains("64 B") && rows[9].contains("1 MiB"), "{text}");
    assert!(
        !rows[0].contains("in-process") && rows[1].contains("64 B") && rows[1].contains("in-process clients"),
        "{text}"
    );
    assert!(rows[10].contains("1 MiB") && rows[10].contains("in-process clients"), "{text}");
    // Each size's third row sets the client sockets' case against its socket hops alone.
    for (row, size) in [2, 5, 8, 11].map(|i| rows[i]).iter().zip(["64 B", "1 KiB", "64 KiB", "1 MiB"]) {
        assert!(row.contains(size) && row.contains("the client sockets' case"), "{text}");
        assert!(
            row.contains("(against its socket hops carrying the bytes alone: Unix socket, TCP, Unix socket)")
        );
        assert!(row.contains("the hops alone carry") && row.contains("x of raw TCP"), "{text}");
    }
    for (row, store) in rows[12..16].iter().zip(["fjall", "fjall", "log", "log"]) {
        assert!(row.contains("puts per sync") && row.contains("fdatasync"), "{text}");
        assert!(row.contains("% of what group commit allows (syncs/s x puts per sync: "), "{text}");
        assert!(
            row.contains(&format!("store {store} (against {store} syncing each record alone)")),
            "{text}"
        );
    }
    assert!(rows[13].contains("256 persistent puts per request"), "{text}");
    assert!(rows[15].contains("256 persistent puts per request"), "{text}");
    assert!(rows[16].contains("p50/p99/p99.9") && rows[16].contains("client socket"), "{text}");
    assert!(rows[16].contains("its socket hops carrying the bytes alone"), "{text}");
    assert!(rows[17].contains("p50/p99/p99.9") && rows[17].contains("Node::client"), "{text}");
    assert!(!rows[17].contains("socket hops"), "{text}");
    // Per size: Noise with each cipher, then zstd, the payload cipher, and both, then a
    // pass-through filter and the JSON redactor.
    for (sized, size) in [(&rows[19..26], "1 KiB"), (&rows[26..33], "64 KiB")] {
        assert!(sized.iter().all(|row| row.contains(size)), "{text}");
        for (row, cipher) in sized.iter().zip(["aes-256-gcm", "chacha20-poly1305"]) {
            assert!(row.contains(&format!("over Noise ({cipher})")), "{text}");
        }
        for (row, stage) in
            sized[2..5].iter().zip(["zstd level 3,", "payload sealed end to end", "zstd, then sealed"])
        {
            assert!(
                row.contains(stage) && row.contains("(against w1: no stages, the same payloads)"),
                "{text}"
            );
        }
        for (row, filter) in sized[5..].iter().zip(["a pass-through WebAssembly filter", "the JSON redactor"])
        {
            assert!(row.contains(filter) && row.contains("us more per message"), "{text}");
        }
    }
    assert!(rows[33].contains("linkbus file send") && rows[33].contains("peak RSS A"), "{text}");
    assert!(rows[34].contains("urgent put-to-get p50/p99/max"), "{text}");
    assert!(
        rows[35].contains("urgent put-to-get p50/p99/max") && rows[35].contains("while files cross"),
        "{text}"
    );
    assert_eq!(text.matches("\"workload\":").count(), 36, "{text}");
}
