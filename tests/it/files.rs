//! File messages (`linkbus file send`): files cross links and relays into the recipient's
//! files directory, whole and checked, whatever process is killed on the way; names that
//! break a rule, names taken, missing queues and changed sources are refused by name, and
//! nothing outside the files directories is touched.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::cluster::Cluster;
use crate::support::{NodeProcess, Scratch, stderr, stdout};

/// A window of 4 MiB, so a fault leaves little in flight; fast reconnects.
const FILES: &str = "plugins: { files: { kind: file, window_bytes: 4194304 } }\n\
                     links: { reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 200 }\n";
const MIB: u64 = 1 << 20;

fn files_dir(s: &Scratch, node: &str) -> PathBuf {
    s.path().join("linkbus-data").join(node).join("files")
}

/// Writes `size` bytes of noise (from `seed`) at `node`'s files directory under `name`.
fn write_file(s: &Scratch, node: &str, name: &str, size: u64, seed: u64) -> PathBuf {
    let path = files_dir(s, node).join(name);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
    let mut state = seed | 1;
    let mut bytes = Vec::with_capacity(size as usize);
    while (bytes.len() as u64) < size {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(size as usize);
    std::fs::write(&path, &bytes).expect("write");
    path
}

fn digest(path: &Path) -> String {
    blake3::hash(&std::fs::read(path).expect("read")).to_hex().to_string()
}

/// Sends `name` from `from` to `to` without waiting; returns the transfer's id.
fn send(s: &Scratch, from: &str, to: &str, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["file", "send", "--node", from, "--to", to, name, "--wait", "0s"];
    args.extend_from_slice(extra);
    let out = s.run(&args);
    assert!(out.status.success(), "send refused: {}", stderr(&out));
    stdout(&out).trim().to_owned()
}

/// Sends `name` from A to `to` and waits up to a minute for the result (`extra`: more
/// options).
fn send_and_wait(s: &Scratch, to: &str, name: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["file", "send", "--node", "A", "--to", to, name, "--wait", "60s"];
    args.extend_from_slice(extra);
    s.run(&args)
}

/// The results of transfer `id` at `from`, waiting up to `wait`.
fn result(s: &Scratch, from: &str, id: &str, wait: &str) -> String {
    stdout(&s.run(&["result", "--node", from, id, "--wait", wait]))
}

/// Bytes received so far of the transfer into `node` (0 when none is listed).
fn received(s: &Scratch, node: &str) -> u64 {
    let listing = stdout(&s.run(&["file", "ls", "--node", node]));
    let Some(line) = listing.lines().find(|l| l.starts_with("in ")) else { return 0 };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (size, percent): (u64, f64) =
        (fields[3].parse().expect("size"), fields[4].trim_end_matches('%').parse().expect("percent"));
    (size as f64 * percent / 100.0) as u64
}

/// Waits until `node` has received at least `bytes` of the transfer.
fn wait_received(s: &Scratch, node: &str, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while received(s, node) < bytes {
        assert!(Instant::now() < deadline, "{node} did not receive {bytes} bytes in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A counter of `linkbus status`'s files line (`again`, `discarded`, `resumes`, ...).
fn files_counter(s: &Scratch, node: &str, label: &str) -> u64 {
    let status = stdout(&s.run(&["status", "--node", node]));
    let line = status.lines().find(|l| l.starts_with("files:")).expect("a files line");
    let after = line.split(&format!("{label} ")).nth(1).unwrap_or_else(|| panic!("no '{label}' in {line}"));
    after.split([' ', ',', ')']).next().expect("a number").parse().expect("a number")
}

/// B's configuration: the window, and its queue `inbox`.
fn with_inbox() -> String {
    format!("{FILES}queues: [ {{ name: inbox }} ]\n")
}

/// A dials B (which has `inbox`), both with [`FILES`]; both started.
fn pair(s: &Scratch) -> (Cluster, std::collections::BTreeMap<String, NodeProcess>) {
    Cluster::up(s, &[("A", "B")], &[("A", FILES), ("B", &with_inbox())])
}

/// Waits until `node` holds no partial file (at most 20 s).
fn wait_no_partials(s: &Scratch, node: &str, log: &NodeProcess) {
    let partials = files_dir(s, node).join(".linkbus-partial");
    let deadline = Instant::now() + Duration::from_secs(20);
    while partials.read_dir().expect("partials").count() > 0 {
        assert!(Instant::now() < deadline, "the partial file stayed: {}", log.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn restart(cluster: &Cluster, s: &Scratch, node: &mut NodeProcess, name: &str) {
    node.kill();
    *node = cluster.start(s, name);
}

#[test]
fn killing_the_receiver_then_the_sender_resends_only_what_was_in_flight() {
    let s = Scratch::new();
    let (cluster, mut nodes) = pair(&s);
    let source = write_file(&s, "A", "data/big file.bin", 96 * MIB, 7);
    // Kill offsets drawn at random (the failure message names them): the receiver at 8 to
    // 40 MiB, the sender 10 to 40 MiB later.
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64;
    let (b_at, a_at) = (8 * MIB + seed % (32 * MIB), 10 * MIB + (seed >> 20) % (30 * MIB));
    let a_at = b_at + a_at;
    let id = send(&s, "A", "B:inbox", "data/big file.bin", &[]);
    wait_received(&s, "B", b_at);
    let mut b = nodes.remove("B").expect("B");
    restart(&cluster, &s, &mut b, "B");
    wait_received(&s, "B", a_at);
    // The receiver's kill cost at most the window and a chunk in flight.
    let again = files_counter(&s, "A", "again");
    assert!(again <= 4 * MIB + 256 * 1024, "A sent {again} bytes again after B's kill at {b_at}");
    let mut a = nodes.remove("A").expect("A");
    restart(&cluster, &s, &mut a, "A");
    assert!(result(&s, "A", &id, "120s").contains("B:inbox delivered"), "{}", a.log_text());
    assert_eq!(digest(&files_dir(&s, "B").join("data/big file.bin")), digest(&source));
    // After the sender's kill it went on from what B had checked: B dropped at most what
    // was in flight then.
    let discarded = files_counter(&s, "B", "discarded");
    assert!(discarded <= 4 * MIB + 256 * 1024, "B discarded {discarded} bytes after A's kill at {a_at}");
    assert!(b.log_text().contains("File received."));
    let notice = stdout(&s.run(&["get", "--node", "B", "inbox"]));
    assert!(notice.contains(&digest(&source)) && notice.contains("data/big file.bin"), "{notice}");
}

#[test]
fn a_file_crosses_a_relay_killed_twice_whole() {
    let s = Scratch::new();
    let a = format!("{FILES}routes: [ {{ to: C, via: B }} ]\n");
    let c = format!("{FILES}routes: [ {{ to: A, via: B }} ]\nqueues: [ {{ name: inbox }} ]\n");
    let (cluster, mut nodes) =
        Cluster::up(&s, &[("A", "B"), ("B", "C")], &[("A", &a), ("B", FILES), ("C", &c)]);
    let source = write_file(&s, "A", "q3.bin", 64 * MIB, 11);
    let id = send(&s, "A", "C:inbox", "q3.bin", &["--as", "in/q3 copy.bin"]);
    let mut b = nodes.remove("B").expect("B");
    for at in [10 * MIB, 35 * MIB] {
        wait_received(&s, "C", at);
        restart(&cluster, &s, &mut b, "B");
    }
    assert!(result(&s, "A", &id, "120s").contains("C:inbox delivered"));
    assert_eq!(digest(&files_dir(&s, "C").join("in/q3 copy.bin")), digest(&source));
    assert!(files_dir(&s, "B").read_dir().map_or(true, |d| d.count() <= 1), "the relay keeps no file");
}

#[test]
fn a_partial_file_damaged_while_its_receiver_is_down_resumes_from_its_last_good_chunk() {
    let s = Scratch::new();
    let (cluster, mut nodes) = pair(&s);
    let source = write_file(&s, "A", "d.bin", 64 * MIB, 3);
    let id = send(&s, "A", "B:inbox", "d.bin", &[]);
    wait_received(&s, "B", 24 * MIB);
    let mut b = nodes.remove("B").expect("B");
    b.kill();
    let partials = files_dir(&s, "B").join(".linkbus-partial");
    let partial = partials.read_dir().expect("partials").next().expect("one").expect("entry").path();
    let mut bytes = std::fs::read(&partial).expect("partial");
    bytes[5 * MIB as usize] ^= 0xff; // a flipped bit in the middle,
    bytes.extend_from_slice(&[0xAA; 1000]); // and garbage after the end
    std::fs::write(&partial, &bytes).expect("damaged");
    b = cluster.start(&s, "B");
    assert!(result(&s, "A", &id, "120s").contains("B:inbox delivered"));
    assert_eq!(digest(&files_dir(&s, "B").join("d.bin")), digest(&source));
    assert!(b.log_text().contains("does not match its chunks' checksums"), "{}", b.log_text());
    assert!(files_counter(&s, "B", "resumes") >= 1);
}

#[test]
fn a_source_changed_between_attempts_fails_and_nothing_is_spliced() {
    let s = Scratch::new();
    let (cluster, mut nodes) = pair(&s);
    let source = write_file(&s, "A", "s.bin", 64 * MIB, 5);
    let id = send(&s, "A", "B:inbox", "s.bin", &[]);
    wait_received(&s, "B", 8 * MIB);
    let mut b = nodes.remove("B").expect("B");
    b.kill();
    std::fs::write(&source, b"new content").expect("changed");
    b = cluster.start(&s, "B");
    let results = result(&s, "A", &id, "60s");
    assert!(results.contains("failed file_source_changed"), "{results}");
    assert!(!files_dir(&s, "B").join("s.bin").exists(), "nothing was put in place");
    wait_no_partials(&s, "B", &b);
    drop(cluster);
}

#[test]
fn refusals_name_their_rule_and_touch_nothing() {
    let s = Scratch::new();
    let (_cluster, _nodes) = pair(&s);
    write_file(&s, "A", "r.bin", 1000, 1);
    write_file(&s, "A", "keep.bin", 2000, 2);
    let taken = write_file(&s, "B", "r.bin", 10, 9);
    let canary = s.path().join("canary");
    std::fs::write(&canary, b"canary").expect("canary");
    let long = "x".repeat(2000);
    for (name, rule) in [
        ("../canary", "'..' component"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty or '.'"),
        (long.as_str(), "at most 1024"),
        ("missing.bin", "cannot read 'missing.bin'"),
    ] {
        let out = s.run(&["file", "send", "--node", "A", "--to", "B:inbox", name]);
        assert!(!out.status.success() && stderr(&out).contains(rule), "{name}: {}", stderr(&out));
    }
    let out = s.run(&["file", "send", "--node", "A", "--to", "B:inbox", "r.bin", "--as", "../x"]);
    assert!(stderr(&out).contains("'..' component"), "{}", stderr(&out));
    // A name taken at the recipient: refused there, nothing replaced, the source kept.
    let out = send_and_wait(&s, "B:inbox", "r.bin", &["--delete-after"]);
    assert!(stdout(&out).contains("failed file_exists"), "{}", stdout(&out));
    assert_eq!(std::fs::read(&taken).expect("kept").len(), 10);
    assert!(files_dir(&s, "A").join("r.bin").exists(), "a refused file is not deleted");
    // A queue that is not there.
    let out = send_and_wait(&s, "B:nowhere", "keep.bin", &[]);
    assert!(stdout(&out).contains("failed file_no_queue"), "{}", stdout(&out));
    // Delete after send: only once delivered.
    let out = send_and_wait(&s, "B:inbox", "keep.bin", &["--delete-after"]);
    assert!(out.status.success() && stdout(&out).contains("delivered"), "{}", stdout(&out));
    assert!(!files_dir(&s, "A").join("keep.bin").exists(), "deleted after send");
    assert_eq!(std::fs::read(files_dir(&s, "B").join("keep.bin")).expect("there").len(), 2000);
    assert_eq!(std::fs::read(&canary).expect("canary"), b"canary");
}

#[test]
fn a_full_disk_stalls_a_transfer_which_resumes_once_there_is_room() {
    let s = Scratch::new();
    let Some(disk) = crate::disk_full::Tmpfs::mount(&s.path().join("disk"), "8m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    };
    let cluster = Cluster::write(&s, &[("A", "B")], &[("A", FILES), ("B", &with_inbox())]);
    let b_files = disk.0.join("files");
    let b_files_arg = b_files.to_str().expect("utf-8 path").to_owned();
    let _b = s.start_node("B", &["-c", &cluster.configs["B"], "--files-dir", &b_files_arg]);
    let a = cluster.start(&s, "A");
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    let source = write_file(&s, "A", "full.bin", 12 * MIB, 13);
    let id = send(&s, "A", "B:inbox", "full.bin", &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listing = stdout(&s.run(&["file", "ls", "--node", "B"]));
        if listing.contains("No space left") {
            break;
        }
        assert!(Instant::now() < deadline, "no stall shown: {listing}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(result(&s, "A", &id, "0s").contains("no result yet"), "a full disk fails nothing");
    assert!(disk.resize("64m"), "remount");
    assert!(result(&s, "A", &id, "60s").contains("B:inbox delivered"));
    assert_eq!(digest(&b_files.join("full.bin")), digest(&source));
}

#[test]
fn a_transfer_whose_lifetime_runs_out_expires_and_its_partial_file_goes() {
    let s = Scratch::new();
    let (cluster, mut nodes) = pair(&s);
    write_file(&s, "A", "slow.bin", 96 * MIB, 17);
    let id = send(&s, "A", "B:inbox", "slow.bin", &["--ttl", "4s"]);
    wait_received(&s, "B", 8 * MIB);
    let mut a = nodes.remove("A").expect("A");
    a.kill();
    wait_no_partials(&s, "B", &nodes["B"]);
    a = cluster.start(&s, "A");
    let results = result(&s, "A", &id, "30s");
    assert!(results.contains("B:inbox expired"), "{results}\n{}", a.log_text());
    assert!(!files_dir(&s, "B").join("slow.bin").exists());
}

/// Peak resident memory of `node` so far, in bytes (Linux `VmHWM`).
fn peak_rss(node: &NodeProcess) -> u64 {
    let pid = node.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("a number") * 1024
}

#[test]
fn many_transfers_at_once_share_the_origins_budget() {
    let s = Scratch::new();
    // A window of 16 MiB per transfer, 16 MiB for all of them: twelve at once would hold
    // 192 MiB at the origin without the budget.
    let a = "plugins: { files: { kind: file, window_bytes: 16777216, in_flight_bytes: 16777216 } }\n";
    let (_cluster, nodes) = Cluster::up(&s, &[("A", "B")], &[("A", a), ("B", &with_inbox())]);
    let names: Vec<String> = (0..12).map(|i| format!("many/{i}.bin")).collect();
    let sources: Vec<PathBuf> =
        names.iter().zip(100..).map(|(name, seed)| write_file(&s, "A", name, 32 * MIB, seed)).collect();
    let before = peak_rss(&nodes["A"]);
    let ids: Vec<String> = names.iter().map(|name| send(&s, "A", "B:inbox", name, &[])).collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    for ((id, name), source) in ids.iter().zip(&names).zip(&sources) {
        let mut results = result(&s, "A", id, "10s");
        while !results.contains("B:inbox delivered") && Instant::now() < deadline {
            results = result(&s, "A", id, "10s");
        }
        let listing = stdout(&s.run(&["file", "ls", "--node", "A"]));
        assert!(results.contains("B:inbox delivered"), "{name}: {results}\n{listing}");
        assert_eq!(digest(&files_dir(&s, "B").join(name)), digest(source), "{name}");
    }
    let grown = peak_rss(&nodes["A"]).saturating_sub(before);
    assert!(grown < 64 * MIB, "A's peak memory grew by {} MiB for twelve transfers at once", grown / MIB);
}

#[test]
fn a_receiver_stopped_between_the_move_and_its_record_delivers_the_file_once() {
    let s = Scratch::new();
    let (cluster, mut nodes) = pair(&s);
    let mut b = nodes.remove("B").expect("B");
    for leave_partial in [false, true] {
        b.kill();
        b = cluster.start_env(&s, "B", &[("LINKBUS_TEST_CRASH_AFTER_MOVE", "1")]);
        let name = format!("moved-{leave_partial}.bin");
        let source = write_file(&s, "A", &name, 8 * MIB, 19);
        let id = send(&s, "A", "B:inbox", &name, &[]);
        assert!(b.wait_exit(Duration::from_secs(60)).is_some(), "B did not stop: {}", b.log_text());
        let placed = files_dir(&s, "B").join(&name);
        assert_eq!(digest(&placed), digest(&source), "in place before the stop");
        if leave_partial {
            // As if it stopped between the hard link and the removal of the partial name.
            let partial = format!("{}-inbox", id.replace('/', "-"));
            std::fs::hard_link(&placed, files_dir(&s, "B").join(".linkbus-partial").join(partial))
                .expect("a partial name");
        }
        b = cluster.start(&s, "B");
        let results = result(&s, "A", &id, "60s");
        assert!(results.contains("B:inbox delivered"), "{results}\n{}", b.log_text());
        assert_eq!(digest(&placed), digest(&source), "not moved again");
        wait_no_partials(&s, "B", &b);
        let notice = s.run(&["get", "--node", "B", "inbox"]);
        assert!(stdout(&notice).contains(&name), "{}", stdout(&notice));
        let again = s.run(&["get", "--node", "B", "inbox"]);
        assert!(!again.status.success(), "one notice: {}", stdout(&again));
        let events = stdout(&s.run(&["events", "--node", "B"]));
        assert!(events.contains(&format!("file_received file {name} (8388608 bytes) from A")), "{events}");
    }
}
