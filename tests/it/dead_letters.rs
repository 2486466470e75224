//! Dead letters carry a reason code; `linkbus dlq ls` lists them without taking them and
//! `linkbus dlq replay` puts them again, keeping those that fail again.

use crate::support;

use std::time::Duration;

use support::{Scratch, stderr, stdout};

#[test]
fn dead_letters_have_codes_and_can_be_listed_and_replayed() {
    let s = Scratch::new();
    let (_a, b) = s.start_pair(
        "",
        "queues: [ { name: small, order: fifo, queue_messages_max: 1 }, { name: aux, order: fifo } ]",
    );
    for (to, text) in [("B:small", "first"), ("B:small,B:aux", "second"), ("B:missing", "lost")] {
        let mut args = vec!["put", "--node", "A"];
        for t in to.split(',') {
            args.extend(["--to", t]);
        }
        args.push(text);
        let put = s.run(&args);
        assert!(put.status.success(), "{}", stderr(&put));
    }
    b.wait_for_log("Message dead-lettered.", 2, Duration::from_secs(10));

    let ls = s.run(&["dlq", "ls", "--node", "B"]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let text = stdout(&ls);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("queue_full") && lines[0].contains("to B:small"), "{text}");
    assert!(
        lines[1].contains("queue_missing") && lines[1].contains("queue 'missing' does not exist"),
        "{text}"
    );
    let again = stdout(&s.run(&["dlq", "ls", "--node", "B"]));
    assert_eq!(again.lines().count(), 2, "listing takes nothing");

    // Room in `small`: the first replays; the one for a missing queue fails and stays.
    let get = s.run(&["get", "--node", "B", "small"]);
    assert_eq!(stdout(&get), "first\n");
    let replay = s.run(&["dlq", "replay", "--node", "B"]);
    assert!(!replay.status.success(), "one could not be replayed");
    assert!(stderr(&replay).contains("replayed 1, failed 1"), "{}", stderr(&replay));
    let get = s.run(&["get", "--node", "B", "small"]);
    assert_eq!(stdout(&get), "second\n", "replayed to its recipient");
    let aux = s.run(&["get", "--node", "B", "aux", "--count", "5", "--wait", "300ms"]);
    assert_eq!(stdout(&aux), "second\n", "the recipient that had it gets no second copy");
    let left = stdout(&s.run(&["dlq", "ls", "--node", "B"]));
    assert!(left.lines().count() == 1 && left.contains("queue_missing"), "{left}");
}

#[test]
fn a_message_too_large_for_its_queue_is_dead_lettered_and_its_sender_told() {
    let s = Scratch::new();
    let (_a, _b) = s.start_pair("", "queues: [ { name: tiny, message_bytes_max: 10 } ]");
    // A cannot know B's queue limit: B dead-letters it, and the result says why.
    let put =
        s.run(&["put", "--node", "A", "--to", "B:tiny", "--wait-result", "10s", "twenty bytes of text"]);
    assert!(!put.status.success());
    let out = stdout(&put);
    assert!(
        out.contains("B:tiny failed too_large: payload is over queue B:tiny's message_bytes_max"),
        "{out}"
    );
    let ls = stdout(&s.run(&["dlq", "ls", "--node", "B"]));
    assert!(ls.contains("too_large") && ls.contains("to B:tiny"), "{ls}");
}

/// A burst of dead letters logs a handful of lines and one count, not a line per message
/// (`log.repeats_max` per reason and `log.interval_ms`; the count comes out at the end of
/// the interval, or when the node stops).
#[test]
fn a_burst_of_dead_letters_logs_a_count_not_a_line_each() {
    let s = Scratch::new();
    let (_a, mut b) = s.start_pair("", "log: { repeats_max: 3, interval_ms: 60000 }");
    let lines: String = (0..1000).map(|i| format!("lost {i}\n")).collect();
    let put = s.run_with_input(
        &["put", "--node", "A", "--to", "B:missing", "-"],
        lines.as_bytes(),
        Duration::from_secs(60),
    );
    assert!(put.status.success(), "{}", stderr(&put));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stdout(&s.run(&["dlq", "ls", "--node", "B", "--count", "2000"])).lines().count() < 1000 {
        assert!(std::time::Instant::now() < deadline, "all 1000 were dead-lettered");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(b.stop(), "B stops cleanly");
    let log = b.log_text();
    assert_eq!(log.matches("Message dead-lettered.").count(), 3, "{log}");
    let summary =
        log.lines().find(|l| l.contains("reason=\"message dead-lettered\"") && l.contains("more=997"));
    assert!(summary.is_some(), "one line counts the rest:\n{log}");
}
