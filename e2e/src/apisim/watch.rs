//! Watch streams: newline-delimited JSON `{"type": ..., "object": ...}` events from
//! the store's change history, with kube-apiserver's resourceVersion semantics:
//!
//! - `resourceVersion` unset, "" or "0": synthetic ADDED events for the current
//!   state, then changes;
//! - `resourceVersion=N`: every change after N, or an ERROR event carrying a 410
//!   Expired Status when N is older than the retained history;
//! - `sendInitialEvents=true`: the current state, then a BOOKMARK annotated
//!   `k8s.io/initial-events-end` (streaming lists);
//! - `allowWatchBookmarks`: a BOOKMARK with the latest resourceVersion every
//!   bookmark interval;
//! - label and field selectors, where an object that stops (starts) matching is sent
//!   as DELETED (ADDED), as the watch cache does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::Api;
use super::convert::present;
use super::error::ApiError;
use super::faults::Faults;
use super::resources::ResourceInfo;
use super::select::{FieldSelector, LabelSelector};
use super::store::EventType;
use super::table;

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub info: Arc<ResourceInfo>,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `None` for unset/""/"0".
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    /// How event objects are rendered.
    pub repr: Repr,
}

/// The representation a client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    Full,
    /// `kubectl get -w`: every event's object is a one-row Table.
    Table,
    /// kube-rs metadata watches: PartialObjectMetadata.
    Metadata,
}

impl Repr {
    pub fn of(accept: &str) -> Self {
        if table::wants_table(accept) {
            Repr::Table
        } else if table::wants_metadata(accept) {
            Repr::Metadata
        } else {
            Repr::Full
        }
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(info: &ResourceInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": meta}),
    )
}

/// The watch ERROR event for a too-old resourceVersion.
pub fn expired_line(rv: u64, oldest: u64) -> Bytes {
    let e = ApiError::gone(format!("too old resource version: {rv} ({oldest})"));
    line("ERROR", &e.to_status())
}

impl WatchRequest {
    fn event(&self, kind: &str, obj: &Arc<Value>, rv: u64) -> Bytes {
        match self.repr {
            Repr::Table => line(
                kind,
                &table::render(&self.info, std::slice::from_ref(obj), rv),
            ),
            Repr::Metadata => line(kind, &table::partial(obj)),
            Repr::Full => line(kind, obj),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                != ns
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

/// Runs one watch until the client goes away, the timeout passes, the stream is
/// dropped by a fault, or the history no longer reaches the cursor.
pub async fn run(
    api: Arc<Api>,
    faults: Arc<Faults>,
    req: WatchRequest,
    bookmark_every: Duration,
    tx: mpsc::Sender<Bytes>,
) {
    let mut changed = api.store.subscribe();
    let mut dropped = faults.drop_signal();
    dropped.borrow_and_update();
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);

    let mut cursor = match req.resource_version {
        Some(rv) if !req.send_initial_events => {
            if faults.take_expire() {
                let _ = tx.send(expired_line(rv, api.store.current_rv())).await;
                return;
            }
            rv
        }
        _ => {
            let (items, rv) = api.store.list(&req.info.id, req.namespace.as_deref());
            let shown = items.into_iter().map(|o| present(&req.info, o));
            for obj in shown.filter(|o| req.matches(o)) {
                if tx.send(req.event("ADDED", &obj, rv)).await.is_err() {
                    return;
                }
            }
            if req.send_initial_events
                && req.bookmarks
                && tx.send(bookmark(&req.info, rv, true)).await.is_err()
            {
                return;
            }
            rv
        }
    };
    let mut tick = tokio::time::interval(bookmark_every);
    tick.tick().await;
    loop {
        changed.borrow_and_update();
        let changes = match api.store.changes_since(cursor) {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(expired_line(cursor, e.oldest)).await;
                return;
            }
        };
        for c in changes {
            cursor = c.rv;
            if c.resource != req.info.id {
                continue;
            }
            let obj = present(&req.info, c.object.clone());
            let now = req.matches(&obj);
            let before = c
                .old
                .as_ref()
                .is_some_and(|o| req.matches(&present(&req.info, o.clone())));
            let kind = match (c.kind, before, now) {
                (EventType::Deleted, true, _) => "DELETED",
                (EventType::Deleted, false, _) => continue,
                (EventType::Added, _, true) => "ADDED",
                (EventType::Modified, true, true) => "MODIFIED",
                (EventType::Modified, false, true) => "ADDED",
                (EventType::Modified, true, false) => "DELETED",
                _ => continue,
            };
            if tx.send(req.event(kind, &obj, c.rv)).await.is_err() {
                return;
            }
        }
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tick.tick() => {
                if req.bookmarks && tx.send(bookmark(&req.info, cursor, false)).await.is_err() {
                    return;
                }
            }
            _ = dropped.changed() => {
                faults.note_dropped();
                return;
            }
            _ = tx.closed() => return,
            _ = timeout => return,
        }
    }
}
