//! Configuration values written as JSON: the form a WebAssembly filter's `config:` reaches
//! its guest in, and a native plugin's section crosses the library boundary in.

use std::fmt::Write;

use crate::config::ConfigValue;

/// `value` as compact JSON (a float that JSON cannot write, such as NaN, as `null`).
pub fn to_json(value: &ConfigValue) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &ConfigValue) {
    match value {
        ConfigValue::Null => out.push_str("null"),
        ConfigValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        ConfigValue::Int(n) => {
            let _ = write!(out, "{n}");
        }
        ConfigValue::Uint(n) => {
            let _ = write!(out, "{n}");
        }
        ConfigValue::Float(f) if f.is_finite() => {
            let _ = write!(out, "{f:?}");
        }
        ConfigValue::Float(_) => out.push_str("null"),
        ConfigValue::Str(s) => write_str(out, s),
        ConfigValue::Seq(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        ConfigValue::Map(entries) => {
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_json() {
        let value = ConfigValue::Map(vec![
            ("field".into(), ConfigValue::Str("card \"no\"\n".into())),
            ("max".into(), ConfigValue::Uint(5)),
            ("min".into(), ConfigValue::Int(-2)),
            ("ratio".into(), ConfigValue::Float(0.5)),
            ("on".into(), ConfigValue::Bool(true)),
            ("list".into(), ConfigValue::Seq(vec![ConfigValue::Null, ConfigValue::Float(f64::NAN)])),
        ]);
        assert_eq!(
            to_json(&value),
            r#"{"field":"card \"no\"\n","max":5,"min":-2,"ratio":0.5,"on":true,"list":[null,null]}"#
        );
    }
}
