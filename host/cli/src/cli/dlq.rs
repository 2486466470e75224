//! `linkbus dlq`: the node's dead letters, listed without taking them or replayed to the
//! recipients they failed for.

use std::time::Duration;

use anyhow::bail;

use super::DlqCommand;
use linkbus_client::Client;

/// Runs `linkbus dlq ...`.
///
/// # Errors
/// When the node cannot be reached; for `replay`, when some messages failed again.
pub(crate) async fn dlq(command: DlqCommand) -> anyhow::Result<()> {
    use linkbus_host::flow::dead_letter::{
        DEAD_LETTER_CODE_HEADER, DEAD_LETTER_QUEUE, DEAD_LETTER_REASON_HEADER,
    };
    // (Replayed messages are put to the recipients they failed for; see `replay_one`.)
    match command {
        DlqCommand::Ls { target, count } => {
            let messages = target.connect().await?.browse(DEAD_LETTER_QUEUE, count).await?;
            for m in &messages {
                let to: Vec<String> = m.content.recipients.iter().map(ToString::to_string).collect();
                println!(
                    "{}  {}  to {}  {} bytes{}  {}",
                    m.id,
                    m.content.header(DEAD_LETTER_CODE_HEADER).unwrap_or("-"),
                    to.join(","),
                    m.content.payload.len(),
                    if m.is_encoded() { " (encoded)" } else { "" },
                    m.content.header(DEAD_LETTER_REASON_HEADER).unwrap_or(""),
                );
            }
            eprintln!("{} dead letter(s) listed", messages.len());
        }
        DlqCommand::Replay { target, count } => {
            let mut client = target.connect().await?;
            // Page through the queue holding what fails pending (so later pages reach past
            // it); it goes back, in order, when this connection ends.
            let (mut replayed, mut failed, mut seen) = (0usize, 0usize, 0u32);
            while seen < count {
                let page = client
                    .get_pending(DEAD_LETTER_QUEUE, (count - seen).min(100), Duration::ZERO, u64::MAX)
                    .await?;
                if page.is_empty() {
                    break;
                }
                seen += page.len() as u32;
                for d in page {
                    match replay_one(&mut client, &d.message).await {
                        Ok(id) => {
                            client.ack(DEAD_LETTER_QUEUE, &[d.tag]).await?;
                            println!("{} replayed as {id}", d.message.id);
                            replayed += 1;
                        }
                        Err(e) => {
                            eprintln!("{} not replayed: {e}", d.message.id);
                            failed += 1;
                        }
                    }
                }
            }
            drop(client);
            eprintln!("replayed {replayed}, failed {failed} (still in {DEAD_LETTER_QUEUE})");
            if failed > 0 {
                bail!("{failed} dead letter(s) could not be replayed");
            }
        }
    }
    Ok(())
}

/// Puts a dead letter again, to the recipients it failed for (all, when not recorded),
/// without its dead-letter headers. Event messages are the node's own and are not replayed.
async fn replay_one(client: &mut Client, message: &linkbus_plugin_api::Message) -> anyhow::Result<String> {
    use linkbus_host::flow::dead_letter::DEAD_LETTER_RECIPIENTS_HEADER;
    if message.content.kind == linkbus_plugin_api::Kind::Event {
        bail!("event messages are not replayed");
    }
    if message.is_encoded() {
        // Put again from here, its sealed or compressed bytes would pass for a payload.
        bail!(
            "its payload is encoded by its origin's stages (compressed or sealed); send it again from its origin"
        );
    }
    let mut content = (*message.content).clone();
    if let Some(failed) = content.header(DEAD_LETTER_RECIPIENTS_HEADER).filter(|f| !f.is_empty()) {
        let failed: Result<linkbus_plugin_api::Recipients, _> = failed.split(',').map(str::parse).collect();
        content.recipients =
            failed.map_err(|e| anyhow::anyhow!("bad {DEAD_LETTER_RECIPIENTS_HEADER} header: {e}"))?;
    }
    content.headers.retain(|(k, _)| !k.starts_with("linkbus.dead_letter_"));
    // A new message of this node: the original's origin keeps its result (failed), and
    // nobody here asked for one.
    content.results = false;
    Ok(client.try_put(content).await?.to_string())
}
