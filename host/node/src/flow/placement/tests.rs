//! Placement: where each copy goes, and the room it asks for.
use linkbus_plugin_api::Content;

use super::*;
use crate::node::testing::routed_node;

#[test]
fn each_link_gets_a_copy_naming_its_recipients_in_order_and_sized_as_sent() {
    let n = routed_node();
    let mut content = Content::buf("B:q".parse().unwrap(), "x");
    content.recipients.extend(["C:q".parse().unwrap(), "D1:q".parse().unwrap(), "B:r".parse().unwrap()]);
    let message = crate::flow::origin::stamp(&n, content, 0);
    let placement = Placement::of(&n, &message, Came::Put);
    assert!(placement.places.iter().all(|p| matches!(p, Place::Link(..))));
    let demand = demand(&[(&message, &placement)]).unwrap();
    let links = placement
        .places
        .iter()
        .filter_map(|p| if let Place::Link(l, picked) = p { Some((l, picked)) } else { None });
    let copies: Vec<(String, Vec<String>, u64)> = links
        .zip(&demand.remote)
        .map(|((link, picked), d)| {
            assert_eq!(d.count, 1);
            let copy = addressed_to_picked(message.clone(), picked);
            assert_eq!(linkbus_proto::wire::encoded_len(&copy) as u64, d.bytes, "sized as sent");
            (
                link.peer.name.to_string(),
                copy.content.recipients.iter().map(ToString::to_string).collect(),
                d.bytes,
            )
        })
        .collect();
    let names: Vec<(&str, Vec<&str>)> =
        copies.iter().map(|(l, to, _)| (l.as_str(), to.iter().map(String::as_str).collect())).collect();
    assert_eq!(names, [("B", vec!["B:q", "D1:q", "B:r"]), ("C", vec!["C:q"])]);
    // A copy naming every recipient is the message itself.
    let all: Picked = (0..4).collect();
    assert_eq!(addressed_to_picked(message.clone(), &all), message);
}
