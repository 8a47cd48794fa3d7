//! Version conversion between a resource's storage form and the form a request
//! asked for. Only one conversion exists: `events.k8s.io/v1` Events are stored as
//! core `v1` Events (as kube-apiserver does), so Events written by kube-rs's
//! Recorder show up in `kubectl get events` and `kubectl describe`, and the other
//! way round. Every other resource only gets its apiVersion/kind set.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::resources::ResourceInfo;

/// (events.k8s.io/v1 field, core/v1 field)
const EVENT_FIELDS: [(&str, &str); 15] = [
    ("metadata", "metadata"),
    ("regarding", "involvedObject"),
    ("related", "related"),
    ("reason", "reason"),
    ("note", "message"),
    ("type", "type"),
    ("action", "action"),
    ("eventTime", "eventTime"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("series", "series"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn is_events_v1(info: &ResourceInfo) -> bool {
    info.group == "events.k8s.io" && info.plural == "events"
}

fn rename(obj: &Value, to_core: bool) -> Value {
    let mut out = Map::new();
    for (new, core) in EVENT_FIELDS {
        let (from, to) = if to_core { (new, core) } else { (core, new) };
        if let Some(v) = obj.get(from) {
            out.insert(to.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// The apiVersion objects of this resource are stored with.
pub fn storage_api_version(info: &ResourceInfo) -> String {
    if is_events_v1(info) {
        "v1".into()
    } else {
        info.api_version()
    }
}

/// A request body in the requested version, turned into the storage form.
pub fn to_storage(info: &ResourceInfo, obj: Value) -> Value {
    if !is_events_v1(info) {
        return obj;
    }
    let mut core = rename(&obj, true);
    core["apiVersion"] = json!("v1");
    core["kind"] = json!("Event");
    core
}

/// A stored object as the requested version presents it.
pub fn present(info: &ResourceInfo, obj: Arc<Value>) -> Arc<Value> {
    let av = info.api_version();
    if obj.get("apiVersion").and_then(Value::as_str) == Some(av.as_str())
        && obj.get("kind").and_then(Value::as_str) == Some(info.kind.as_str())
    {
        return obj;
    }
    let mut o = if is_events_v1(info) {
        rename(&obj, false)
    } else {
        (*obj).clone()
    };
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), json!(av));
        m.insert("kind".into(), json!(info.kind));
    }
    Arc::new(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apisim::resources::builtins;

    #[test]
    fn events_round_trip() {
        let all = builtins();
        let new = all.iter().find(|r| r.group == "events.k8s.io").unwrap();
        let core = all
            .iter()
            .find(|r| r.group.is_empty() && r.plural == "events")
            .unwrap();
        assert_eq!(new.id, core.id, "one storage for both versions");
        let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Service", "name": "web"}, "note": "pool exhausted", "type": "Warning",
            "reason": "AllocationFailed", "reportingController": "ringlb.io/controller"});
        let stored = to_storage(new, ev.clone());
        assert_eq!(stored["involvedObject"]["name"], "web");
        assert_eq!(stored["message"], "pool exhausted");
        assert_eq!(stored["apiVersion"], "v1");
        let back = present(new, Arc::new(stored.clone()));
        assert_eq!(*back, ev);
        let as_core = present(core, Arc::new(stored.clone()));
        assert_eq!(*as_core, stored);
    }
}
