//! Link security with real processes: the dialer chooses the cipher and the listener
//! answers in it; a node without the cluster key, with a key its peer does not list, a
//! replayed handshake, and a downgrade to plaintext never get a message through; key files
//! must be private; plaintext links are announced loudly.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use linkbus::proto::frame::{Frame, FrameDecoder, PROTOCOL_VERSION};
use linkbus::proto::secure::{Cipher, Keypair, SecureChannel, parse_key};
use support::{NodeProcess, Scratch, hello_frame, stderr, stdout};

/// B listens with Noise and lists A's key; returns B and A's public key.
fn start_b(s: &Scratch) -> (NodeProcess, String) {
    let a_key = s.keys("A");
    let _ = s.keys("B");
    let yaml = format!(
        "node: {{ name: B, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\nqueues: [ {{ name: orders }} ]\n{}\n",
        s.security_yaml("B")
    );
    let b = s.start_node("B", &["-c", s.write("b.yaml", &yaml).to_str().unwrap()]);
    (b, a_key)
}

fn public_key_of(s: &Scratch, name: &str) -> String {
    let private = parse_key(&std::fs::read_to_string(s.path().join(format!("{name}.key"))).unwrap()).unwrap();
    linkbus::proto::secure::hex(&Keypair::from_private(private).unwrap().public)
}

/// Starts a node calling itself A that dials B with `key_file` and `psk_file`.
fn start_a(s: &Scratch, b: &NodeProcess, key_file: &str, psk_file: &str) -> NodeProcess {
    start_a_with(s, b, key_file, psk_file, "auto")
}

/// [`start_a`] with the links' `cipher`.
fn start_a_with(s: &Scratch, b: &NodeProcess, key_file: &str, psk_file: &str, cipher: &str) -> NodeProcess {
    let yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}', public_key: '{}' }} ]\n\
         security: {{ key_file: '{key_file}', psk_file: '{psk_file}', cipher: {cipher} }}\n",
        b.listen_address(),
        public_key_of(s, "B")
    );
    s.start_node("A", &["-c", s.write("a.yaml", &yaml).to_str().unwrap()])
}

fn nothing_arrives(s: &Scratch) {
    let put = s.run(&["put", "--node", "A", "--to", "B:orders", "smuggled"]);
    assert!(put.status.success(), "A accepts it into its queue: {}", stderr(&put));
    let get = s.run(&["get", "--node", "B", "orders", "--wait", "1500ms"]);
    assert_eq!(stdout(&get), "", "nothing got through");
}

#[test]
fn the_right_keys_link_up() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let dir = s.path().display().to_string();
    let a = start_a(&s, &b, &format!("{dir}/A.key"), &format!("{dir}/cluster.psk"));
    a.wait_for_log("Link up.", 1, Duration::from_secs(10));
    assert!(s.run(&["put", "--node", "A", "--to", "B:orders", "sealed"]).status.success());
    assert_eq!(stdout(&s.run(&["get", "--node", "B", "orders", "--wait", "5s"])), "sealed\n");
}

#[test]
fn the_dialer_chooses_the_cipher_and_both_logs_name_it() {
    for cipher in [Cipher::AesGcm, Cipher::ChaChaPoly] {
        let s = Scratch::new();
        let (b, _) = start_b(&s);
        let dir = s.path().display().to_string();
        let a = start_a_with(&s, &b, &format!("{dir}/A.key"), &format!("{dir}/cluster.psk"), cipher.name());
        a.wait_for_log("Link up.", 1, Duration::from_secs(10));
        b.wait_for_log("Link up.", 1, Duration::from_secs(10));
        let named = format!("Noise ({})", cipher.name());
        assert!(a.log_text().contains(&named), "{}", a.log_text());
        assert!(b.log_text().contains(&named), "B answers in A's choice: {}", b.log_text());
        assert!(s.run(&["put", "--node", "A", "--to", "B:orders", "sealed"]).status.success());
        assert_eq!(stdout(&s.run(&["get", "--node", "B", "orders", "--wait", "5s"])), "sealed\n");
    }
}

/// `linkbus status` of node `name`: its lines for link `peer`.
fn link_status(s: &Scratch, name: &str, peer: &str) -> String {
    let status = stdout(&s.run(&["status", "--node", name]));
    let mut lines = status.lines().skip_while(|l| !l.trim_start().starts_with(&format!("{peer}:")));
    let line = lines.next().unwrap_or_else(|| panic!("no link {peer} in:\n{status}"));
    // A link that is down has its details on the next line.
    format!("{line}\n{}", lines.next().unwrap_or_default())
}

/// Waits (bounded) until `node`'s log has a `WARN` line containing every one of `words`.
fn warned(node: &NodeProcess, words: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let log = node.log_text();
        if log.lines().any(|l| l.contains("WARN") && words.iter().all(|w| l.contains(w))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("node {}: no warning with {words:?}:\n{}", node.name, node.log_text());
}

#[test]
fn a_wrong_cluster_key_never_gets_a_message_through_and_both_sides_say_why() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let other_psk = s.path().join("other.psk");
    assert!(s.run(&["keygen", "--psk", "--out", other_psk.to_str().unwrap()]).status.success());
    let dir = s.path().display().to_string();
    let a = start_a(&s, &b, &format!("{dir}/A.key"), other_psk.to_str().unwrap());
    nothing_arrives(&s);
    // The cluster key enters at the end of the second handshake message (psk2): the dialer
    // cannot read the answer, and B never sees a hello. Each side names the key to check.
    warned(&a, &["Link handshake failed.", "did not decrypt", "security.psk_file"]);
    warned(&b, &["peer=A", "closed the connection after this node's handshake answer", "security.psk_file"]);
    let status = link_status(&s, "A", "B");
    assert!(status.contains("down for") && status.contains("security.psk_file"), "{status}");
    let status = link_status(&s, "B", "A");
    assert!(status.contains("down for") && status.contains("security.psk_file"), "{status}");
}

#[test]
fn a_wrong_public_key_for_the_listener_is_named_on_both_sides() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let _ = s.keys("Other");
    let dir = s.path().display().to_string();
    // A dials B expecting Other's key.
    let yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{}', public_key: '{}' }} ]\n\
         security: {{ key_file: '{dir}/A.key', psk_file: '{dir}/cluster.psk' }}\n",
        b.listen_address(),
        public_key_of(&s, "Other")
    );
    let a = s.start_node("A", &["-c", s.write("a.yaml", &yaml).to_str().unwrap()]);
    nothing_arrives(&s);
    warned(&a, &["Link handshake failed.", "B refused the handshake", "peers[B].public_key"]);
    warned(&b, &["Refused connection.", "did not decrypt", "peers[].public_key"]);
    let status = link_status(&s, "A", "B");
    assert!(status.contains("down for") && status.contains("peers[B].public_key"), "{status}");
}

#[test]
fn an_unlisted_key_never_gets_a_message_through() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let _ = s.keys("Rogue");
    let dir = s.path().display().to_string();
    let a = start_a(&s, &b, &format!("{dir}/Rogue.key"), &format!("{dir}/cluster.psk"));
    nothing_arrives(&s);
    warned(
        &b,
        &["Refused connection.", "unknown static key", &public_key_of(&s, "Rogue"), "peers[].public_key"],
    );
    // The dialer names its own public key, for the listener's list.
    warned(&a, &["B refused the handshake", &public_key_of(&s, "Rogue")]);
}

#[test]
fn a_replayed_handshake_is_refused() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let read = |name: &str| parse_key(&std::fs::read_to_string(s.path().join(name)).unwrap()).unwrap();
    let a = Keypair::from_private(read("A.key")).unwrap();
    let b_public = parse_key(&public_key_of(&s, "B")).unwrap();
    // A real handshake as A, recorded on the way out, completed with a hello.
    let mut dialer =
        SecureChannel::noise_dialer(Cipher::AesGcm, &a, &b_public, &read("cluster.psk"), 42).unwrap();
    let captured = dialer.poll_transmit().unwrap();
    let mut first = TcpStream::connect(b.listen_address()).unwrap();
    first.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    first.write_all(&captured).unwrap();
    let mut buf = [0u8; 4096];
    while !dialer.is_established() {
        let n = first.read(&mut buf).unwrap();
        assert!(n > 0, "B answered the handshake");
        dialer.handle_bytes(&buf[..n]).unwrap();
    }
    dialer.send(&hello_frame("A", PROTOCOL_VERSION)).unwrap();
    first.write_all(&dialer.poll_transmit().unwrap()).unwrap();
    b.wait_for_log("Accepted connection.", 1, Duration::from_secs(5));
    // The same first message again, on a new connection.
    let mut replay = TcpStream::connect(b.listen_address()).unwrap();
    replay.write_all(&captured).unwrap();
    b.wait_for_log("replayed handshake from A", 1, Duration::from_secs(5));
    replay.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(replay.read(&mut buf).unwrap_or(0), 0, "closed without a word");
}

#[test]
fn a_downgrade_to_plaintext_is_refused() {
    let s = Scratch::new();
    let (b, _) = start_b(&s);
    let mut wire = b"LBUS\x01\x00".to_vec();
    wire.extend_from_slice(&hello_frame("A", PROTOCOL_VERSION));
    let mut stream = TcpStream::connect(b.listen_address()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(&wire).unwrap();
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut buf = [0u8; 4096];
    let reason = loop {
        if let Ok(Some(Frame::Close { reason, .. })) = decoder.decode() {
            break reason;
        }
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed without a reason");
        decoder.extend(&buf[..n]);
    };
    assert!(reason.contains("peer wants a plaintext link, this node requires Noise"), "{reason}");
}

#[test]
fn key_files_must_be_private_and_plaintext_is_loud() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let (b, a_key) = start_b(&s);
    drop(b);
    let key = s.path().join("B.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = s.run(&["node", "run", "-c", s.path().join("b.yaml").to_str().unwrap()]);
    assert!(!run.status.success());
    assert!(stderr(&run).contains("which others may read; run chmod 600"), "{}", stderr(&run));
    let existing = s.run(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(!existing.status.success(), "keygen never overwrites a key");

    let yaml = format!(
        "node: {{ name: P, listen: 127.0.0.1:0 }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\nsecurity: {{ insecure_plaintext: true }}\n"
    );
    let plain = s.start_node("P", &["-c", s.write("p.yaml", &yaml).to_str().unwrap()]);
    assert!(plain.log_text().contains("INSECURE: links are plaintext"), "{}", plain.log_text());
}
