//! Result rows: one per workload and size, printed as a table or as a JSON array.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use crate::latency::Percentiles;

/// Bytes in the MB of the MB/s column (payload bytes only, as in `linkbus bench`).
const BYTES_PER_MB: f64 = 1e6;

/// One measured case.
#[derive(Debug)]
pub(crate) struct Row {
    /// The workload's command-line name.
    pub(crate) workload: &'static str,
    /// Payload size of every message.
    pub(crate) size_bytes: usize,
    /// Throughput; `None` for paced latency runs, where the rate is set, not measured.
    pub(crate) messages_per_s: Option<f64>,
    /// Latency of each round trip or acknowledged publish, where measured.
    pub(crate) latency: Option<Percentiles>,
    /// How it was measured and what arrived; drops and errors are spelled out here.
    pub(crate) note: String,
}

impl Row {
    /// A throughput row: `messages` in `elapsed`.
    pub(crate) fn throughput(
        workload: &'static str,
        size_bytes: usize,
        messages: u64,
        elapsed: Duration,
        note: String,
    ) -> Row {
        let messages_per_s = Some(messages as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE));
        Row { workload, size_bytes, messages_per_s, latency: None, note }
    }

    /// Payload megabytes per second, from the message rate.
    fn mb_per_s(&self) -> Option<f64> {
        self.messages_per_s.map(|rate| rate * self.size_bytes as f64 / BYTES_PER_MB)
    }
}

/// `64 B`, `1 KiB`.
fn size_label(size_bytes: usize) -> String {
    if size_bytes >= 1024 && size_bytes.is_multiple_of(1024) {
        format!("{} KiB", size_bytes / 1024)
    } else {
        format!("{size_bytes} B")
    }
}

/// A number for the table, or `-` when it was not measured.
fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// The rows as an aligned text table, one line each, the note last.
pub(crate) fn to_table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<10} {:>6} {:>12} {:>9} {:>9} {:>9} {:>9}  {}\n",
        "workload", "size", "messages/s", "MB/s", "p50 us", "p99 us", "p99.9 us", "note"
    );
    for row in rows {
        let latency = |pick: fn(&Percentiles) -> f64| cell(row.latency.as_ref().map(pick), 0);
        let _ = writeln!(
            out,
            "{:<10} {:>6} {:>12} {:>9} {:>9} {:>9} {:>9}  {}",
            row.workload,
            size_label(row.size_bytes),
            cell(row.messages_per_s, 0),
            cell(row.mb_per_s(), 1),
            latency(|p| p.p50_us),
            latency(|p| p.p99_us),
            latency(|p| p.p999_us),
            row.note
        );
    }
    out
}

/// The rows as a JSON array of objects with the table's fields (`null` where not measured).
pub(crate) fn to_json(rows: &[Row]) -> String {
    let values: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "workload": row.workload,
                "size": size_label(row.size_bytes),
                "size_bytes": row.size_bytes,
                "messages_per_s": row.messages_per_s.map(f64::round),
                "mb_per_s": row.mb_per_s().map(|v| (v * 10.0).round() / 10.0),
                "p50_us": row.latency.map(|p| p.p50_us.round()),
                "p99_us": row.latency.map(|p| p.p99_us.round()),
                "p999_us": row.latency.map(|p| p.p999_us.round()),
                "note": row.note,
            })
        })
        .collect();
    serde_json::to_string_pretty(&values).unwrap_or_else(|error| format!("json error: {error}"))
}
