//! Session behaviour over an in-memory pipe with a manual clock: handshake, ordered delivery,
//! cumulative acknowledgement, resend after reconnect, duplicates, peer restarts, keepalive
//! and refusal of bad peers.

use super::*;
use crate::wire::message_bytes;
use linkbus_plugin_api::{Content, MessageId};

fn config(local: &str, peer: &str, incarnation: u64) -> SessionConfig {
    SessionConfig {
        local: NodeName::new(local).unwrap(),
        peer: NodeName::new(peer).unwrap(),
        incarnation,
        durable: false,
        frame_bytes_max: 1 << 20,
        in_flight_messages_max: 8,
        ping_interval: Duration::from_secs(1),
        pong_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(5),
    }
}

fn message(n: u64) -> Bytes {
    message_bytes(&Message {
        id: MessageId { source: NodeName::new("A").unwrap(), sequence: n, created_unix_ms: 0 },
        hop_count: 0,
        redelivered: false,
        content: Content::buf("B:q".parse().unwrap(), n.to_string()),
    })
}

/// Two sessions joined by an in-memory connection; `deliver` stores everything received.
struct Pair {
    a: Session,
    b: Session,
    now: Instant,
    received_by_b: Vec<u64>,
    closed: Vec<SessionError>,
}

impl Pair {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            a: Session::new(config("A", "B", 11), now),
            b: Session::new(config("B", "A", 22), now),
            now,
            received_by_b: Vec::new(),
            closed: Vec::new(),
        }
    }

    fn connect(&mut self) {
        self.a.handle_connected(self.now);
        self.b.handle_connected(self.now);
        self.pump();
    }

    /// Moves bytes both ways until nothing moves (bounded).
    fn pump(&mut self) {
        for _ in 0..100 {
            let mut moved = false;
            if let Some(bytes) = self.a.poll_transmit() {
                self.b.handle_bytes(&bytes, self.now);
                moved = true;
            }
            if let Some(bytes) = self.b.poll_transmit() {
                self.a.handle_bytes(&bytes, self.now);
                moved = true;
            }
            self.drain();
            if !moved {
                return;
            }
        }
        panic!("pump did not settle");
    }

    fn drain(&mut self) {
        while let Some(e) = self.a.poll_event() {
            if let SessionEvent::Closed(e) = e {
                self.closed.push(e);
            }
        }
        while let Some(e) = self.b.poll_event() {
            match e {
                SessionEvent::Received { sequence, message } => {
                    self.received_by_b.push(message.id.sequence);
                    self.b.handle_delivered(sequence);
                }
                SessionEvent::Closed(e) => self.closed.push(e),
                _ => {}
            }
        }
    }

    fn disconnect(&mut self) {
        self.a.handle_disconnected();
        self.b.handle_disconnected();
    }
}

#[test]
fn messages_flow_in_order_and_are_acknowledged() {
    let mut p = Pair::new();
    p.connect();
    assert!(p.a.is_established() && p.b.is_established());
    for n in 1..=5 {
        p.a.send(message(n)).unwrap();
    }
    p.pump();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5]);
    assert_eq!(p.a.in_flight(), 0, "cumulative ACK completed everything");
    assert!(p.closed.is_empty());
}

#[test]
fn messages_sent_while_down_arrive_after_reconnect() {
    let mut p = Pair::new();
    p.a.send(message(1)).unwrap();
    p.a.send(message(2)).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2]);
}

#[test]
fn unacknowledged_messages_are_resent_exactly_once() {
    let mut p = Pair::new();
    p.connect();
    p.a.send(message(1)).unwrap();
    p.pump();
    // Message 2 is written but the connection breaks before it arrives.
    p.a.send(message(2)).unwrap();
    let _lost = p.a.poll_transmit();
    // Message 3 arrives at B, but B's ACK is lost.
    p.disconnect();
    p.connect();
    p.a.send(message(3)).unwrap();
    let to_b = p.a.poll_transmit().unwrap();
    p.b.handle_bytes(&to_b, p.now);
    p.drain();
    let _lost_ack = p.b.poll_transmit();
    p.disconnect();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3], "no loss, no duplicate");
    assert_eq!(p.a.in_flight(), 0);
}

#[test]
fn a_peer_that_lost_its_state_gets_a_fresh_sequence_space() {
    let mut p = Pair::new();
    p.connect();
    for n in 1..=3 {
        p.a.send(message(n)).unwrap();
    }
    p.pump();
    p.disconnect();
    // B restarts with a new incarnation and nothing remembered.
    p.b = Session::new(config("B", "A", 33), p.now);
    p.a.send(message(4)).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3, 4]);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
    // And A restarting is handled the same way by B.
    p.disconnect();
    p.a = Session::new(config("A", "B", 44), p.now);
    p.a.send(message(5)).unwrap();
    p.connect();
    assert_eq!(p.received_by_b, [1, 2, 3, 4, 5]);
    assert!(p.closed.is_empty(), "{:?}", p.closed);
}

#[test]
fn window_bounds_messages_in_flight() {
    let mut p = Pair::new();
    for n in 1..=8 {
        p.a.send(message(n)).unwrap();
    }
    assert_eq!(p.a.send(message(9)), Err(WindowFull(8)));
    p.connect();
    assert!(p.a.has_window());
}

#[test]
fn wrong_peer_and_wrong_version_are_refused() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    let mut c = Session::new(config("C", "A", 2), now);
    a.handle_connected(now);
    c.handle_connected(now);
    a.handle_bytes(&c.poll_transmit().unwrap(), now);
    assert!(matches!(a.poll_event(), Some(SessionEvent::Closed(SessionError::WrongPeer { .. }))));

    let mut a = Session::new(config("A", "B", 1), now);
    a.handle_connected(now);
    let mut wire = BytesMut::new();
    Frame::Hello(Hello {
        protocol_version: PROTOCOL_VERSION + 1,
        api_version: 1,
        from: "B".into(),
        to: "A".into(),
        incarnation: 5,
        expected: 1,
        your_incarnation: 0,
        flags: 0,
    })
    .encode(&mut wire);
    a.handle_bytes(&wire, now);
    assert!(matches!(a.poll_event(), Some(SessionEvent::Closed(SessionError::Version { .. }))));
    let close = a.poll_transmit().unwrap();
    assert!(close.windows(7).any(|w| w == b"version"), "the peer is told why");
}

#[test]
fn garbage_and_corruption_close_the_connection() {
    let mut p = Pair::new();
    p.connect();
    p.b.handle_bytes(b"\x00\x00\x00\x03\xff\xff\xff", p.now);
    assert!(matches!(p.b.poll_event(), Some(SessionEvent::Closed(SessionError::Frame(_)))));

    let mut p = Pair::new();
    p.connect();
    let mut wire = BytesMut::new();
    Frame::Data { sequence: 1, crc: 0, message: message(1) }.encode(&mut wire);
    p.b.handle_bytes(&wire, p.now);
    assert_eq!(p.b.poll_event(), Some(SessionEvent::Closed(SessionError::BadCrc(1))));

    let mut p = Pair::new();
    p.connect();
    let mut wire = BytesMut::new();
    Frame::Ack { sequence: 5 }.encode(&mut wire);
    p.a.handle_bytes(&wire, p.now);
    assert!(matches!(p.a.poll_event(), Some(SessionEvent::Closed(SessionError::AckBeyondSent { .. }))));
}

#[test]
fn keepalive_pings_and_drops_a_silent_peer() {
    let mut p = Pair::new();
    p.connect();
    p.now += Duration::from_millis(1500);
    p.a.handle_timeout(p.now);
    p.pump();
    assert!(p.closed.is_empty(), "a ping answered keeps the link");
    p.now += Duration::from_millis(1500);
    p.a.handle_timeout(p.now);
    let _unanswered = p.a.poll_transmit();
    assert_eq!(p.a.poll_timeout(), Some(p.now + Duration::from_secs(2)));
    p.now += Duration::from_secs(2);
    p.a.handle_timeout(p.now);
    assert_eq!(p.a.poll_event(), Some(SessionEvent::Closed(SessionError::PongTimeout)));
}

#[test]
fn handshake_times_out() {
    let now = Instant::now();
    let mut a = Session::new(config("A", "B", 1), now);
    a.handle_connected(now);
    a.handle_timeout(now + Duration::from_secs(5));
    assert_eq!(a.poll_event(), Some(SessionEvent::Closed(SessionError::HandshakeTimeout)));
}
