//! A consumer the node pushes to (`Client::consume`) and puts that do not wait for their
//! answers (`Client::put_async`, `Client::flush`), on a real node process and in-process:
//! messages arrive in order without a request each; a consumer that ends takes nothing
//! more; a missing queue, a message over the consumer's limit or an open transaction ends
//! the consumer with the reason (the message stays); each put's outcome comes back in
//! order, a refused one among accepted ones, also past the bound on unanswered puts.

use crate::support;

use std::time::Duration;

use linkbus::client::protocol::ErrorCode;
use linkbus::{Client, ClientError, Consumer, Content, MessageId};
use support::Scratch;

/// Longest any step here may take.
const STEP: Duration = Duration::from_secs(20);

/// The next `count` messages' payloads, in the order they came.
async fn take(consumer: &mut Consumer, count: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < count {
        let batch = tokio::time::timeout(STEP, consumer.next()).await.expect("in time").expect("a batch");
        assert!(!batch.is_empty(), "a consumer's batch is never empty");
        got.extend(batch.into_iter().map(|m| String::from_utf8(m.content.payload.to_vec()).unwrap()));
    }
    got
}

fn texts(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// The ids of accepted puts, in order; panics on a refused one.
fn accepted(outcomes: Vec<Result<MessageId, ClientError>>) -> Vec<MessageId> {
    outcomes.into_iter().map(|o| o.expect("accepted")).collect()
}

/// Runs `test` with the client socket of a node process `A` with queue `q`.
fn on_a_node<F: std::future::Future<Output = ()>>(test: impl FnOnce(std::path::PathBuf) -> F) {
    let s = Scratch::new();
    let a = s.start_lone("A", &["q:fifo"]);
    tokio::runtime::Runtime::new().unwrap().block_on(test(a.socket.clone()));
}

#[test]
fn a_consumer_is_pushed_each_message_in_order_and_async_puts_keep_their_order() {
    on_a_node(|socket| async move {
        let to: linkbus::Address = "A:q".parse().unwrap();
        let mut consumer = Client::connect(&socket).await.unwrap().consume("q", 100, u64::MAX).await.unwrap();
        let mut producer = Client::connect(&socket).await.unwrap();
        // One at a time, each waiting for its answer: each reaches the waiting consumer.
        for text in texts(0..10) {
            producer.put(Content::buf(to.clone(), text)).await.unwrap();
        }
        assert_eq!(take(&mut consumer, 10).await, texts(0..10));

        // Far more puts than may go unanswered, none waiting for its answer; a call in
        // between reads the answers owed before its own.
        let puts = async {
            for text in texts(10..510) {
                producer.put_async(Content::buf(to.clone(), text)).await.unwrap();
            }
            producer.queues("q").await.expect("a call with answers owed before its own");
            for text in texts(510..1000) {
                producer.put_async(Content::buf(to.clone(), text)).await.unwrap();
            }
        };
        tokio::time::timeout(STEP, puts).await.expect("in time");
        let ids = accepted(tokio::time::timeout(STEP, producer.flush()).await.expect("in time").unwrap());
        assert_eq!(ids.len(), 990, "one outcome per put, those read by the call in between too");
        assert!(ids.windows(2).all(|w| w[0].sequence < w[1].sequence), "in the order of the puts");
        assert!(producer.flush().await.unwrap().is_empty(), "each outcome is handed out once");
        assert_eq!(take(&mut consumer, 990).await, texts(10..1000));

        // The consumer took them: nothing is left for anybody else.
        let mut other = Client::connect(&socket).await.unwrap();
        assert!(other.get("q", 10, Duration::ZERO).await.unwrap().is_empty());
    });
}

#[test]
fn a_consumer_that_ends_takes_nothing_more() {
    on_a_node(|socket| async move {
        let consumer = Client::connect(&socket).await.unwrap().consume("q", 10, u64::MAX).await.unwrap();
        drop(consumer);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut producer = Client::connect(&socket).await.unwrap();
        producer.put(Content::buf("A:q".parse().unwrap(), "after")).await.unwrap();
        let mut other = Client::connect(&socket).await.unwrap();
        let got = other.get("q", 10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1, "the ended consumer did not take it");
        assert!(!got[0].redelivered && got[0].backout_count == 0, "nor took it and gave it back");
    });
}

#[test]
fn a_consumer_ends_with_the_reason_and_a_message_too_large_for_it_stays() {
    on_a_node(|socket| async move {
        let code = |e: ClientError| match e {
            ClientError::Refused { code, message, .. } => (code, message),
            other => panic!("refused expected: {other}"),
        };
        let mut missing =
            Client::connect(&socket).await.unwrap().consume("nope", 10, u64::MAX).await.unwrap();
        let (c, message) =
            code(tokio::time::timeout(STEP, missing.next()).await.expect("in time").unwrap_err());
        assert_eq!(c, ErrorCode::UnknownQueue, "{message}");
        assert!(message.contains("'nope'"), "{message}");
        assert!(matches!(missing.next().await, Err(ClientError::Ended)), "it has ended");

        let mut small = Client::connect(&socket).await.unwrap().consume("q", 10, 200).await.unwrap();
        let mut producer = Client::connect(&socket).await.unwrap();
        producer.put(Content::buf("A:q".parse().unwrap(), vec![7u8; 1000])).await.unwrap();
        let (c, message) =
            code(tokio::time::timeout(STEP, small.next()).await.expect("in time").unwrap_err());
        assert_eq!(c, ErrorCode::TooLarge, "{message}");
        let mut other = Client::connect(&socket).await.unwrap();
        assert_eq!(other.get("q", 10, Duration::ZERO).await.unwrap().len(), 1, "the message stayed");

        let mut in_transaction = Client::connect(&socket).await.unwrap();
        in_transaction.begin().await.unwrap();
        let mut refused = in_transaction.consume("q", 10, u64::MAX).await.unwrap();
        let (c, message) =
            code(tokio::time::timeout(STEP, refused.next()).await.expect("in time").unwrap_err());
        assert_eq!(c, ErrorCode::BadRequest, "{message}");
        assert!(message.contains("transaction"), "{message}");
    });
}

#[test]
fn async_puts_hand_out_a_refusal_among_accepted_puts_in_order() {
    on_a_node(|socket| async move {
        let mut producer = Client::connect(&socket).await.unwrap();
        for to in ["A:q", "A:nope", "A:q"] {
            producer.put_async(Content::buf(to.parse().unwrap(), to)).await.unwrap();
        }
        let outcomes = tokio::time::timeout(STEP, producer.flush()).await.expect("in time").unwrap();
        assert_eq!(outcomes.len(), 3);
        assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
        match &outcomes[1] {
            Err(ClientError::Refused { code: ErrorCode::UnknownQueue, message, .. }) => {
                assert!(message.contains("'nope'"), "{message}");
            }
            other => panic!("the put to a missing queue was refused: {other:?}"),
        }
        // Puts not flushed keep their connection from consuming (their outcomes would be lost).
        producer.put_async(Content::buf("A:q".parse().unwrap(), "x")).await.unwrap();
        let consumed = tokio::time::timeout(STEP, producer.consume("q", 1, u64::MAX)).await.expect("in time");
        assert!(matches!(consumed, Err(ClientError::Protocol(_))), "refused before anything is sent");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_clients_consume_and_put_without_waiting_alike() -> anyhow::Result<()> {
    use linkbus::config::{self, Overrides};
    let dir = tempfile::tempdir()?;
    let overrides = Overrides::local("A", dir.path());
    let mut tree = config::parse_yaml("queues: [ { name: q, order: fifo } ]")?;
    config::apply_overrides(&mut tree, &overrides);
    let node = linkbus::Node::start(config::from_value(&tree)?).await?;
    let mut consumer = node.client().consume("q", 7, u64::MAX).await?;
    let mut producer = node.client();
    for text in texts(0..20) {
        producer.put_async(Content::buf("A:q".parse()?, text)).await?;
    }
    producer.put_async(Content::buf("A:nope".parse()?, "x")).await?;
    let outcomes = producer.flush().await?;
    assert_eq!(outcomes.len(), 21);
    assert!(outcomes[..20].iter().all(Result::is_ok) && outcomes[20].is_err(), "{outcomes:?}");
    let mut got = Vec::new();
    while got.len() < 20 {
        let batch = tokio::time::timeout(STEP, consumer.next()).await??;
        assert!(!batch.is_empty() && batch.len() <= 7, "batches of 1 to count_max: {}", batch.len());
        got.extend(batch.into_iter().map(|m| String::from_utf8(m.content.payload.to_vec()).unwrap()));
    }
    assert_eq!(got, texts(0..20));

    // A node that shuts down ends its consumers, in-process and on the socket, idle as
    // they are.
    let mut on_socket = Client::connect(node.socket_path()).await?.consume("q", 7, u64::MAX).await?;
    node.shutdown().await;
    let ended = tokio::time::timeout(STEP, consumer.next()).await.expect("in time");
    assert!(ended.is_err(), "the in-process consumer ended");
    let ended = tokio::time::timeout(STEP, on_socket.next()).await.expect("in time");
    assert!(ended.is_err(), "the socket's consumer ended");
    Ok(())
}
