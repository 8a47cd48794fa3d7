//! The object store: every object as JSON, keyed by (resource id, namespace, name),
//! one global resourceVersion counter, and a bounded history of change events that
//! watches replay from. No HTTP and no Kubernetes semantics beyond resourceVersion:
//! those live in `api.rs`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: EventType,
    pub resource: Arc<str>,
    /// The object after the change (for DELETED: the last state, with the delete's rv).
    pub object: Arc<Value>,
    /// The object before the change, if there was one.
    pub old: Option<Arc<Value>>,
}

/// What a mutation closure decided.
pub enum Mutation {
    /// Store this object (create or replace).
    Put(Value),
    /// Remove the object.
    Remove,
    /// Leave the object as it is.
    Keep,
}

type Objects = BTreeMap<(String, String), Arc<Value>>;

struct Inner {
    rv: u64,
    objects: HashMap<Arc<str>, Objects>,
    history: VecDeque<Arc<Change>>,
    /// Every change with `rv <= compacted` is gone from `history`.
    compacted: u64,
    history_limit: usize,
}

/// The store. Cheap operations under one mutex; nothing awaits while holding it.
pub struct Store {
    inner: Mutex<Inner>,
    latest: watch::Sender<u64>,
}

/// Too old: the asked-for resourceVersion is behind the retained history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub oldest: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: HashMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                history_limit: history_limit.max(1),
            }),
            latest: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated (every
        // update is a single insert/remove), so a poisoned lock is safe to reuse.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the objects (shared, copy-on-write per object) and the counter, with
    /// no history and no subscribers: for dry runs.
    pub fn fork(&self) -> Store {
        let g = self.lock();
        Store {
            inner: Mutex::new(Inner {
                rv: g.rv,
                objects: g.objects.clone(),
                history: VecDeque::new(),
                compacted: g.rv,
                history_limit: g.history_limit,
            }),
            latest: watch::channel(g.rv).0,
        }
    }

    /// The current (latest) resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// A receiver that changes whenever a new change is recorded.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let g = self.lock();
        g.objects
            .get(resource)?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of a resource (in one namespace, or all when `namespace` is `None`),
    /// sorted by (namespace, name), and the resourceVersion they were read at.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let g = self.lock();
        let items = match g.objects.get(resource) {
            None => Vec::new(),
            Some(objs) => match namespace {
                None => objs.values().cloned().collect(),
                Some(ns) => objs
                    .range((ns.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(_, v)| v.clone())
                    .collect(),
            },
        };
        (items, g.rv)
    }

    /// Atomically reads the object (if any), lets `f` decide, and applies the
    /// decision: a new resourceVersion and a recorded change for Put/Remove.
    /// Returns `f`'s extra result and the stored object after the mutation.
    pub fn mutate<T, E>(
        &self,
        resource: &Arc<str>,
        namespace: &str,
        name: &str,
        f: impl FnOnce(Option<&Arc<Value>>, u64) -> Result<(Mutation, T), E>,
    ) -> Result<(Option<Arc<Value>>, T), E> {
        let mut g = self.lock();
        let key = (namespace.to_string(), name.to_string());
        let old = g.objects.get(resource).and_then(|m| m.get(&key)).cloned();
        let next_rv = g.rv + 1;
        let (m, extra) = f(old.as_ref(), next_rv)?;
        let (kind, stored) = match m {
            Mutation::Keep => return Ok((old, extra)),
            Mutation::Put(mut obj) => {
                set_rv(&mut obj, next_rv);
                let obj = Arc::new(obj);
                g.objects
                    .entry(resource.clone())
                    .or_default()
                    .insert(key, obj.clone());
                let kind = if old.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (kind, obj)
            }
            Mutation::Remove => {
                let Some(prev) = old.clone() else {
                    return Ok((None, extra));
                };
                if let Some(m) = g.objects.get_mut(resource) {
                    m.remove(&key);
                }
                let mut last = (*prev).clone();
                set_rv(&mut last, next_rv);
                (EventType::Deleted, Arc::new(last))
            }
        };
        g.rv = next_rv;
        g.history.push_back(Arc::new(Change {
            rv: next_rv,
            kind,
            resource: resource.clone(),
            object: stored.clone(),
            old,
        }));
        while g.history.len() > g.history_limit {
            if let Some(c) = g.history.pop_front() {
                g.compacted = c.rv;
            }
        }
        drop(g);
        self.latest.send_replace(next_rv);
        let result = if kind == EventType::Deleted {
            None
        } else {
            Some(stored)
        };
        Ok((result, extra))
    }

    /// Changes with `rv > after`, oldest first, or `Expired` when some of them are
    /// no longer retained.
    pub fn changes_since(&self, after: u64) -> Result<Vec<Arc<Change>>, Expired> {
        let g = self.lock();
        if after < g.compacted {
            return Err(Expired {
                oldest: g.compacted,
            });
        }
        let start = g.history.partition_point(|c| c.rv <= after);
        Ok(g.history.range(start..).cloned().collect())
    }

    /// Forgets all retained history: any watch from an older resourceVersion gets 410.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.compacted = g.rv;
    }

    /// Every (resource id, name) in a namespace.
    pub fn keys_in_namespace(&self, namespace: &str) -> Vec<(Arc<str>, String)> {
        let g = self.lock();
        let mut out = Vec::new();
        for (res, m) in &g.objects {
            for ((n, name), _) in m.range((namespace.to_string(), String::new())..) {
                if n != namespace {
                    break;
                }
                out.push((res.clone(), name.clone()));
            }
        }
        out
    }
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(o) = obj.as_object_mut() {
        let meta = o
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(s: &Store, name: &str, v: Value) -> Arc<Value> {
        let res: Arc<str> = "/things".into();
        s.mutate::<_, ()>(&res, "ns", name, |_, _| Ok((Mutation::Put(v), ())))
            .unwrap()
            .0
            .unwrap()
    }

    #[test]
    fn rv_increases_and_history_replays() {
        let s = Store::new(3);
        let a = put(&s, "a", json!({"metadata": {"name": "a"}}));
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        put(&s, "b", json!({}));
        put(&s, "a", json!({"x": 1}));
        let ch = s.changes_since(1).unwrap();
        assert_eq!(ch.iter().map(|c| c.rv).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(ch[1].kind, EventType::Modified);
        put(&s, "c", json!({}));
        put(&s, "d", json!({}));
        // history keeps 3 changes: 3,4,5; asking after 1 needs 2, which is gone.
        assert_eq!(s.changes_since(1).err(), Some(Expired { oldest: 2 }));
        assert_eq!(s.changes_since(2).unwrap().len(), 3);
        s.compact();
        assert!(s.changes_since(4).is_err());
        assert!(s.changes_since(5).unwrap().is_empty());
    }

    #[test]
    fn list_is_scoped_and_sorted() {
        let s = Store::new(10);
        put(&s, "b", json!({}));
        put(&s, "a", json!({}));
        let (items, rv) = s.list("/things", Some("ns"));
        assert_eq!(items.len(), 2);
        assert_eq!(rv, 2);
        assert!(s.list("/things", Some("other")).0.is_empty());
        assert!(s.keys_in_namespace("ns").iter().any(|(_, n)| n == "a"));
    }
}
