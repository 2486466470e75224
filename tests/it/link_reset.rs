//! A peer whose sequence numbers went backwards behind a persistent message it acknowledged
//! (its data was wiped or restored from an old copy while it kept its identity) makes the node stop that link, say so in its log and
//! status, and stop dialing, until an operator runs `linkbus link reset PEER`; then the link
//! takes the peer's numbers as they are and messages flow again. The peer here is played by
//! the test over a plaintext connection, so it can lie about its numbers.

use crate::support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use linkbus::proto::channel::CHANNELS;
use linkbus::proto::frame::{ChannelPosition, Frame, FrameDecoder, Hello};
use support::{Scratch, stderr, stdout};

/// The test's side of one connection from A.
struct FakeB {
    stream: TcpStream,
    decoder: FrameDecoder,
}

impl FakeB {
    /// Accepts A's next connection (waiting at most `within`) and reads its preamble.
    fn accept(listener: &TcpListener, within: Duration) -> Option<Self> {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + within;
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => return None,
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut preamble = [0u8; 6];
        (&stream).read_exact(&mut preamble).unwrap();
        assert_eq!(&preamble[..4], b"LBUS", "a plaintext linkbus preamble");
        Some(Self { stream, decoder: FrameDecoder::new(1 << 20) })
    }

    fn frame(&mut self) -> Frame {
        loop {
            if let Some(frame) = self.decoder.decode().unwrap() {
                return frame;
            }
            let mut buf = [0u8; 64 * 1024];
            let n = self.stream.read(&mut buf).unwrap();
            assert!(n > 0, "A closed the connection");
            self.decoder.extend(&buf[..n]);
        }
    }

    fn send(&mut self, frame: &Frame) {
        let mut out = BytesMut::new();
        frame.encode(&mut out);
        self.stream.write_all(&out).unwrap();
    }

    /// Reads A's hello and answers with B's: incarnation 77, referring to `your_incarnation`
    /// of A, expecting message 1 on every channel. Returns A's incarnation.
    fn handshake(&mut self, knows_a: bool) -> u64 {
        let Frame::Hello(hello) = self.frame() else { panic!("A opens with a hello") };
        let answer = Hello {
            api_version: hello.api_version,
            incarnation: 77,
            your_incarnation: if knows_a { hello.incarnation } else { 0 },
            channels: vec![ChannelPosition { expected: 1, ..ChannelPosition::default() }; CHANNELS],
            ..Hello::new("B", "A")
        };
        self.send(&Frame::Hello(answer));
        hello.incarnation
    }

    /// The next data packet: (channel, sequence, payload).
    fn data(&mut self) -> (u8, u64, Vec<u8>) {
        loop {
            if let Frame::Data { channel, sequence, bytes, .. } = self.frame() {
                let message = linkbus::proto::wire::decode_message(bytes).unwrap();
                return (channel, sequence, message.content.payload.to_vec());
            }
        }
    }
}

/// A listener playing B, and the path of A's configuration: plaintext, dialing it, with
/// fast reconnects.
fn a_dialing_a_fake_b(s: &Scratch) -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let yaml = format!(
        "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '{address}' }} ]\n\
         security: {{ insecure_plaintext: true }}\n\
         links: {{ reconnect_backoff_min_ms: 20, reconnect_backoff_max_ms: 100 }}\n"
    );
    (listener, s.write("a.yaml", &yaml).to_str().unwrap().to_owned())
}

/// First contact: B acknowledges message 1 on its channel, a persistent one (numbers lost
/// after volatile messages are a machine crash's, and go again as skips). Returns B's side
/// of the connection, still open.
fn b_acknowledges_a_persistent_message(s: &Scratch, listener: &TcpListener) -> FakeB {
    let mut b = FakeB::accept(listener, Duration::from_secs(10)).expect("A dials B");
    b.handshake(false);
    let put = s.run(&["put", "--node", "A", "--to", "B:q", "--persistent", "one"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let (channel, sequence, payload) = b.data();
    assert_eq!((sequence, &payload[..]), (1, &b"one"[..]));
    b.send(&Frame::Ack { channel, sequence });
    std::thread::sleep(Duration::from_millis(300));
    b
}

#[test]
fn a_peer_whose_numbers_went_backwards_stops_the_link_until_reset() {
    let s = Scratch::new();
    let (listener, config) = a_dialing_a_fake_b(&s);
    let a = s.start_node("A", &["-c", &config]);
    drop(b_acknowledges_a_persistent_message(&s, &listener));

    // B comes back knowing A but expecting message 1 again: its numbers went backwards.
    let mut b = FakeB::accept(&listener, Duration::from_secs(10)).expect("A redials");
    b.handshake(true);
    a.wait_for_log("Link STOPPED", 1, Duration::from_secs(10));
    drop(b);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("B: STOPPED") && status.contains("linkbus link reset B"), "{status}");
    assert!(FakeB::accept(&listener, Duration::from_secs(1)).is_none(), "a stopped link does not dial");
    let put = s.run(&["put", "--node", "A", "--to", "B:q", "two"]);
    assert!(put.status.success(), "messages still queue for the stopped link: {}", stderr(&put));

    // The operator resets the link: it dials again and takes B's numbers as they are.
    let reset = s.run(&["link", "reset", "--node", "A", "B"]);
    assert!(reset.status.success(), "{}", stderr(&reset));
    assert!(stdout(&reset).contains("restarted"), "{}", stdout(&reset));
    let mut b = FakeB::accept(&listener, Duration::from_secs(10)).expect("A dials after the reset");
    b.handshake(true);
    let (_, sequence, payload) = b.data();
    assert_eq!(
        (sequence, &payload[..]),
        (1, &b"two"[..]),
        "the waiting message goes as the number B expects"
    );
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(!status.contains("STOPPED"), "{status}");

    let again = s.run(&["link", "reset", "--node", "A", "B"]);
    assert!(stdout(&again).contains("is not stopped; nothing to reset"), "{}", stdout(&again));

    let unknown = s.run(&["link", "reset", "--node", "A", "Z"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("no link to 'Z'"), "{}", stderr(&unknown));
}

/// The same when the node restarted in between: it recorded that B acknowledged a
/// persistent message, so a B that comes back expecting it again is refused, not skipped.
#[test]
fn a_peer_that_went_backwards_while_the_node_was_down_is_still_refused() {
    let s = Scratch::new();
    let (listener, config) = a_dialing_a_fake_b(&s);
    let mut a = s.start_node("A", &["-c", &config]);
    let b = b_acknowledges_a_persistent_message(&s, &listener);
    a.kill();
    drop(b);

    let a = s.start_node("A", &["-c", &config]);
    let mut b = FakeB::accept(&listener, Duration::from_secs(10)).expect("A dials after its restart");
    b.handshake(true);
    a.wait_for_log("Link STOPPED", 1, Duration::from_secs(10));
    assert!(a.log_text().contains("expects message 1 on channel"), "{}", a.log_text());
}
