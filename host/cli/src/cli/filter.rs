//! `linkbus filter test`: a filter module run offline on messages from a JSON-lines file,
//! through the same plugin and limits a node uses.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Subcommand;
use linkbus_filter_wasm::plugin::{LIMITS_DEFAULT, TRAPS_MAX_DEFAULT, WasmFilter, WasmSettings};
use linkbus_plugin_api::{
    ConfigValue, Content, Filter, HeaderChange, Hook, Message, MessageId, Priority, Reliability, Step,
    Verdict,
};

/// `linkbus filter ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum FilterCommand {
    /// Run a filter module offline on messages from a JSON-lines file, as a node would, and
    /// print each verdict (with the rewritten payload and headers, or the new recipients),
    /// then the fuel and time each call used and the filter's counters; its log lines go to
    /// standard error.
    Test(FilterTestArgs),
}

/// `linkbus filter test`.
#[derive(Debug, clap::Args)]
pub(crate) struct FilterTestArgs {
    /// The module (`.wasm`).
    pub module: PathBuf,
    /// The hook to call it at: on_send, on_route, on_forward or on_deliver.
    #[arg(long, default_value = "on_deliver")]
    pub hook: String,
    /// The messages, one JSON object per line (`-`: standard input), e.g.
    /// `{"payload": "...", "headers": {"kind": "spam"}, "to": ["C:orders"]}`; also
    /// `name`, `priority`, `persistent`, and `payload_base64` for bytes that are not text.
    #[arg(long)]
    pub input: PathBuf,
    /// The filter's `config:` value, as YAML or JSON (what its YAML entry would say).
    #[arg(long, default_value = "null")]
    pub config: String,
    /// Messages per call (a node calls a filter once per batch of up to 256).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Fuel per call.
    #[arg(long)]
    pub fuel_per_call: Option<u64>,
    /// Time per call, in milliseconds.
    #[arg(long)]
    pub time_per_call_ms: Option<u64>,
    /// Largest guest memory, in bytes.
    #[arg(long)]
    pub memory_bytes_max: Option<u64>,
}

/// Runs `linkbus filter ...`.
///
/// # Errors
/// A module that does not load, an input line that is not a message, or a failed call.
pub(crate) fn filter(command: FilterCommand) -> anyhow::Result<()> {
    match command {
        FilterCommand::Test(args) => test(&args),
    }
}

fn test(args: &FilterTestArgs) -> anyhow::Result<()> {
    let hook = Hook::parse(&args.hook).with_context(|| {
        format!("--hook {}: expected on_send, on_route, on_forward or on_deliver", args.hook)
    })?;
    let config =
        linkbus_host::config::parse_yaml(&args.config).map_err(|e| anyhow::anyhow!("--config: {e}"))?;
    let d = LIMITS_DEFAULT;
    let limits = linkbus_filter_wasm::instance::Limits {
        fuel_per_call: args.fuel_per_call.unwrap_or(d.fuel_per_call),
        ticks_per_call: args.time_per_call_ms.unwrap_or(d.ticks_per_call),
        memory_bytes_max: args
            .memory_bytes_max
            .map_or(d.memory_bytes_max, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        output_bytes_max: d.output_bytes_max,
    };
    let settings = WasmSettings {
        name: args.module.display().to_string(),
        module: args.module.clone(),
        sha256: None,
        limits,
        traps_max: TRAPS_MAX_DEFAULT,
        config: linkbus_plugin_api::json::to_json(&config),
    };
    let filter = WasmFilter::new(settings).map_err(anyhow::Error::msg)?;
    println!(
        "module {} (sha256 {})",
        args.module.display(),
        linkbus_filter_wasm::plugin::hex(&filter.digest())
    );
    let messages = read_messages(args)?;
    let mut failed = 0;
    let mut number = 0;
    for (call, batch) in messages.chunks(args.batch.max(1)).enumerate() {
        let shown: Vec<&Message> = batch.iter().collect();
        let started = Instant::now();
        let decided = filter.filter(hook, &shown);
        let took = started.elapsed();
        match decided {
            Ok(decision) => {
                for verdict in &decision.verdicts {
                    number += 1;
                    println!("message {number}: {}", describe(verdict));
                }
                println!(
                    "call {}: {} messages, fuel {}, {} us",
                    call + 1,
                    batch.len(),
                    decision.fuel,
                    took.as_micros()
                );
            }
            Err(error) => {
                number += batch.len();
                failed += 1;
                println!(
                    "call {}: {} messages, failed ({}): {error}",
                    call + 1,
                    batch.len(),
                    error.kind.as_str()
                );
            }
        }
    }
    for (name, value) in filter.counters() {
        println!("counter {name}: {value}");
    }
    if failed > 0 {
        bail!("{failed} call(s) failed; a node would apply the filter's on_failure policy to their messages");
    }
    Ok(())
}

/// One verdict in words.
fn describe(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Pass => "pass".to_owned(),
        Verdict::Drop { reason } => format!("drop: {reason}"),
        Verdict::Route(to) => {
            let to: Vec<String> = to.iter().map(ToString::to_string).collect();
            format!("route: {}", to.join(", "))
        }
        Verdict::Change { payload, headers } => {
            let mut text = "change:".to_owned();
            if let Some(payload) = payload {
                let _ = write!(text, " payload {}", String::from_utf8_lossy(payload));
                if !headers.is_empty() {
                    text.push(';');
                }
            }
            let changes: Vec<String> = headers
                .iter()
                .map(|change| match change {
                    HeaderChange::Set(key, value) => format!("{key}={value}"),
                    HeaderChange::Remove(key) => format!("-{key}"),
                })
                .collect();
            if !changes.is_empty() {
                let _ = write!(text, " headers {}", changes.join(", "));
            }
            text
        }
    }
}

/// The messages of `--input`, one per non-empty line.
fn read_messages(args: &FilterTestArgs) -> anyhow::Result<Vec<Message>> {
    let mut text = String::new();
    if args.input.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(&args.input)
            .with_context(|| format!("reading {}", args.input.display()))?;
    }
    let mut messages = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{} line {}", args.input.display(), index + 1);
        let value = linkbus_host::config::parse_yaml(line).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        let message = message_of(&value, messages.len() as u64 + 1).with_context(at)?;
        messages.push(message);
    }
    Ok(messages)
}

/// A message from one input line's object.
fn message_of(value: &ConfigValue, sequence: u64) -> anyhow::Result<Message> {
    let ConfigValue::Map(entries) = value else { bail!("expected a JSON object") };
    let text = |v: &ConfigValue| match v {
        ConfigValue::Str(s) => Ok(s.clone()),
        ConfigValue::Uint(n) => Ok(n.to_string()),
        ConfigValue::Int(n) => Ok(n.to_string()),
        ConfigValue::Float(f) => Ok(f.to_string()),
        ConfigValue::Bool(b) => Ok(b.to_string()),
        other => Err(anyhow::anyhow!("expected text, found {}", other.type_name())),
    };
    let mut content = Content::buf("C:orders".parse()?, "");
    let mut sealed = false;
    for (key, v) in entries {
        match (key.as_str(), v) {
            ("payload", v) => content.payload = text(v)?.into_bytes().into(),
            ("to", ConfigValue::Seq(to)) => {
                content.recipients =
                    to.iter().map(|t| Ok(text(t)?.parse()?)).collect::<anyhow::Result<_>>()?;
            }
            ("to", v) => content.recipients = [text(v)?.parse()?].into_iter().collect(),
            ("headers", ConfigValue::Map(headers)) => {
                content.headers =
                    headers.iter().map(|(k, v)| Ok((k.clone(), text(v)?))).collect::<anyhow::Result<_>>()?;
            }
            ("name", v) => content.name = text(v)?,
            ("priority", ConfigValue::Uint(p)) => {
                content.priority = Priority::level(u8::try_from(*p).unwrap_or(u8::MAX))?;
            }
            ("persistent", ConfigValue::Bool(p)) => {
                content.reliability = if *p { Reliability::Persistent } else { Reliability::Volatile };
            }
            ("sealed", ConfigValue::Bool(s)) => sealed = *s,
            (key, _) => bail!("'{key}': expected payload, to, headers, name, priority, persistent or sealed"),
        }
    }
    content.validate()?;
    let id = MessageId { source: "A".parse()?, sequence, created_unix_ms: 0 };
    let mut message = Message::new(id, content);
    if sealed {
        // As a relay sees a message sealed end to end: a cipher's step recorded, the payload
        // not shown to the filter.
        message.encoding.push(Step { codec: 128, param: bytes::Bytes::new() });
    }
    Ok(message)
}
