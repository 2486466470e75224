//! Moves money between two accounts in a transaction, and puts and gets a message group.
//!
//! Each account is a queue holding one message, its balance. A transfer takes both
//! balances and puts both new ones in one transaction: all of it happens, or none. A
//! transfer that finds too little money returns early, and the transaction guard it holds
//! rolls everything back. Then the bank puts a statement as a message group, three lines
//! that a reader gets whole and in order, or not at all.
//!
//! Run with `cargo run --example transfer`.

use std::time::Duration;

use linkbus::config::{self, Overrides};
use linkbus::{Client, Content, Node, Reliability};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let scratch = std::env::temp_dir().join(format!("linkbus-transfer-{}", std::process::id()));
    let mut tree = config::parse_yaml(
        "node: { listen: none }\nqueues: [ { name: alice, order: fifo }, { name: bob, order: fifo }, \
         { name: statements, order: fifo } ]",
    )?;
    let overrides = Overrides {
        name: Some("BANK".into()),
        data_dir: Some(scratch.join("data")),
        client_socket: Some(scratch.join("bank.sock")),
        ..Overrides::default()
    };
    config::apply_overrides(&mut tree, &overrides);
    let node = Node::start(config::from_value(&tree)?).await?;
    let mut client = node.client();
    client.put(balance("alice", 100)).await?;
    client.put(balance("bob", 20)).await?;

    transfer(&mut client, "alice", "bob", 30).await?;
    println!("moved 30 from alice to bob");
    match transfer(&mut client, "bob", "alice", 500).await {
        Err(e) => println!("moving 500 from bob failed, nothing changed: {e}"),
        Ok(()) => anyhow::bail!("bob had no 500 to move"),
    }
    for account in ["alice", "bob"] {
        let browse = client.browse(account, 1).await?;
        let text = browse.first().map(|m| String::from_utf8_lossy(&m.content.payload).into_owned());
        println!("{account}: {}", text.unwrap_or_default());
    }

    // A statement in three lines, as one group: its reader gets every line or none.
    let to = "BANK:statements";
    let lines = ["alice 100 -> 70", "bob 20 -> 50", "total 120"];
    client
        .put_group("statement-1", lines.iter().map(|l| Content::buf(to.parse().unwrap(), *l)).collect())
        .await?;
    for message in client.get_group("statements", Duration::from_secs(1)).await? {
        let member = message.content.group.as_ref().map_or(0, |g| g.index);
        println!("statement line {member}: {}", String::from_utf8_lossy(&message.content.payload));
    }

    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// A balance message for `account`'s queue.
fn balance(account: &str, amount: u64) -> Content {
    let to = format!("BANK:{account}").parse().expect("a queue address");
    Content::buf(to, amount.to_string()).with_reliability(Reliability::Persistent)
}

/// Moves `amount` from one account to another in one transaction.
async fn transfer(client: &mut Client, from: &str, to: &str, amount: u64) -> anyhow::Result<()> {
    let mut tx = client.transaction().await?;
    let read = |messages: Vec<linkbus::Message>| -> anyhow::Result<u64> {
        let message = messages.first().ok_or_else(|| anyhow::anyhow!("an account has no balance"))?;
        Ok(String::from_utf8_lossy(&message.content.payload).parse()?)
    };
    let from_balance = read(tx.get(from, 1, Duration::ZERO).await?)?;
    let to_balance = read(tx.get(to, 1, Duration::ZERO).await?)?;
    if from_balance < amount {
        // `tx` drops here without a commit: both balances go back to their queues.
        anyhow::bail!("{from} has {from_balance}, not {amount}");
    }
    tx.put_batch(vec![balance(from, from_balance - amount), balance(to, to_balance + amount)]).await?;
    tx.commit().await?;
    Ok(())
}
