//! Stages on a message's way, on two real nodes over a real TCP link: a stage built per
//! client connection at the origin and per link at the relay and destination sites, run
//! once per batch; a refusal at the origin refuses the put from that message on, and a
//! refusal (or a stage's failure) on arrival dead-letters the message with the stage's
//! reason (and `filter_rejected`, or `stage_failed`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use linkbus::client::ClientError;
use linkbus::config::{self, Overrides};
use linkbus::host::flow::{Site, Stage, StageBatch, StageContext, StageFactory};
use linkbus::{Content, Node};

/// Counts instances and batches per site; tags what it sees at delivery; refuses payloads
/// `refuse-at-origin` at the origin and `refuse-at-delivery` at delivery.
#[derive(Default)]
struct Tagger {
    built: Mutex<Vec<(String, Site)>>,
    batches: AtomicUsize,
}

struct Instance {
    factory: Arc<Tagger>,
    site: Site,
}

struct Factory(Arc<Tagger>);

impl StageFactory for Factory {
    fn name(&self) -> &str {
        "tagger"
    }

    fn build(&self, context: &StageContext<'_>) -> Option<Box<dyn Stage>> {
        self.0.built.lock().unwrap().push((context.node.to_string(), context.site));
        Some(Box::new(Instance { factory: self.0.clone(), site: context.site }))
    }
}

impl Stage for Instance {
    fn run(&mut self, batch: &mut StageBatch<'_, '_>) {
        self.factory.batches.fetch_add(1, Ordering::Relaxed);
        let refuse = match self.site {
            Site::Origin => "refuse-at-origin",
            Site::Delivery => "refuse-at-delivery",
            Site::Relay => "-",
        };
        let (mut refused, mut failed) = (Vec::new(), Vec::new());
        for (index, message) in batch.messages().iter_mut().enumerate() {
            if message.content.payload == refuse.as_bytes() {
                refused.push(index);
            } else if message.content.payload == "fail-at-delivery" && self.site == Site::Delivery {
                failed.push(index);
            } else if self.site == Site::Delivery {
                message.content.headers.push(("tagged".into(), "delivery".into()));
            }
        }
        for index in refused {
            batch.refuse(index, "not wanted here");
        }
        for index in failed {
            batch.fail(index, "could not do its work");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_act_per_batch_at_each_site_and_their_refusals_are_kept() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tagger = Arc::new(Tagger::default());
    let stages = || -> Vec<Arc<dyn StageFactory>> { vec![Arc::new(Factory(tagger.clone()))] };
    let overrides = |name: &str| Overrides {
        name: Some(name.to_owned()),
        data_dir: Some(dir.path().join(name)),
        client_socket: Some(dir.path().join(format!("{name}.sock"))),
        insecure_plaintext: true,
        ..Overrides::default()
    };
    let mut tree =
        config::parse_yaml("node: { listen: 127.0.0.1:0 }\npeers: [ { name: A } ]\nqueues: [ { name: q } ]")?;
    config::apply_overrides(&mut tree, &overrides("B"));
    let b = Node::start_with_stages(config::from_value(&tree)?, stages()).await?;
    let address = b.listen_address().unwrap_or_default().to_owned();
    let mut tree = config::parse_yaml("node: { listen: none }\npeers: [ { name: B } ]")?;
    config::apply_overrides(&mut tree, &Overrides { peers: vec![format!("B={address}")], ..overrides("A") });
    let a = Node::start_with_stages(config::from_value(&tree)?, stages()).await?;

    let to: linkbus::Address = "B:q".parse()?;
    let mut producer = linkbus::Client::connect(&dir.path().join("A.sock")).await?;
    let batch: Vec<Content> =
        ["m0", "m1", "refuse-at-origin", "m3"].iter().map(|p| Content::buf(to.clone(), *p)).collect();
    match producer.put_batch(batch).await {
        Err(ClientError::Refused { code, accepted, message }) => {
            assert_eq!((code, accepted), (linkbus::client::protocol::ErrorCode::Invalid, 2));
            assert!(message.contains("stage 'tagger' refused it: not wanted here"), "{message}");
        }
        other => panic!("the origin stage refuses the third: {other:?}"),
    }
    producer.put(Content::buf(to.clone(), "refuse-at-delivery")).await?;
    producer.put(Content::buf(to.clone(), "fail-at-delivery")).await?;
    producer.put(Content::buf(to.clone(), "m4")).await?;

    let mut consumer = b.client();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < 3 && tokio::time::Instant::now() < deadline {
        got.extend(consumer.get("q", 10, Duration::from_secs(1)).await?);
    }
    let payloads: Vec<String> =
        got.iter().map(|m| String::from_utf8_lossy(&m.content.payload).into_owned()).collect();
    assert_eq!(payloads, ["m0", "m1", "m4"]);
    assert!(
        got.iter().all(|m| m.content.header("tagged") == Some("delivery")),
        "changed by the delivery stage"
    );
    let mut dead = consumer.get("DLQ", 10, Duration::from_secs(5)).await?;
    while dead.len() < 2 && tokio::time::Instant::now() < deadline {
        dead.extend(consumer.get("DLQ", 10, Duration::from_secs(1)).await?);
    }
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0].content.header("linkbus.dead_letter_code"), Some("filter_rejected"));
    let reason = dead[0].content.header("linkbus.dead_letter_reason").unwrap_or_default();
    assert!(reason.contains("stage 'tagger' refused it: not wanted here"), "{reason}");
    // A stage that fails (rather than refuses) dead-letters with its own code.
    assert_eq!(dead[1].content.header("linkbus.dead_letter_code"), Some("stage_failed"));
    let reason = dead[1].content.header("linkbus.dead_letter_reason").unwrap_or_default();
    assert!(reason.contains("stage 'tagger' failed: could not do its work"), "{reason}");

    let built = tagger.built.lock().unwrap().clone();
    let count = |node: &str, site: Site| built.iter().filter(|(n, s)| n == node && *s == site).count();
    assert_eq!(count("A", Site::Origin), 1, "one instance for the producer's connection: {built:?}");
    assert_eq!((count("B", Site::Relay), count("B", Site::Delivery)), (1, 1), "one per link: {built:?}");
    assert!(tagger.batches.load(Ordering::Relaxed) >= 3);
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}
