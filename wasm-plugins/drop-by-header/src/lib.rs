//! Drops messages whose header `key` has the value `value` (its configuration:
//! `{"key": "priority", "value": "spam"}`); lets the others go on.

use linkbus_filter_sdk::{counter_add, export_filter, Filter, Hook, Message, Verdict};

struct DropByHeader {
    key: String,
    value: String,
}

/// The string value of `field` in a flat JSON object (enough for this filter's
/// configuration, without a JSON crate).
fn field(json: &str, field: &str) -> Option<String> {
    let quoted = format!("\"{}\"", field);
    let after = &json[json.find(&quoted)? + quoted.len()..];
    let after = after.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    Some(after[..after.find('"')?].to_owned())
}

impl Filter for DropByHeader {
    fn init(config: &str) -> Result<Self, String> {
        let key = field(config, "key").ok_or("configuration needs \"key\"")?;
        let value = field(config, "value").ok_or("configuration needs \"value\"")?;
        Ok(DropByHeader { key, value })
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
