//! Durability with the default `fjall` store, on real processes: persistent messages in a
//! local queue survive `kill -9` in order and volatile ones do not; a restart with a queue
//! limit lowered below what the queue holds is refused with the numbers.

mod support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

#[test]
fn persistent_messages_survive_kill_9_and_volatile_ones_do_not() {
    let s = Scratch::new();
    let config = s.write("a.yaml", "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo } ]\n");
    let config = config.to_str().unwrap();
    let mut a = s.start_node("A", &["-c", config]);
    let lines: String = (1..=500).map(|n| format!("p{n}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--persistent", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    let volatile: String = (1..=100).map(|n| format!("v{n}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--volatile", "-"],
        volatile.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    a.kill();

    let mut a = s.start_node("A", &["-c", config]);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("store: fjall (durable: true)"), "{status}");
    let get = s.run(&["get", "--node", "A", "q", "--count", "1000", "--wait", "1s"]);
    assert_eq!(stdout(&get), lines, "every persistent message, in order, and no volatile one");

    // A limit lowered below what the queue holds: the node refuses to start and says why.
    let three = s.run_with_input(
        &["put", "--node", "A", "--to", "A:q", "--persistent", "-"],
        b"x\ny\nz\n",
        Duration::from_secs(10),
    );
    assert!(three.status.success(), "{}", stderr(&three));
    a.kill();
    let lowered = s.write(
        "a2.yaml",
        "node: { name: A, listen: none }\nqueues: [ { name: q, order: fifo, queue_messages_max: 2 } ]\n",
    );
    let refused = s.run(&["node", "run", "-c", lowered.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("queue 'q' holds 3 messages, more than its queue_messages_max 2"),
        "{}",
        stderr(&refused)
    );
}
