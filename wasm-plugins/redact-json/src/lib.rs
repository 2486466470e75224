//! Masks the string value of a JSON field in payloads, keeping its last digits: a card
//! number `"4111 1111 1111 1234"` becomes `"**** **** **** 1234"`. Its configuration:
//! `{"field": "card_number", "keep_last": 4}`. Messages without the field, or whose
//! payload is sealed, pass unchanged; a redacted one gets the header `redacted: FIELD`.

use linkbus_filter_sdk::{config_parsed, config_text, counter_add, export_filter, json_field_span, Filter, HeaderOp, Hook, Message, Verdict};

struct RedactJson {
    field: String,
    keep_last: usize,
}

impl Filter for RedactJson {
    fn init(config: &str) -> Result<Self, String> {
        Ok(RedactJson { field: config_text(config, "field")?, keep_last: config_parsed(config, "keep_last", Some(4))? })
    }

    fn filter(&mut self, _hook: Hook, message: &Message) -> Verdict {
        let text = match std::str::from_utf8(message.payload) {
            Ok(text) if !message.sealed => text,
            _ => return Verdict::Pass,
        };
        let (span, value) = match json_field_span(text, &self.field) {
            Some(found) => found,
            None => return Verdict::Pass,
        };
        let digits = value.chars().filter(|c| c.is_ascii_digit()).count();
        let mut seen = 0;
        let masked: String = value
            .chars()
            .map(|c| {
                if !c.is_ascii_digit() {
                    return c;
                }
                seen += 1;
                if seen + self.keep_last > digits { c } else { '*' }
            })
            .collect();
        if masked == value {
            return Verdict::Pass;
        }
        counter_add("redacted", 1);
        let mut payload = Vec::with_capacity(text.len());
        payload.extend_from_slice(text[..span.start].as_bytes());
        payload.extend_from_slice(masked.as_bytes());
        payload.extend_from_slice(text[span.end..].as_bytes());
        Verdict::Change {
            payload: Some(payload),
            headers: vec![HeaderOp::Set("redacted".to_owned(), self.field.clone())],
        }
    }
}

export_filter!(RedactJson);
