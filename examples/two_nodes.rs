//! Two nodes inside one program, through the root `linkbus` package: node B listens on a
//! free port with queue `orders`, node A dials it, a client puts "hello" on A for
//! `B:orders`, and a client of B takes it.
//!
//! Run with `cargo run --example two_nodes`.

use std::time::Duration;

use linkbus::config::{self, Overrides};
use linkbus::host::security::write_key_file;
use linkbus::proto::secure::{Keypair, hex};
use linkbus::{Client, Content, Node};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let scratch = std::env::temp_dir().join(format!("linkbus-example-{}", std::process::id()));
    // Each node has a static key; both share the cluster key (Noise links).
    let (a_keys, b_keys) = (Keypair::generate()?, Keypair::generate()?);
    write_key_file(&scratch.join("A.key"), &a_keys.private)?;
    write_key_file(&scratch.join("B.key"), &b_keys.private)?;
    write_key_file(&scratch.join("cluster.psk"), &Keypair::generate()?.private)?;
    let overrides = |name: &str| Overrides {
        name: Some(name.to_owned()),
        data_dir: Some(scratch.join(name)),
        client_socket: Some(scratch.join(format!("{name}.sock"))),
        key_file: Some(scratch.join(format!("{name}.key"))),
        psk_file: Some(scratch.join("cluster.psk")),
        ..Overrides::default()
    };

    let b_yaml = format!(
        "node: {{ listen: 127.0.0.1:0 }}\npeers: [ {{ name: A, public_key: '{}' }} ]\nqueues: [ {{ name: orders }} ]",
        hex(&a_keys.public)
    );
    let mut tree = config::parse_yaml(&b_yaml)?;
    config::apply_overrides(&mut tree, &overrides("B"));
    let b = Node::start(config::from_value(&tree)?).await?;

    let b_address = b.listen_address().unwrap_or_default().to_owned();
    let a_yaml =
        format!("node: {{ listen: none }}\npeers: [ {{ name: B, public_key: '{}' }} ]", hex(&b_keys.public));
    let mut tree = config::parse_yaml(&a_yaml)?;
    config::apply_overrides(
        &mut tree,
        &Overrides { peers: vec![format!("B={b_address}")], ..overrides("A") },
    );
    let a = Node::start(config::from_value(&tree)?).await?;

    let id = Client::connect(a.socket_path()).await?.put(Content::buf("B:orders".parse()?, "hello")).await?;
    println!("put {id}");
    let got = Client::connect(b.socket_path()).await?.get("orders", 1, Duration::from_secs(5)).await?;
    for message in got {
        println!("got {} from {}", String::from_utf8_lossy(&message.content.payload), message.id);
    }

    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
