//! A filter with state: drops a message whose id header (`key`) has a value seen among the
//! last `window` values, so a sender's retries reach the queue once. Its configuration:
//! `{"key": "msg-id", "window": 10000}`. Messages without the header pass. The state lives
//! in the node's one instance of the filter: it is lost when the node restarts or the
//! instance is rebuilt.

use std::collections::{HashSet, VecDeque};

use linkbus_filter_sdk::{config_parsed, config_text, counter_add, export_filter, Filter, Hook, Message, Verdict};

struct DropDuplicates {
    key: String,
    window: usize,
    seen: HashSet<String>,
    order: VecDeque<String>,
}

impl Filter for DropDuplicates {
    fn init(config: &str) -> Result<Self, String> {
        let key = config_text(config, "key")?;
        let window = config_parsed(config, "window", Some(10_000))?;
        if window == 0 {
            return Err("window: give at least 1".to_owned());
        }
        Ok(DropDuplicates { key, window, seen: HashSet::new(), order: VecDeque::new() })
    }

    fn filter(&mut self, _hook: Hook, message: &Message) -> Verdict {
        let id = match message.header(&self.key) {
            Some(id) => id,
            None => return Verdict::Pass,
        };
        if self.seen.contains(id) {
            counter_add("duplicates", 1);
            return Verdict::Drop(format!("{} {} was seen before", self.key, id));
        }
        if self.order.len() == self.window {
            if let Some(oldest) = self.order.pop_front() {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        counter_add("unique", 1);
        Verdict::Pass
    }
}

export_filter!(DropDuplicates);
