//! `linkbus events`: the node's `EVENT` queue, read as copies (several operators can
//! follow one node) or taken.

use std::io::Write;
use std::time::Duration;

use super::{EventsArgs, EventsCommand};

/// Runs `linkbus events`: each event of the node's `EVENT` queue as `unix-ms kind text`,
/// read as copies (the queue keeps them; `--follow` waits for new ones), or with `--take`
/// taken and acknowledged once printed.
///
/// # Errors
/// When the node cannot be reached or output fails.
pub(crate) async fn events(args: EventsArgs) -> anyhow::Result<()> {
    use linkbus_host::queue::EVENT_QUEUE;
    if let Some(command) = args.command {
        let text = match command {
            EventsCommand::Subscribe { target, kinds, to } => {
                let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
                target.connect().await?.subscribe(&to.to_string(), &kinds).await?
            }
            EventsCommand::Unsubscribe { target, to } => {
                target.connect().await?.unsubscribe(&to.to_string()).await?
            }
            EventsCommand::Ls { target } => target.connect().await?.subscriptions().await?,
        };
        print!("{text}");
        return Ok(());
    }
    let mut client = args.target.connect().await?;
    let mut out = std::io::stdout().lock();
    let wait = if args.follow { Duration::from_secs(60) } else { Duration::ZERO };
    let print = |out: &mut std::io::StdoutLock<'_>, m: &linkbus_plugin_api::Message| -> std::io::Result<()> {
        let kind = m.content.header(linkbus_host::events::EVENT_KIND_HEADER).unwrap_or("event");
        writeln!(out, "{} {kind} {}", m.id.created_unix_ms, String::from_utf8_lossy(&m.content.payload))
    };
    if !args.take {
        // Copies: every operator following sees every event, and the queue keeps them.
        let mut after = 0;
        loop {
            let events = client.follow(EVENT_QUEUE, after, 1000, wait).await?;
            if events.is_empty() && !args.follow {
                return Ok(());
            }
            for (key, m) in &events {
                print(&mut out, m)?;
                after = *key;
            }
            out.flush()?;
        }
    }
    loop {
        let events = client.get_pending(EVENT_QUEUE, 1000, wait, u64::MAX).await?;
        if events.is_empty() && !args.follow {
            return Ok(());
        }
        let mut tags = Vec::with_capacity(events.len());
        for e in events {
            print(&mut out, &e.message)?;
            tags.push(e.tag);
        }
        out.flush()?;
        client.ack(EVENT_QUEUE, &tags).await?;
    }
}
