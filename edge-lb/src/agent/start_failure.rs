//! An edge whose flags cannot work on this node (a chart value: no such
//! `--interface`, a `--pin-dir` off a bpffs, a `--ring-size` out of range) says
//! so where an operator looks before it exits: a log line naming the flag and
//! the fix, and a Warning Event `EdgeConfigInvalid` on its Node. The pod then
//! restarts and never turns Ready, so a rolling update stops at it and the other
//! edges keep serving.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use ringlb_ops::CommonArgs;

use super::RunArgs;

/// The Event's reason.
pub(crate) const REASON: &str = "EdgeConfigInvalid";
/// How long the Event may take: the API may be what is wrong.
const POST_TIMEOUT: Duration = Duration::from_secs(5);
/// The API's limit on an Event's note, in bytes.
const NOTE_MAX: usize = 1024;

/// [`RunArgs::check`], reported as above when it fails.
pub(super) async fn checked(common: &CommonArgs, args: &RunArgs) -> anyhow::Result<Ipv4Addr> {
    let err = match args.check() {
        Ok(router_id) => return Ok(router_id),
        Err(e) => e,
    };
    let why = format!("{err:#}");
    tracing::error!(node = %args.node_name, error = %why, "the edge cannot start with these flags");
    let ev = event(&args.node_name, &why);
    match tokio::time::timeout(POST_TIMEOUT, post(common, &args.node_name, ev)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "writing the {REASON} Event failed")
        }
        Err(_) => tracing::warn!(
            "writing the {REASON} Event: no answer from the API within {POST_TIMEOUT:?}"
        ),
    }
    Err(err)
}

async fn post(common: &CommonArgs, node: &str, ev: Event) -> anyhow::Result<()> {
    let client = common.connect().await?;
    let reporter = Reporter {
        controller: "ringlb-edge".into(),
        instance: Some(node.into()),
    };
    Recorder::new(client, reporter)
        .publish(&ev, &node_ref(node))
        .await?;
    Ok(())
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..Default::default()
    }
}

/// The Warning for `why`, cut to the API's limit on a char boundary.
pub(crate) fn event(node: &str, why: &str) -> Event {
    let mut note = format!("edge {node} cannot start: {why}");
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(note),
        action: "Start".into(),
        secondary: None,
    }
}

/// What is wrong with an `--interface` this node does not have, and the fix.
pub(super) fn no_such_interface(name: &str) -> String {
    let mut here: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    here.sort();
    format!(
        "--interface {name}: no such interface on this node (it has {}); give the uplink \
         to the ToR (the chart's edge.interface)",
        here.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_names_the_node_and_the_cause_within_the_apis_limit() {
        let ev = event("e1", "--interface nope0: no such interface");
        assert_eq!((ev.reason.as_str(), ev.type_), (REASON, EventType::Warning));
        assert_eq!(
            ev.note.as_deref(),
            Some("edge e1 cannot start: --interface nope0: no such interface")
        );
        let long = "é".repeat(NOTE_MAX);
        let note = event("e1", &long).note.unwrap();
        assert!(
            note.len() <= NOTE_MAX && note.ends_with("..."),
            "{}",
            note.len()
        );
    }
}
