//! The result book, its records and the result messages' codec.
use super::*;
use linkbus_plugin_api::{Content, Lifetime};

fn message(sequence: u64, to: &[&str], lifetime_ms: u64) -> Message {
    let mut content = Content::buf(to[0].parse().unwrap(), "x").with_lifetime(Lifetime::from_ms(lifetime_ms));
    content.recipients = to.iter().map(|a| a.parse().unwrap()).collect();
    content.results = true;
    Message {
        encoding: Default::default(),
        id: MessageId { source: NodeName::new("A").unwrap(), sequence, created_unix_ms: 1 },
        hop_count: 0,
        redelivered: false,
        backout_count: 0,
        content: Box::new(content),
    }
}

/// A book keeping its results in `store`, as a node with a durable store has.
fn kept_book(store: &Arc<dyn Store>) -> ResultBook {
    ResultBook::new(Duration::from_millis(100), 10).kept_by(Arc::new(Committer::direct(store.clone())))
}

#[test]
fn results_of_persistent_messages_survive_a_restart_and_volatile_ones_are_not_kept() {
    let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
    let (b, c): (Address, Address) = ("B:q".parse().unwrap(), "C:q".parse().unwrap());
    let mut persistent = message(1, &["B:q", "C:q"], 60_000);
    persistent.content.reliability = Reliability::Persistent;
    let mut finished = message(2, &["B:q"], 60_000);
    finished.content.reliability = Reliability::Persistent;
    let mut refused = message(3, &["B:q"], 60_000);
    refused.content.reliability = Reliability::Persistent;
    {
        let book = kept_book(&store);
        let now = Instant::now();
        for m in [&persistent, &finished, &refused, &message(4, &["B:q"], 60_000)] {
            book.track(m).unwrap();
            book.accepted(m.id.sequence, now);
        }
        assert!(book.record(1, &b, Outcome::failed("queue_full", "full\tup")));
        assert!(book.record(2, &b, Outcome::Delivered));
        book.forget(3);
    }
    let book = kept_book(&store);
    let now = Instant::now();
    assert_eq!(
        book.load(store.as_ref(), now).map(|l| (l.open, l.sequence_max)),
        Ok((1, 2)),
        "message 1 is open again"
    );
    let got = book.get(&[1, 2, 3, 4]);
    assert_eq!(
        got[0].as_ref().map(|r| r.recipients.clone()),
        Some(vec![(b.clone(), Some(Outcome::failed("queue_full", "full up"))), (c.clone(), None)])
    );
    assert_eq!(got[0].as_ref().map(|r| r.id.created_unix_ms), Some(1));
    assert!(got[1].as_ref().is_some_and(MessageResults::is_final), "finished ones answer questions");
    assert!(got[2].is_none() && got[3].is_none(), "refused and volatile messages are not kept");
    assert!(book.record(1, &c, Outcome::Delivered), "a report after the restart is taken");
    assert!(book.time_out(now + Duration::from_secs(61)).is_empty(), "it finished");
    let again = kept_book(&store);
    assert_eq!(again.load(store.as_ref(), now).map(|l| l.open), Ok(0));
    assert!(again.get(&[1])[0].as_ref().is_some_and(MessageResults::is_final));
}

#[test]
fn a_restarted_book_times_out_what_passed_its_deadline_while_down_and_refuses_damage() {
    let store: Arc<dyn Store> = Arc::new(linkbus_store_memory::MemoryStore::new());
    let mut m = message(1, &["B:q"], 10);
    m.content.reliability = Reliability::Persistent;
    let book = kept_book(&store);
    book.track(&m).unwrap();
    book.accepted(1, Instant::now());
    drop(book);
    std::thread::sleep(Duration::from_millis(150));
    let book = kept_book(&store);
    let now = Instant::now();
    assert_eq!(book.load(store.as_ref(), now).map(|l| l.open), Ok(1));
    let settled = book.time_out(now);
    assert_eq!(settled.len(), 1, "10 ms lifetime + 100 ms wait passed while the node was down");
    assert_eq!(settled[0].2, Outcome::TimedOut);

    let mut damaged = Batch::new();
    let mut value = encode_record(&book.get(&[1])[0].clone().unwrap(), None, 5).to_vec();
    value[7] ^= 1;
    damaged.put(RESULTS_SPACE, 9u64.to_be_bytes().to_vec(), value);
    store.write(damaged, true).unwrap();
    let loaded = kept_book(&store).load(store.as_ref(), now).unwrap();
    assert_eq!((loaded.open, loaded.damaged), (0, 1), "the damaged record does not stop the start");
    let moved =
        store.scan(DAMAGED_SPACE, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, 10).unwrap();
    assert_eq!(moved.len(), 1, "it is moved aside");
    assert_eq!(store.get(RESULTS_SPACE, &9u64.to_be_bytes()).unwrap(), None);
}

#[test]
fn each_recipient_gets_one_final_outcome() {
    let book = ResultBook::new(Duration::from_millis(100), 10);
    let now = Instant::now();
    book.track(&message(1, &["B:q", "C:q", "B:q"], 1000)).unwrap();
    book.accepted(1, now);
    let b: Address = "B:q".parse().unwrap();
    let c: Address = "C:q".parse().unwrap();
    assert!(book.record(1, &b, Outcome::Delivered));
    assert!(!book.record(1, &b, Outcome::Expired), "the first outcome is final");
    assert!(!book.record(2, &b, Outcome::Delivered), "unknown message");
    assert_eq!(book.pending(), 1);
    assert!(book.record(1, &c, Outcome::failed("queue_missing", "no such queue")));
    assert_eq!(book.pending(), 0);
    let results = book.get(&[1]).remove(0).unwrap();
    assert_eq!(results.recipients.len(), 2, "a recipient named twice has one slot");
    assert!(results.is_final());
}

#[test]
fn open_recipients_time_out_after_lifetime_plus_wait_and_the_limit_holds() {
    let book = ResultBook::new(Duration::from_millis(100), 1);
    let now = Instant::now();
    book.track(&message(1, &["B:q"], 1000)).unwrap();
    assert!(book.track(&message(2, &["B:q"], 1000)).unwrap_err().contains("results_pending_max"));
    assert!(book.time_out(now + Duration::from_secs(3600)).is_empty(), "not accepted yet: no deadline");
    book.accepted(1, now);
    assert!(book.time_out(now + Duration::from_millis(1099)).is_empty());
    let out = book.time_out(now + Duration::from_millis(1100));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].2, Outcome::TimedOut);
    assert_eq!(book.get(&[1])[0].as_ref().unwrap().recipients[0].1, Some(Outcome::TimedOut));
}

#[test]
fn a_provisional_outcome_gives_way_to_a_report_or_becomes_final_later() {
    let book = ResultBook::new(Duration::from_millis(100), 10);
    let now = Instant::now();
    book.track(&message(1, &["B:q", "B:r"], 60_000)).unwrap();
    book.accepted(1, now);
    let (q, r): (Address, Address) = ("B:q".parse().unwrap(), "B:r".parse().unwrap());
    book.record_provisional(1, &q, Outcome::Expired, now);
    book.record_provisional(1, &r, Outcome::Expired, now);
    assert_eq!(book.get(&[1])[0].as_ref().unwrap().recipients[0].1, None, "shown as open");
    assert!(book.record(1, &q, Outcome::Delivered), "the recipient's node knows better");
    let settled = book.time_out(now + Duration::from_millis(100));
    assert_eq!(settled.len(), 1);
    assert_eq!((&settled[0].1, &settled[0].2), (&r, &Outcome::Expired));
    let results = book.get(&[1]).remove(0).unwrap();
    assert_eq!(results.recipients[0].1, Some(Outcome::Delivered));
    assert!(results.is_final() && book.pending() == 0);
    assert!(book.lock().due.is_empty(), "a finished message leaves nothing in the index");

    // An unlimited lifetime still comes to an end; forgetting clears the index.
    let mut forever = message(2, &["B:q"], 1);
    forever.content.lifetime = Some(linkbus_plugin_api::Lifetime::UNLIMITED);
    book.track(&forever).unwrap();
    book.accepted(2, now);
    assert_eq!(book.lock().due.len(), 1);
    let end = now + UNLIMITED_LIFETIME_RESULT_WAIT + Duration::from_millis(100);
    assert_eq!(book.time_out(end).len(), 1);
    book.track(&message(3, &["B:q"], 1000)).unwrap();
    book.accepted(3, now);
    book.forget(3);
    assert!(book.lock().due.is_empty());
}

#[test]
fn reports_and_ids_round_trip() {
    let outcomes = vec![
        ("B:q".parse().unwrap(), Outcome::Delivered),
        ("B:r".parse().unwrap(), Outcome::failed("queue_missing", "queue 'r'\tdoes not\nexist")),
        ("C:q".parse().unwrap(), Outcome::Expired),
    ];
    let back = decode_report(encode_report(&outcomes).as_bytes()).unwrap();
    assert_eq!(back[0], outcomes[0]);
    assert_eq!(back[1].1, Outcome::failed("queue_missing", "queue 'r' does not exist"));
    assert_eq!(back[2], outcomes[2]);
    assert!(decode_report(b"B:q\tlost\t\t\n").unwrap_err().contains("unknown outcome"));
    assert!(decode_report(b"B:q\tfailed\tbogus\tx\n").unwrap_err().contains("unknown failure code"));
    let long = format!("B:q\tfailed\tqueue_full\t{}\n", "\u{e9}".repeat(2000));
    assert_eq!(decode_report(long.as_bytes()).unwrap()[0].1.reason().len(), 1024, "reasons are capped");
    assert_eq!(parse_id("A/42").unwrap().sequence, 42);
    assert!(parse_id("A42").is_err() && parse_id("A/x").is_err() && parse_id("1A/2").is_err());
}
