//! Blocking put with a timeout and non-blocking try-put: each priority class of a link's
//! transmission queue is bounded on its own (a full class never stalls another), a try-put
//! into a full queue fails at once, a put waits for room up to its timeout and then says it
//! was not accepted, and a waiting put goes through as soon as room appears. A node that
//! shuts down answers what is under way and what it received: waiting puts and commits
//! are refused, waiting gets told why, acknowledgements carried out, an unread answer's
//! messages given back to their queue.

use crate::support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use linkbus::client::protocol::{ErrorCode, Request, Response, split_frame};
use linkbus::{Client, ClientError, Content};
use support::{NodeProcess, Scratch, free_port, stderr, stdout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A free port on 127.0.0.1 (nothing listens on it until B starts).
/// A dialing B on a port where B starts only when a test wants it, so A's transmission
/// queue fills meanwhile.
struct LatePeer {
    port: u16,
    a_key: String,
    b_key: String,
}

impl LatePeer {
    fn new(s: &Scratch) -> Self {
        Self { port: free_port(), a_key: s.keys("A"), b_key: s.keys("B") }
    }

    /// A, with `extra` (its queues and links sections).
    fn start_a(&self, s: &Scratch, extra: &str) -> NodeProcess {
        let (port, b_key) = (self.port, &self.b_key);
        let yaml = format!(
            "node: {{ name: A, listen: none }}\npeers: [ {{ name: B, address: '127.0.0.1:{port}', public_key: '{b_key}' }} ]\n{extra}\n{}\n",
            s.security_yaml("A")
        );
        s.start_node("A", &["-c", s.write("a.yaml", &yaml).to_str().unwrap()])
    }

    /// B, with queue `q`.
    fn start_b(&self, s: &Scratch) -> NodeProcess {
        let (port, a_key) = (self.port, &self.a_key);
        let yaml = format!(
            "node: {{ name: B, listen: '127.0.0.1:{port}' }}\npeers: [ {{ name: A, public_key: '{a_key}' }} ]\nqueues: [ {{ name: q, order: fifo }} ]\n{}\n",
            s.security_yaml("B")
        );
        s.start_node("B", &["-c", s.write("b.yaml", &yaml).to_str().unwrap()])
    }
}

#[test]
fn full_classes_refuse_or_wait_and_others_flow() {
    let s = Scratch::new();
    let peer = LatePeer::new(&s);
    let _a = peer.start_a(
        &s,
        "queues: [ { name: small, queue_messages_max: 2 } ]\n\
         links: { queue_messages_max: 3, reconnect_backoff_max_ms: 200 }",
    );
    let put = |args: &[&str]| {
        let mut full = vec!["put", "--node", "A"];
        full.extend_from_slice(args);
        s.run(&full)
    };
    for i in 0..3 {
        let out = put(&["--to", "B:q", "--priority", "1", "--timeout", "0s", &format!("low {i}")]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let started = Instant::now();
    let full = put(&["--to", "B:q", "--priority", "1", "--timeout", "0s", "low 3"]);
    assert!(
        !full.status.success() && stderr(&full).contains("transmission queue to node B is full"),
        "{}",
        stderr(&full)
    );
    assert!(started.elapsed() < Duration::from_secs(3), "a try-put does not wait");
    let high = put(&["--to", "B:q", "--priority", "8", "--timeout", "0s", "high"]);
    assert!(high.status.success(), "another class still flows: {}", stderr(&high));

    let started = Instant::now();
    let waited = put(&["--to", "B:q", "--priority", "1", "--timeout", "1s", "low 3"]);
    assert!(!waited.status.success(), "still full after the timeout");
    assert!(stderr(&waited).contains("no room within 1s, not accepted"), "{}", stderr(&waited));
    assert!(started.elapsed() >= Duration::from_secs(1));

    // A put that waits goes through once B comes and the link drains the queue.
    let blocked = s
        .command(&["put", "--node", "A", "--to", "B:q", "--priority", "1", "--timeout", "30s", "low 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _b = peer.start_b(&s);
    let out = blocked.wait_with_output().unwrap();
    assert!(out.status.success(), "the waiting put went through: {}", stderr(&out));
    let got = s.run(&["get", "--node", "B", "q", "--count", "5", "--wait", "10s"]);
    let text = stdout(&got);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["high", "low 0", "low 1", "low 2", "low 3"], "{}", stderr(&got));

    // The same for a full local queue: a waiting put goes in when a get makes room.
    for i in 0..2 {
        assert!(put(&["--to", "A:small", &format!("local {i}")]).status.success());
    }
    let blocked = s
        .command(&["put", "--node", "A", "--to", "A:small", "--timeout", "30s", "local 2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stdout(&s.run(&["get", "--node", "A", "small"])), "local 0\n");
    assert!(blocked.wait_with_output().unwrap().status.success());
    let rest = s.run(&["get", "--node", "A", "small", "--count", "2", "--wait", "5s"]);
    assert_eq!(stdout(&rest), "local 1\nlocal 2\n");
}

/// A class of a transmission queue also holds at most `links.queue_bytes_max` bytes: a put
/// past it is refused naming the class and its fill, an empty class takes a message larger
/// than the bound, and everything accepted arrives once the peer comes.
#[test]
fn classes_are_bounded_in_bytes_too() {
    let s = Scratch::new();
    let peer = LatePeer::new(&s);
    let _a = peer.start_a(&s, "links: { queue_bytes_max: 3000, reconnect_backoff_max_ms: 200 }");
    let put = |priority: &str, payload: &str| {
        s.run(&["put", "--node", "A", "--to", "B:q", "--priority", priority, "--timeout", "0s", payload])
    };
    let (one, two, big, third) = ("1".repeat(1400), "2".repeat(1400), "3".repeat(5000), "4".repeat(200));
    assert!(put("1", &one).status.success() && put("1", &two).status.success());
    let full = put("1", &third);
    let text = stderr(&full);
    assert!(!full.status.success(), "{text}");
    assert!(
        text.contains("transmission queue to node B is full (priority 1: 2 of 1000000 messages, ")
            && text.contains(" of 3000 bytes waiting)"),
        "{text}"
    );
    let alone = put("6", &big);
    assert!(alone.status.success(), "an empty class takes a message above the bound: {}", stderr(&alone));
    assert!(!put("6", "small").status.success(), "and then holds nothing more");

    let _b = peer.start_b(&s);
    let got = s.run(&["get", "--node", "B", "q", "--count", "3", "--wait", "10s"]);
    let text = stdout(&got);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, [one.as_str(), two.as_str(), big.as_str()], "{}", stderr(&got));
    // Drained, the class takes puts again.
    let again = put("1", "small");
    assert!(again.status.success(), "{}", stderr(&again));
}

/// Send modes: a no-wait put fails at once on a full queue and refuses persistent messages;
/// a waiting put never waits longer than the message's lifetime; `--ttl` sets the lifetime.
#[test]
fn no_wait_puts_and_lifetimes_bound_waiting() {
    let s = Scratch::new();
    let _a = s.start_lone("A", &["q:fifo"]);
    let put = |args: &[&str]| {
        let mut full = vec!["put", "--node", "A"];
        full.extend_from_slice(args);
        s.run(&full)
    };
    let persistent = put(&["--to", "A:q", "--no-wait", "--persistent", "x"]);
    assert!(!persistent.status.success());
    assert!(
        stderr(&persistent).contains("a no-wait put cannot carry a persistent message"),
        "{}",
        stderr(&persistent)
    );
    assert!(put(&["--to", "A:q", "--persistent", "kept"]).status.success(), "a waiting put takes it");

    // A node whose queue holds one message.
    let cfg_dir = s.path().join("b-data");
    let b_yaml = format!(
        "node: {{ name: B, listen: none, data_dir: '{}' }}\nqueues: [ {{ name: small, queue_messages_max: 1 }} ]\n",
        cfg_dir.display()
    );
    let _b = s.start_node("B", &["-c", s.write("b.yaml", &b_yaml).to_str().unwrap()]);
    let put_b = |args: &[&str]| {
        let mut full = vec!["put", "--node", "B"];
        full.extend_from_slice(args);
        s.run(&full)
    };
    assert!(put_b(&["--to", "B:small", "first"]).status.success());
    let started = Instant::now();
    let no_wait = put_b(&["--to", "B:small", "--no-wait", "second"]);
    assert!(!no_wait.status.success() && stderr(&no_wait).contains("full"), "{}", stderr(&no_wait));
    assert!(started.elapsed() < Duration::from_secs(5), "a no-wait put does not wait for room");
    let bounded = put_b(&["--to", "B:small", "--lifetime", "300ms", "third"]);
    assert!(!bounded.status.success());
    assert!(
        stderr(&bounded).contains("no room within 300ms"),
        "waits its lifetime, not 10 s: {}",
        stderr(&bounded)
    );

    // --ttl sets the lifetime in seconds.
    assert!(put(&["--to", "A:q", "--ttl", "60", "ttl"]).status.success());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let socket = s.runtime_dir().join("A.sock");
    let got = runtime.block_on(async {
        let mut client = linkbus::Client::connect(&socket).await.unwrap();
        client.get("q", 10, Duration::ZERO).await.unwrap()
    });
    let ttl = got.iter().find(|m| &m.content.payload[..] == b"ttl").expect("the ttl message");
    let left = ttl.content.lifetime.unwrap().as_ms();
    assert!((50_000..=60_000).contains(&left), "{left}");
    let kept = got.iter().find(|m| &m.content.payload[..] == b"kept").expect("the persistent message");
    assert_eq!(kept.content.reliability, linkbus::Reliability::Persistent);
}

/// A queue's declared defaults: the reliability of puts that choose none, and whether a put
/// to it when full waits or is refused at once.
#[test]
fn queue_defaults_decide_reliability_and_what_a_full_queue_does() {
    let s = Scratch::new();
    let yaml = format!(
        "node: {{ name: C, listen: none, data_dir: '{}' }}\nqueues: [ {{ name: durable, order: fifo, reliability: persistent }}, \
         {{ name: plain, order: fifo }}, {{ name: strict, queue_messages_max: 1, when_full: reject }} ]\n",
        s.path().join("c-data").display()
    );
    let _c = s.start_node("C", &["-c", s.write("c.yaml", &yaml).to_str().unwrap()]);
    let put = |args: &[&str]| s.run(&[&["put", "--node", "C"][..], args].concat());
    for (args, ok) in [
        (&["--to", "C:durable", "chosen by the queue"][..], true),
        (&["--to", "C:durable", "--volatile", "chosen by the sender"][..], true),
        (&["--to", "C:plain", "plain"][..], true),
        (&["--to", "C:durable", "--no-wait", "no-wait"][..], false),
    ] {
        let out = put(args);
        assert_eq!(out.status.success(), ok, "{args:?}: {}", stderr(&out));
    }
    let no_wait = put(&["--to", "C:durable", "--no-wait", "x"]);
    assert!(stderr(&no_wait).contains("cannot carry a persistent message"), "{}", stderr(&no_wait));

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let socket = s.runtime_dir().join("C.sock");
    let (durable, plain) = runtime.block_on(async {
        let mut client = linkbus::Client::connect(&socket).await.unwrap();
        let durable = client.get("durable", 10, Duration::ZERO).await.unwrap();
        (durable, client.get("plain", 10, Duration::ZERO).await.unwrap())
    });
    let reliability: Vec<_> = durable.iter().chain(&plain).map(|m| m.content.reliability).collect();
    use linkbus::Reliability::{Persistent, Volatile};
    assert_eq!(reliability, [Persistent, Volatile, Volatile]);

    // `when_full: reject`: refused at once although the put would wait 10 s.
    assert!(put(&["--to", "C:strict", "first"]).status.success());
    let started = Instant::now();
    let second = put(&["--to", "C:strict", "second"]);
    assert!(!second.status.success());
    assert!(stderr(&second).contains("is full (1 messages) and rejects puts then"), "{}", stderr(&second));
    assert!(started.elapsed() < Duration::from_secs(5), "not waited for");
}

/// A node that shuts down answers the requests under way: a put or a commit waiting for
/// room in a full queue is refused as not accepted (and is not there after a restart), and
/// a get (on the socket or in-process) and a consumer waiting for messages are told why
/// they end, instead of finding their connection closed with the outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_shuts_down_answers_the_requests_waiting_in_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let start = || {
        node_a(
            dir.path(),
            "queues: [ { name: small, queue_messages_max: 1, reliability: persistent }, { name: idle } ]",
        )
    };
    let node = start().await?;
    let connect = || Client::connect(node.socket_path());
    let small: linkbus::Address = "A:small".parse()?;
    let mut producer = connect().await?;
    producer.set_put_timeout(Duration::from_secs(60));
    producer.put(Content::buf(small.clone(), "first")).await?;

    let waiting_put = tokio::spawn(async move { producer.put(Content::buf(small, "second")).await });
    let mut in_transaction = connect().await?;
    in_transaction.set_put_timeout(Duration::from_secs(60));
    in_transaction.begin().await?;
    in_transaction.put(Content::buf("A:small".parse()?, "third")).await?;
    let waiting_commit = tokio::spawn(async move { in_transaction.commit().await });
    let mut getter = connect().await?;
    let waiting_get = tokio::spawn(async move { getter.get("idle", 10, Duration::from_secs(60)).await });
    let mut consumer = connect().await?.consume("idle", 10, u64::MAX).await?;
    let mut in_process = node.client();
    let waiting_in_process =
        tokio::spawn(async move { in_process.get("idle", 10, Duration::from_secs(60)).await });
    // Time for the node to read each request and start waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.shutdown().await;

    // The node's reason, for a refusal of the node's own (else what came instead).
    let why = |outcome: Option<&ClientError>| match outcome {
        Some(ClientError::Refused { code: ErrorCode::Internal, message, .. }) => message.clone(),
        other => format!("not refused by the node: {other:?}"),
    };
    let step = Duration::from_secs(20);
    let put = why(tokio::time::timeout(step, waiting_put).await??.as_ref().err());
    assert!(put.contains("node A is shutting down, not accepted"), "{put}");
    let commit = why(tokio::time::timeout(step, waiting_commit).await??.as_ref().err());
    assert!(commit.contains("node A is shutting down, not committed"), "{commit}");
    let get = why(tokio::time::timeout(step, waiting_get).await??.as_ref().err());
    assert!(get.contains("node A is shutting down"), "{get}");
    let consumed = why(tokio::time::timeout(step, consumer.next()).await?.as_ref().err());
    assert!(consumed.contains("node A is shutting down"), "{consumed}");
    let in_process = why(tokio::time::timeout(step, waiting_in_process).await??.as_ref().err());
    assert!(in_process.contains("node A is shutting down"), "{in_process}");

    // Only the accepted message was kept.
    let node = start().await?;
    let kept = node.client().get("small", 10, Duration::ZERO).await?;
    let kept: Vec<&[u8]> = kept.iter().map(|m| &m.content.payload[..]).collect();
    assert_eq!(kept, [&b"first"[..]]);
    node.shutdown().await;
    Ok(())
}

/// Requests a node received but had not started when it shut down are answered too: an
/// acknowledgement behind a waiting get is carried out (the message it settles is gone
/// after a restart), and a put behind it is refused as not carried out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_received_before_a_shutdown_are_answered_and_acknowledgements_kept() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let start = || node_a(dir.path(), "queues: [ { name: kept, reliability: persistent }, { name: idle } ]");
    let node = start().await?;
    node.client().put(Content::buf("A:kept".parse()?, "taken")).await?;
    let mut stream = tokio::net::UnixStream::connect(node.socket_path()).await?;
    let frames = |requests: Vec<Request>| {
        let mut out = BytesMut::new();
        requests.iter().for_each(|r| r.encode(&mut out));
        out
    };
    // The answers until the node closes the connection.
    let mut buf = BytesMut::new();
    let mut answers =
        async |stream: &mut tokio::net::UnixStream, count: usize| -> anyhow::Result<Vec<Response>> {
            let mut got = Vec::new();
            while got.len() < count {
                match split_frame(&mut buf, 1 << 20).map_err(anyhow::Error::msg)? {
                    Some((kind, body)) => got.push(Response::decode(kind, body)?),
                    None if stream.read_buf(&mut buf).await? == 0 => break,
                    None => {}
                }
            }
            Ok(got)
        };
    let get = |queue: &str, wait_ms, pending| Request::Get {
        queue: queue.into(),
        count_max: 10,
        wait_ms,
        bytes_max: u64::MAX,
        pending,
        groups: Default::default(),
    };
    stream.write_all(&frames(vec![get("kept", 0, true)])).await?;
    let Some(Response::Messages { tags, .. }) = answers(&mut stream, 1).await?.pop() else {
        panic!("the pending get's messages")
    };
    assert_eq!(tags.len(), 1);
    // Sent together: a get that waits, then an acknowledgement and a put behind it.
    let late = Request::Put {
        contents: vec![Content::buf("A:kept".parse()?, "late")],
        timeout_ms: 0,
        no_wait: false,
    };
    let ack = Request::Ack { queue: "kept".into(), tags };
    stream.write_all(&frames(vec![get("idle", 60_000, false), ack, late])).await?;
    // Time for the node to read them and start waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.shutdown().await;

    let got = tokio::time::timeout(Duration::from_secs(20), answers(&mut stream, 4)).await??;
    let refusal = |response: &Response, text: &str| matches!(response, Response::Error { code: ErrorCode::Internal, message, .. } if message.contains(text));
    assert_eq!(got.len(), 3, "three answers, then the connection closes: {got:?}");
    assert!(refusal(&got[0], "node A is shutting down"), "{got:?}");
    assert!(matches!(got[1], Response::Settled(1)), "{got:?}");
    assert!(refusal(&got[2], "node A is shutting down; request not carried out"), "{got:?}");

    // The acknowledged message is gone, and the refused put was not carried out.
    let node = start().await?;
    let left = node.client().get("kept", 10, Duration::ZERO).await?;
    assert!(left.is_empty(), "{left:?}");
    node.shutdown().await;
    Ok(())
}

/// A client that stops reading while its answer is written does not hold a node that
/// shuts down: after a short grace the connection ends, and the messages the answer
/// carried go back to their queue (kept across the restart, marked redelivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_a_client_does_not_read_at_shutdown_goes_back_to_its_queue() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let start = || {
        node_a(
            dir.path(),
            "messages: { message_bytes_max: 33554432 }\nqueues: [ { name: big, reliability: persistent } ]",
        )
    };
    let node = start().await?;
    // Far more than a Unix socket's buffers hold.
    let payload = vec![7u8; 24 << 20];
    node.client().put(Content::buf("A:big".parse()?, payload.clone())).await?;
    let mut stream = tokio::net::UnixStream::connect(node.socket_path()).await?;
    let mut out = BytesMut::new();
    let get = Request::Get {
        queue: "big".into(),
        count_max: 1,
        wait_ms: 0,
        bytes_max: u64::MAX,
        pending: false,
        groups: Default::default(),
    };
    get.encode(&mut out);
    stream.write_all(&out).await?;
    // Time for the node to take the message and fill the socket; nothing is read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), node.shutdown()).await?;
    let took = started.elapsed();
    drop(stream);

    let node = start().await?;
    let back = node.client().get("big", 10, Duration::ZERO).await?;
    assert_eq!(back.len(), 1, "the message is back (shutdown took {took:?})");
    assert!(back[0].redelivered && back[0].content.payload[..] == payload[..]);
    node.shutdown().await;
    Ok(())
}

/// Node A in this process, its data in `dir` (kept across restarts), configured by `yaml`.
async fn node_a(dir: &std::path::Path, yaml: &str) -> anyhow::Result<linkbus::Node> {
    use linkbus::config::{self, Overrides};
    let mut tree = config::parse_yaml(yaml)?;
    config::apply_overrides(&mut tree, &Overrides::local("A", dir));
    Ok(linkbus::Node::start(config::from_value(&tree)?).await?)
}
