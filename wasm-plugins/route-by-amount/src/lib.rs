//! Content-based routing at `on_route`: a message whose JSON payload has a number field at
//! or over a threshold also goes to an audit queue. Its configuration:
//! `{"field": "amount", "at_least": 1000, "copy_to": "AUDIT:review"}`. The static routes
//! take the message from there, to its recipients and to the copy's.

use linkbus_filter_sdk::{config_parsed, config_text, counter_add, export_filter, json_field, Filter, Hook, Message, Verdict};

struct RouteByAmount {
    field: String,
    at_least: f64,
    copy_to: String,
}

impl Filter for RouteByAmount {
    fn init(config: &str) -> Result<Self, String> {
        let field = config_text(config, "field")?;
        let at_least = config_parsed(config, "at_least", None)?;
        let copy_to = config_text(config, "copy_to")?;
        if !copy_to.contains(':') {
            return Err(format!("copy_to: '{}' is not NODE:QUEUE", copy_to));
        }
        Ok(RouteByAmount { field, at_least, copy_to })
    }

    fn filter(&mut self, hook: Hook, message: &Message) -> Verdict {
        if hook != Hook::OnRoute || message.sealed || message.recipients.contains(&self.copy_to.as_str()) {
            return Verdict::Pass;
        }
        let amount = std::str::from_utf8(message.payload)
            .ok()
            .and_then(|text| json_field(text, &self.field))
            .and_then(|value| value.parse::<f64>().ok());
        match amount {
            Some(amount) if amount >= self.at_least => {
                counter_add("audited", 1);
                let mut to: Vec<String> = message.recipients.iter().map(|r| (*r).to_owned()).collect();
                to.push(self.copy_to.clone());
                Verdict::Route(to)
            }
            _ => Verdict::Pass,
        }
    }
}

export_filter!(RouteByAmount);
