//! `linkbus put`: one message from the command line, or one per line of standard input in
//! batches (each line read only up to the node's message limit), with what was accepted
//! said exactly when a put fails part way.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use linkbus_plugin_api::{Content, Lifetime, MessageId, Priority, Reliability};

use super::PutArgs;
use linkbus_client::Client;

fn content_for(args: &PutArgs, payload: Bytes) -> anyhow::Result<Content> {
    let mut content = Content {
        name: args.label.clone(),
        recipients: args.to.clone().into(),
        priority: Priority::level(args.priority)?,
        lifetime: args
            .lifetime
            .or(args.ttl.map(Duration::from_secs))
            .map(|d| Lifetime::from_ms(d.as_millis().max(1) as u64)),
        reliability: match (args.persistent, args.volatile) {
            (true, _) => Reliability::Persistent,
            (_, true) => Reliability::Volatile,
            _ => Reliability::AsQueue,
        },
        results: args.results || args.wait_result.is_some(),
        payload,
        ..Content::default()
    };
    for header in &args.headers {
        let Some((key, value)) = header.split_once('=') else { bail!("header '{header}' is not KEY=VALUE") };
        content.headers.push((key.to_owned(), value.to_owned()));
    }
    content.validate()?;
    Ok(content)
}

/// Runs `linkbus put`.
///
/// # Errors
/// The node's refusal, or a connection failure.
pub(crate) async fn put(args: PutArgs) -> anyhow::Result<()> {
    let mut client = args.target.connect().await?;
    client.set_put_timeout(args.timeout);
    client.set_no_wait(args.no_wait);
    if args.transaction {
        client.begin().await?;
    }
    if args.message != "-" {
        let mut content = content_for(&args, Bytes::from(args.message.clone()))?;
        // (A group of one.)
        if let Some(group) = &args.group {
            content = content.in_group(group, 0, true);
        }
        let id = client.put(content).await?;
        if args.transaction {
            client.commit().await?;
        }
        println!("{id}");
        return match args.wait_result {
            Some(wait) => print_results(&mut client, &[id], wait).await,
            None => Ok(()),
        };
    }
    let template = content_for(&args, Bytes::new())?;
    let mut ids = Vec::new();
    let sent = put_lines(&mut client, &args, template, &mut ids).await?;
    if args.transaction {
        client.commit().await.with_context(|| format!("committing {sent} messages"))?;
        eprintln!("put {sent} messages (committed)");
    } else {
        eprintln!("put {sent} messages");
    }
    match args.wait_result {
        Some(wait) => print_results(&mut client, &ids, wait).await,
        None => {
            let mut out = std::io::stdout().lock();
            ids.iter().try_for_each(|id| writeln!(out, "{id}"))?;
            Ok(())
        }
    }
}

/// Puts standard input's lines, one message each, in batches; returns how many were put.
/// The ids are printed at once or kept in `ids` (for results, or until a commit).
async fn put_lines(
    client: &mut linkbus_client::Client,
    args: &PutArgs,
    template: Content,
    ids: &mut Vec<MessageId>,
) -> anyhow::Result<usize> {
    // Ids for `linkbus result` are printed as soon as they are final: at once, or (in a
    // transaction) after the commit.
    let print_now = args.results && args.wait_result.is_none() && !args.transaction;
    let mut keep = |put: Vec<MessageId>| -> std::io::Result<usize> {
        let count = put.len();
        if print_now {
            let mut out = std::io::stdout().lock();
            put.iter().try_for_each(|id| writeln!(out, "{id}"))?;
            out.flush()?;
        } else if args.results || args.wait_result.is_some() {
            ids.extend(put);
        }
        Ok(count)
    };
    // A line over the node's limit is refused as soon as it passes the limit, without
    // reading (or holding) the rest of it.
    let line_bytes_max = client.limits().await?.message_bytes_max;
    let mut stdin = std::io::stdin().lock();
    let (mut batch, mut sent) = (Vec::new(), 0usize);
    // In a group, the line read last is held back until the next one shows it was not the
    // last (or the input ends: it closes the group).
    let mut member = 0u32;
    let mut held_back: Option<Content> = None;
    loop {
        let line = read_line_bounded(&mut stdin, line_bytes_max).context("reading standard input")?;
        let too_long = matches!(line, Line::TooLong);
        let full = match line {
            Line::End => break,
            Line::Read(mut line) => {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                let content = Content { payload: Bytes::from(line), ..template.clone() };
                match &args.group {
                    Some(group) => {
                        batch.extend(held_back.replace(content.in_group(group, member, false)));
                        member = member.checked_add(1).context("a group holds at most 2^32 messages")?;
                    }
                    None => batch.push(content),
                }
                batch.len() >= linkbus_client::PUT_BATCH_MESSAGES_MAX
            }
            Line::TooLong => true,
        };
        if full {
            let put = client.put_batch(std::mem::take(&mut batch)).await;
            sent += keep(put.map_err(|e| put_failure(e, sent, args.transaction))?)?;
        }
        if too_long {
            let error = linkbus_client::ClientError::Refused {
                code: linkbus_client::protocol::ErrorCode::TooLarge,
                accepted: 0,
                // Numbered within its put (of none), as the node numbers a refusal.
                message: format!(
                    "message 1: it is over the node's messages.message_bytes_max ({line_bytes_max} bytes)"
                ),
            };
            return Err(put_failure(error, sent, args.transaction));
        }
    }
    if let Some(mut last) = held_back {
        if let Some(group) = last.group.as_mut() {
            group.last = true;
        }
        batch.push(last);
    } else if let Some(group) = &args.group {
        bail!("standard input has no line to put in group '{group}'");
    }
    let put = client.put_batch(batch).await;
    sent += keep(put.map_err(|e| put_failure(e, sent, args.transaction))?)?;
    Ok(sent)
}

/// A line of standard input, read up to a bound.
enum Line {
    /// No more input.
    End,
    /// A line, without its newline.
    Read(Vec<u8>),
    /// A line longer than the bound (plus a carriage return); read no further than that.
    TooLong,
}

/// Reads one line of at most `bytes_max` bytes (and a carriage return before its newline),
/// holding no more than that.
fn read_line_bounded(input: &mut impl std::io::BufRead, bytes_max: u64) -> std::io::Result<Line> {
    let bound = usize::try_from(bytes_max).unwrap_or(usize::MAX).saturating_add(1);
    let mut line = Vec::new();
    let mut any = false;
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok(if any { Line::Read(line) } else { Line::End });
        }
        any = true;
        let (take, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (at, true),
            None => (available.len(), false),
        };
        if line.len() + take > bound {
            return Ok(Line::TooLong);
        }
        line.extend_from_slice(&available[..take]);
        input.consume(if done { take + 1 } else { take });
        if done {
            // A carriage return is not the payload's; only a longer line is too long.
            let payload = line.len() - usize::from(line.last() == Some(&b'\r'));
            return Ok(if payload as u64 > bytes_max { Line::TooLong } else { Line::Read(line) });
        }
    }
}

/// What a failed put of standard input's lines tells its user: how many lines the node
/// accepted in all (lines 1 to N: putting them again would duplicate them) and which line
/// was refused, and why.
fn put_failure(error: linkbus_client::ClientError, sent: usize, transaction: bool) -> anyhow::Error {
    use linkbus_client::ClientError;
    let (in_call, error) = match error {
        ClientError::PartlyAccepted { accepted, source } => (accepted as usize, *source),
        other => (0, other),
    };
    let ClientError::Refused { accepted, message, .. } = &error else {
        let sent = sent + in_call;
        let unknown = matches!(error, ClientError::OutcomeUnknown(_) | ClientError::Io(_));
        let tail = if unknown { " (and the last request's messages may or may not have been)" } else { "" };
        return anyhow::Error::new(error)
            .context(format!("{sent} messages (lines 1-{sent}) were accepted{tail}"));
    };
    // The refused one is numbered within its put.
    let reason = message.strip_prefix(&format!("message {}: ", accepted + 1)).unwrap_or(message);
    let accepted = sent + *accepted as usize;
    let refused = accepted + 1;
    if transaction {
        return anyhow::anyhow!(
            "line {refused} was refused: {reason}; nothing was committed (the transaction is rolled back)"
        );
    }
    let before = match accepted {
        0 => "no line was put".to_owned(),
        1 => "line 1 was put".to_owned(),
        n => format!("lines 1-{n} were put ({n} messages)"),
    };
    anyhow::anyhow!("{before}; line {refused} was refused: {reason}; it and the lines after it were not put")
}

/// Prints the results of `ids`, waiting up to `wait` for the final ones; fails unless every
/// recipient got its message.
pub(super) async fn print_results(
    client: &mut Client,
    ids: &[MessageId],
    wait: Duration,
) -> anyhow::Result<()> {
    let results = client.results(ids, wait).await?;
    let mut out = std::io::stdout().lock();
    let (mut recipients, mut missed, mut unknown) = (0usize, 0usize, 0usize);
    for (id, results) in ids.iter().zip(results) {
        let Some(results) = results else {
            writeln!(out, "{id} unknown (not put with results wanted, or finished long ago)")?;
            unknown += 1;
            continue;
        };
        for (to, outcome) in results.recipients {
            recipients += 1;
            match outcome {
                Some(linkbus_host::results::Outcome::Delivered) => writeln!(out, "{id} {to} delivered")?,
                Some(outcome) => {
                    missed += 1;
                    writeln!(out, "{id} {to} {outcome}")?;
                }
                None => {
                    missed += 1;
                    writeln!(out, "{id} {to} no result yet")?;
                }
            }
        }
    }
    out.flush()?;
    if unknown > 0 {
        bail!("{unknown} of {} messages unknown to this node", ids.len());
    }
    if missed > 0 {
        bail!("{missed} of {recipients} recipients did not get their message (or have no result yet)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line is read up to the bound and no further; a carriage return before the newline
    /// does not count against it.
    #[test]
    fn lines_are_read_up_to_the_bound() {
        let mut input = std::io::BufReader::with_capacity(3, &b"abc\r\nabcd\nab"[..]);
        assert!(matches!(read_line_bounded(&mut input, 3).unwrap(), Line::Read(l) if l == b"abc\r"));
        assert!(matches!(read_line_bounded(&mut input, 3).unwrap(), Line::TooLong));
        let mut input = &b"ab\n\nlast"[..];
        assert!(matches!(read_line_bounded(&mut input, 3).unwrap(), Line::Read(l) if l == b"ab"));
        assert!(matches!(read_line_bounded(&mut input, 3).unwrap(), Line::Read(l) if l.is_empty()));
        assert!(matches!(read_line_bounded(&mut input, 4).unwrap(), Line::Read(l) if l == b"last"));
        assert!(matches!(read_line_bounded(&mut input, 4).unwrap(), Line::End));
    }
}
