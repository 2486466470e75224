//! In-process clients (`Node::client`): an application that embeds its nodes talks to them
//! without the socket or any encoding, with the same rules — across a real TCP link between
//! two nodes in this process, with taking pending, giving back on drop, transactions,
//! refusals, and the refusal after shutdown.

use std::time::Duration;

use linkbus::client::ClientError;
use linkbus::config::{self, Overrides};
use linkbus::{Content, Node};

/// Node B listens with queue `q`; A dials it (plaintext, fjall stores under `dir`).
async fn pair(dir: &std::path::Path) -> anyhow::Result<(Node, Node)> {
    let overrides = |name: &str| Overrides {
        name: Some(name.to_owned()),
        data_dir: Some(dir.join(name)),
        client_socket: Some(dir.join(format!("{name}.sock"))),
        insecure_plaintext: true,
        ..Overrides::default()
    };
    let mut tree = config::parse_yaml(
        "node: { listen: 127.0.0.1:0 }\npeers: [ { name: A } ]\nqueues: [ { name: q, order: fifo } ]",
    )?;
    config::apply_overrides(&mut tree, &overrides("B"));
    let b = Node::start(config::from_value(&tree)?).await?;
    let address = b.listen_address().unwrap_or_default().to_owned();
    let mut tree = config::parse_yaml("node: { listen: none }\npeers: [ { name: B } ]")?;
    config::apply_overrides(&mut tree, &Overrides { peers: vec![format!("B={address}")], ..overrides("A") });
    let a = Node::start(config::from_value(&tree)?).await?;
    Ok((a, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_clients_put_and_take_across_a_link_with_the_sockets_rules() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = pair(dir.path()).await?;
    let mut producer = a.client();
    let to: linkbus::Address = "B:q".parse()?;
    let contents: Vec<Content> = (0..100).map(|i| Content::buf(to.clone(), format!("m{i}"))).collect();
    assert_eq!(producer.put_batch(contents).await?.len(), 100);

    // Taken pending by one client, given back when it drops (as a closed connection).
    let mut first = b.client();
    let mut taken = Vec::new();
    while taken.len() < 10 {
        taken.extend(first.get_pending("q", 10 - taken.len() as u32, Duration::from_secs(5), 1 << 20).await?);
    }
    assert_eq!(taken[0].message.content.payload, "m0");
    drop(first);
    let mut consumer = b.client();
    let mut got = Vec::new();
    while got.len() < 100 {
        let batch = consumer.get("q", 100, Duration::from_secs(5)).await?;
        assert!(!batch.is_empty(), "all 100 arrive within the wait; got {}", got.len());
        got.extend(batch);
    }
    let payloads: Vec<String> =
        got.iter().map(|m| String::from_utf8_lossy(&m.content.payload).into_owned()).collect();
    let want: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    assert_eq!(payloads, want, "each once, in order");
    assert!(got[..10].iter().all(|m| m.redelivered), "the ones given back say so");

    // A transaction rolled back leaves nothing; a put to a queue this node lacks is refused.
    producer.begin().await?;
    producer.put(Content::buf(to.clone(), "never")).await?;
    producer.rollback().await?;
    let refused = producer.put(Content::buf("A:nope".parse()?, "x")).await;
    assert!(matches!(&refused, Err(ClientError::Refused { .. })), "{refused:?}");
    let late = consumer.get("q", 10, Duration::from_millis(300)).await?;
    assert!(late.is_empty(), "the rolled-back put never arrived: {late:?}");

    a.shutdown().await;
    let late = producer.put(Content::buf(to, "late")).await;
    assert!(
        matches!(&late, Err(ClientError::Refused { message, .. }) if message.contains("shut down")),
        "a node that was shut down refuses its in-process clients: {late:?}"
    );
    b.shutdown().await;
    Ok(())
}

/// Messages larger than what a link hands the socket at a time (`DATA_BACKLOG_BYTES`) go out
/// in several writes, and the link must go on after each without waiting for a timer: a
/// form of the link task's direct writes in which nothing said the socket had taken a
/// write made each of the 40 messages below wait for the 250 ms expiry sweep (11 s in
/// all, where they take well under a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_cross_a_link_without_waiting_for_a_timer() -> anyhow::Result<()> {
    const COUNT: usize = 40;
    let dir = tempfile::tempdir()?;
    let (a, b) = pair(dir.path()).await?;
    let mut producer = a.client();
    let mut consumer = b.client();
    let to: linkbus::Address = "B:q".parse()?;
    let started = std::time::Instant::now();
    for i in 0..COUNT {
        producer.put(Content::buf(to.clone(), vec![i as u8; 1 << 20])).await?;
    }
    let mut got = Vec::new();
    while got.len() < COUNT && started.elapsed() < Duration::from_secs(30) {
        got.extend(consumer.get("q", 8, Duration::from_secs(1)).await?);
    }
    let elapsed = started.elapsed();
    assert_eq!(got.len(), COUNT, "all arrive");
    for (i, m) in got.iter().enumerate() {
        assert!(
            m.content.payload.len() == 1 << 20 && m.content.payload.iter().all(|&x| x == i as u8),
            "message {i} intact, in order"
        );
    }
    assert!(elapsed < Duration::from_secs(8), "no message waited for a timer: {elapsed:?} for {COUNT} MiB");
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

/// A batch larger than one request (by count, then by bytes) goes in several requests,
/// each message once and in order, with one id each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_one_request_is_put_in_order() -> anyhow::Result<()> {
    use linkbus::client::{PUT_BATCH_BYTES_MAX, PUT_BATCH_MESSAGES_MAX};
    let dir = tempfile::tempdir()?;
    let (a, b) = pair(dir.path()).await?;
    let mut producer = a.client();
    let mut consumer = b.client();
    let to: linkbus::Address = "B:q".parse()?;
    // The link is up first: its `link_up` event would take a number between two requests.
    producer.put(Content::buf(to.clone(), "first")).await?;
    let mut warm = Vec::new();
    for _ in 0..5 {
        warm.extend(consumer.get("q", 1, Duration::from_secs(5)).await?);
        if !warm.is_empty() {
            break;
        }
    }
    assert_eq!(warm.len(), 1, "the first message arrives");
    let large = PUT_BATCH_BYTES_MAX / 3 - 1024;
    let mut want: Vec<Vec<u8>> =
        (0..2 * PUT_BATCH_MESSAGES_MAX + 7).map(|i| format!("m{i}").into_bytes()).collect();
    want.extend((0..5u8).map(|i| vec![i; large]));
    let contents: Vec<Content> = want.iter().map(|p| Content::buf(to.clone(), p.clone())).collect();
    let ids = producer.put_batch(contents).await?;
    assert_eq!(ids.len(), want.len(), "one id each");
    assert!(ids.windows(2).all(|w| w[1].sequence == w[0].sequence + 1), "ids in order");
    let mut got = Vec::new();
    while got.len() < want.len() {
        let batch = consumer.get("q", 10_000, Duration::from_secs(5)).await?;
        assert!(!batch.is_empty(), "all arrive within the wait; got {}", got.len());
        got.extend(batch.into_iter().map(|m| m.content.payload));
    }
    assert!(got.iter().zip(&want).all(|(g, w)| g[..] == w[..]), "each once, in order");
    assert_eq!(got.len(), want.len());
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}
