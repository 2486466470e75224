//! Arrivals in runs.
use std::sync::Arc;

use linkbus_plugin_api::{Content, NodeName, Priority};

use super::*;

/// A run of arrived messages goes at once to its places (local queues, next hops, its hop
/// count raised) when all of it fits everywhere; anything else is handed back whole, to
/// the delivery of single messages.
#[test]
fn a_delivery_run_goes_at_once_where_it_all_fits_and_is_left_whole_otherwise() {
    let text = "node: { name: A, listen: none }\npeers: [ { name: B }, { name: C } ]\n\
                queues: [ { name: q, queue_messages_max: 10 }, { name: r } ]\n\
                routes: [ { to: 'D*', via: B } ]\nsecurity: { insecure_plaintext: true }\n\
                plugins: { store: { kind: memory } }";
    let n: Arc<NodeState> = crate::node::testing::node_from(text);
    let arrived = |to: &[&str], count: usize| -> Vec<Message> {
        (0..count)
            .map(|i| {
                let mut content = Content::buf(to[0].parse().unwrap(), format!("m{i}"));
                content.recipients.extend(to[1..].iter().map(|a| a.parse().unwrap()));
                let mut m = crate::flow::origin::stamp(&n, content, 0);
                m.hop_count = 1;
                m
            })
            .collect()
    };
    let now = Instant::now();
    let q = n.queue("q").unwrap().clone();
    let r = n.queue("r").unwrap().clone();
    assert!(take_run(&n, arrived(&["A:q"], 7), now).is_none());
    assert_eq!(q.len(), 7);
    let back = take_run(&n, arrived(&["A:q"], 4), now).expect("no room for all four");
    assert_eq!((back.len(), q.len()), (4, 7), "left whole");
    assert!(take_run(&n, arrived(&["A:q", "A:r"], 2), now).is_none(), "two queues with room");
    assert_eq!((q.len(), r.len()), (9, 2));
    let back = take_run(&n, arrived(&["A:q", "B:q"], 2), now).expect("q has room for one");
    assert_eq!((back.len(), q.len()), (2, 9));
    let back = take_run(&n, arrived(&["A:nope"], 2), now).expect("dead letters go one by one");
    assert_eq!(back.len(), 2);
    // Only messages of one class run together: a relayed run's room is checked in one.
    let (a, mut b) = (arrived(&["D1:q"], 1).remove(0), arrived(&["D1:q"], 1).remove(0));
    assert!(runs_with(&a, &b));
    b.content.priority = Priority::level(9).unwrap();
    assert!(!runs_with(&a, &b), "another priority");
    b = a.clone();
    b.hop_count += 1;
    assert!(!runs_with(&a, &b), "another hop count");
    let link = n.link(&NodeName::new("B").unwrap()).unwrap().clone();
    assert!(take_run(&n, arrived(&["D1:q", "D1:r"], 5), now).is_none());
    assert_eq!(link.queued(), 5, "relayed to the next hop");
    let (first, _, _) = link.lock().pop(|_| true).unwrap();
    assert_eq!(first.hop_count, 2, "one relay more");
    let mut run = arrived(&["B:q"], 2);
    for m in &mut run {
        m.hop_count = u8::try_from(n.config().messages.hop_count_max).unwrap();
    }
    let back = take_run(&n, run, now).expect("at the hop limit: dead letters, one by one");
    assert_eq!((back.len(), link.queued()), (2, 4));
}
