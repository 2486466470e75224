//! A full disk (a small tmpfs, mounted by the test when it runs as root): persistent puts
//! fail with an error naming the cause, nothing unsynced is acknowledged, the node stops with
//! an error exit, and once there is room again it restarts with exactly the messages it
//! acknowledged. Skipped, saying so, where it cannot mount.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{Scratch, stderr, stdout};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status();
        status.ok().filter(|s| s.success()).map(|_| Self(at.to_owned()))
    }

    fn resize(&self, size: &str) -> bool {
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

#[test]
fn a_full_disk_refuses_persistent_puts_and_loses_nothing_acknowledged() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.path().join("disk"), "4m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (the test needs root)");
        return;
    };
    let data = disk.0.join("A");
    let args = ["--name", "A", "--listen", "none", "--queue", "q:fifo", "--data-dir", data.to_str().unwrap()];
    let mut a = s.start_node("A", &args);
    // Random text, so the store cannot compress it away: 64 KiB per message.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut payload = || -> String {
        (0..65_536)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'a' + (seed % 26) as u8)
            })
            .collect()
    };
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
