//! Drops messages whose header `key` has the value `value` (its configuration:
//! `{"key": "priority", "value": "spam"}`); lets the others go on.

use linkbus_filter_sdk::{counter_add, export_filter, json_field, Filter, Hook, Message, Verdict};

struct DropByHeader {
    key: String,
    value: String,
}

impl Filter for DropByHeader {
    fn init(config: &str) -> Result<Self, String> {
        let key = json_field(config, "key").ok_or("configuration needs \"key\"")?;
        let value = json_field(config, "value").ok_or("configuration needs \"value\"")?;
        Ok(DropByHeader { key: key.to_owned(), value: value.to_owned() })
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
