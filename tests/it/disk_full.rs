//! A disk running out of room (a small tmpfs, mounted by the test when it runs as root).
//! Below `node.data_free_bytes_min` the node stays up: persistent puts are refused with the
//! reason, volatile traffic and the client API go on, a link takes no persistent message
//! from its peer (which keeps it), and everything resumes by itself once there is room.
//! With the check off, a write that fails on a full disk still stops the node, and after a
//! restart with room exactly the acknowledged messages are there. Skipped, saying so, where
//! it cannot mount.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{Scratch, stderr, stdout};

/// A tmpfs mounted for the test, unmounted when dropped.
pub(crate) struct Tmpfs(pub(crate) PathBuf);

impl Tmpfs {
    pub(crate) fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status();
        status.ok().filter(|s| s.success()).map(|_| Self(at.to_owned()))
    }

    pub(crate) fn resize(&self, size: &str) -> bool {
        let status =
            Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.0).status();
        status.is_ok_and(|s| s.success())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Random text, so the store cannot compress it away: 64 KiB per message.
fn payloads() -> impl FnMut() -> String {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    move || {
        (0..65_536)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'a' + (seed % 26) as u8)
            })
            .collect()
    }
}

#[test]
fn with_the_check_off_a_full_disk_stops_the_node_and_loses_nothing_acknowledged() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.path().join("disk"), "4m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    };
    let data = disk.0.join("A");
    // The check is off: the store itself meets the full disk.
    let yaml = format!(
        "node: {{ name: A, listen: none, data_dir: '{}', data_free_bytes_min: 0 }}\nqueues: [ {{ name: q, order: fifo }} ]\n",
        data.display()
    );
    let config = s.write("a.yaml", &yaml);
    let args = ["-c", config.to_str().unwrap()];
    let mut a = s.start_node("A", &args);
    // Random text, so the store cannot compress it away: 64 KiB per message.
    let mut payload = payloads();
    let (mut acknowledged, mut refusal) = (Vec::new(), None);
    for _ in 0..300 {
        let text = payload();
        let put = s.run(&["put", "--node", "A", "--to", "A:q", "--persistent", &text]);
        if !put.status.success() {
            refusal = Some(stderr(&put));
            break;
        }
        acknowledged.push(text);
    }
    let refusal = refusal.expect("a 4 MiB disk fills up within 300 messages of 64 KiB");
    // The put that found the disk full is told so, or finds the node gone (it stops at the
    // first failed write, which may belong to another put): never a success.
    assert!(
        refusal.contains("No space left on device") || refusal.contains("the node closed the connection"),
        "{refusal}"
    );
    let status = a.wait_exit(Duration::from_secs(10)).expect("the node stops");
    assert!(!status.success(), "an error exit");
    let log = a.log_text();
    assert!(log.contains("Node failed; stopping.") && log.contains("No space left on device"), "{log}");

    assert!(disk.resize("64m"), "remount with room");
    let _a = s.start_node("A", &args);
    let get =
        s.run(&["get", "--node", "A", "q", "--count", "1000", "--wait", "1s", "--max-bytes", "1000000"]);
    let got: Vec<String> = stdout(&get).lines().map(str::to_owned).collect();
    assert!(got.len() >= acknowledged.len(), "lost: {} acknowledged, {} back", acknowledged.len(), got.len());
    assert_eq!(got[..acknowledged.len()], acknowledged[..], "in order, intact");
    assert!(got.len() <= acknowledged.len() + 1, "at most the refused one besides (its outcome was unknown)");
}

/// Puts 64 KiB persistent messages to `to` through `node` until one is refused; returns
/// those accepted and the refusal.
fn fill(s: &Scratch, node: &str, to: &str, payload: &mut impl FnMut() -> String) -> (Vec<String>, String) {
    let mut acknowledged = Vec::new();
    for _ in 0..400 {
        let text = payload();
        let put = s.run(&["put", "--node", node, "--to", to, "--persistent", "--timeout", "0s", &text]);
        if !put.status.success() {
            return (acknowledged, stderr(&put));
        }
        acknowledged.push(text);
    }
    panic!("400 messages of 64 KiB fit")
}

#[test]
fn a_disk_short_of_room_refuses_persistent_puts_keeps_volatile_traffic_and_resumes() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.path().join("disk"), "24m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    };
    let yaml = format!(
        "node: {{ name: A, listen: none, data_dir: '{}', data_free_bytes_min: 12582912 }}\n\
         queues: [ {{ name: q, order: fifo }} ]\n",
        disk.0.join("A").display()
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &yaml).to_str().unwrap()]);
    let mut payload = payloads();
    let (acknowledged, refusal) = fill(&s, "A", "A:q", &mut payload);
    assert!(!acknowledged.is_empty());
    assert!(
        refusal.contains("the disk is nearly full") && refusal.contains("node.data_free_bytes_min"),
        "{refusal}"
    );
    // The node is up: status says why, volatile messages go on.
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("disk: SHORT: the disk is nearly full"), "{status}");
    let volatile = s.run(&["put", "--node", "A", "--to", "A:q", "--volatile", "light"]);
    assert!(volatile.status.success(), "{}", stderr(&volatile));

    // Room again: persistent puts are taken, without a restart.
    assert!(disk.resize("64m"), "remount with room");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let late = payload();
    while !s.run(&["put", "--node", "A", "--to", "A:q", "--persistent", &late]).status.success() {
        assert!(std::time::Instant::now() < deadline, "persistent puts resume");
        std::thread::sleep(Duration::from_millis(100));
    }
    let get =
        s.run(&["get", "--node", "A", "q", "--count", "1000", "--wait", "1s", "--max-bytes", "100000000"]);
    let got: Vec<String> = stdout(&get).lines().map(str::to_owned).collect();
    let mut expected = acknowledged;
    expected.push("light".to_owned());
    expected.push(late);
    assert_eq!(got.len(), expected.len(), "nothing lost, nothing twice");
    assert!(got == expected, "in order, intact");
    assert!(a.log_text().contains("There is room on the disk again"), "{}", a.log_text());
    assert!(!a.log_text().contains("Node failed"), "{}", a.log_text());
}

#[test]
fn a_receiver_short_of_room_leaves_persistent_messages_with_the_sender_and_takes_volatile_ones() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.path().join("disk"), "24m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    };
    let b_extra = "queues: [ { name: q, order: fifo } ]\nlinks: { reconnect_backoff_max_ms: 500 }\n";
    let b_node = format!("data_dir: '{}', data_free_bytes_min: 12582912", disk.0.join("B").display());
    let (a, b) = s.start_pair_with_node("links: { reconnect_backoff_max_ms: 500 }", b_extra, &b_node);
    let mut payload = payloads();
    // B's own puts use up its room.
    let (mut on_b, refusal) = fill(&s, "B", "B:q", &mut payload);
    assert!(refusal.contains("the disk is nearly full"), "{refusal}");
    // A persistent message from A is accepted at A and waits there; a volatile one arrives.
    let kept = payload();
    let put = s.run(&["put", "--node", "A", "--to", "B:q", "--persistent", &kept]);
    assert!(put.status.success(), "{}", stderr(&put));
    std::thread::sleep(Duration::from_secs(1));
    let put = s.run(&["put", "--node", "A", "--to", "B:q", "--volatile", "light"]);
    assert!(put.status.success(), "{}", stderr(&put));
    b.wait_for_log("Persistent delivery refused; the peer keeps it.", 1, Duration::from_secs(10));
    // A says why B does not take it (as its link's last error, while the link is down).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = stdout(&s.run(&["status", "--node", "A"]));
        if status.contains("takes no persistent message now") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(50));
    }

    assert!(disk.resize("64m"), "remount with room");
    on_b.push(kept);
    let got = s.take_all("B", "q", on_b.len() + 1, Duration::from_secs(30));
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(got.len(), on_b.len() + 1, "nothing lost, nothing twice");
    assert!(got.contains(&"light"), "the volatile message arrived");
    let persistent: Vec<&str> = got.iter().copied().filter(|l| *l != "light").collect();
    assert!(persistent == on_b.iter().map(String::as_str).collect::<Vec<_>>(), "in order, intact");
    assert!(!a.log_text().contains("Node failed") && !b.log_text().contains("Node failed"));
}
