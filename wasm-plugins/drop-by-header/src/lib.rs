//! Drops messages whose header `key` has the value `value` (its configuration:
//! `{"key": "priority", "value": "spam"}`); lets the others go on.

use linkbus_filter_sdk::{config_text, counter_add, export_filter, Filter, Hook, Message, Verdict};

struct DropByHeader {
    key: String,
    value: String,
}

impl Filter for DropByHeader {
    fn init(config: &str) -> Result<Self, String> {
        Ok(DropByHeader { key: config_text(config, "key")?, value: config_text(config, "value")? })
    }

    fn filter(&mut self, _hook: Hook, message: &Message) -> Verdict {
        if message.header(&self.key) == Some(self.value.as_str()) {
            counter_add("dropped", 1);
            return Verdict::Drop(format!("header {} is {}", self.key, self.value));
        }
        Verdict::Pass
    }
}

export_filter!(DropByHeader);
