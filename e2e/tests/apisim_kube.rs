//! The API simulator driven by kube-rs, the way the controller and edges use it:
//! list/watch with resourceVersions, conflicts, 410 Gone and watcher recovery,
//! finalizers, Leases, selectors, metadata reads, Events, fault knobs (writes and
//! patches: apisim_patch.rs).

mod common;
use common::{code, sim, svc};
use ringlb_e2e::{SimHandle, SimOptions, Simulator};

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;

#[tokio::test]
async fn list_then_watch_from_resource_version() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    api.create(&PostParams::default(), &svc("a")).await.unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2, "kubernetes + a");
    let rv = list.metadata.resource_version.unwrap();

    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &svc("b")).await.unwrap();
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(s) => seen.push(("ADDED", s.metadata.name.unwrap())),
            WatchEvent::Modified(s) => seen.push(("MODIFIED", s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => seen.push(("DELETED", s.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            ("ADDED", "b".into()),
            ("MODIFIED", "b".into()),
            ("DELETED", "b".into())
        ]
    );

    // resourceVersion=0 starts with the current state as ADDED events.
    let mut from_zero = api
        .watch(&WatchParams::default().timeout(2), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    while names.len() < 2 {
        if let Some(WatchEvent::Added(s)) = from_zero.try_next().await.unwrap() {
            names.push(s.metadata.name.unwrap());
        }
    }
    names.sort();
    assert_eq!(names, ["a", "kubernetes"]);
    sim.shutdown().await;
}

#[tokio::test]
async fn stale_update_is_409_and_create_twice_is_409() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let created = api
        .create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    assert_eq!(
        code(
            api.create(&PostParams::default(), &svc("web"))
                .await
                .unwrap_err()
        ),
        409
    );
    let mut first = created.clone();
    first
        .metadata
        .labels
        .get_or_insert_default()
        .insert("v".into(), "1".into());
    let updated = api
        .replace("web", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    // The same (now stale) resourceVersion again: Conflict.
    let mut second = created.clone();
    second
        .metadata
        .labels
        .get_or_insert_default()
        .insert("v".into(), "2".into());
    let err = api
        .replace("web", &PostParams::default(), &second)
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
    // A stale precondition inside a merge patch is a Conflict too.
    let stale = json!({"metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"v": "3"}}});
    assert_eq!(
        code(
            api.patch("web", &PatchParams::default(), &Patch::Merge(stale))
                .await
                .unwrap_err()
        ),
        409
    );
    // The spec survived, the allocation too.
    let now = api.get("web").await.unwrap();
    assert_eq!(now.metadata.labels.unwrap()["v"], "1");
    assert!(now.spec.unwrap().cluster_ip.unwrap().starts_with("10.96."));
    sim.shutdown().await;
}

#[tokio::test]
async fn too_old_resource_version_is_410_and_watcher_relists() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &svc("one"))
        .await
        .unwrap();
    sim.faults().compact();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // kube-runtime's watcher: after a dropped watch whose resume gets 410, it
    // re-lists and keeps delivering.
    let mut w: Events = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut init_done = false;
    while !init_done {
        if let watcher::Event::InitDone = tokio::time::timeout(Duration::from_secs(5), w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            init_done = true;
        }
    }
    // Phase 1: the open watch is dropped; the watcher re-watches from its last
    // resourceVersion and sees the next change without re-listing.
    let (relisted, found) = phase(&api, &sim, &mut w, "two", false).await;
    assert!(
        found,
        "watcher did not deliver the Service created after a dropped watch"
    );
    assert!(!relisted, "a plain drop needs no re-list");
    // Phase 2: dropped again, and the resume is answered 410: the watcher re-lists.
    let (relisted, found) = phase(&api, &sim, &mut w, "three", true).await;
    assert!(found, "watcher did not deliver the new Service after a 410");
    assert!(relisted, "watcher should have re-listed after the 410");
    assert!(sim.faults().dropped_watches() >= 2);
    sim.shutdown().await;
}

type Events = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<watcher::Event<Service>, watcher::Error>> + Send>,
>;

/// Lets the watcher open its watch, drops it (optionally making the resume a
/// 410), creates `name`; returns (re-listed, saw `name`).
async fn phase(
    api: &Api<Service>,
    sim: &SimHandle,
    w: &mut Events,
    name: &str,
    expire: bool,
) -> (bool, bool) {
    // poll so that the watcher issues its watch request
    let _ = tokio::time::timeout(Duration::from_millis(300), w.try_next()).await;
    if expire {
        sim.faults().expire_next(1);
    }
    sim.faults().drop_watches();
    api.create(&PostParams::default(), &svc(name))
        .await
        .unwrap();
    let mut relisted = false;
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match w.try_next().await {
                Ok(Some(watcher::Event::Init)) => relisted = true,
                Ok(Some(watcher::Event::InitApply(s) | watcher::Event::Apply(s)))
                    if s.metadata.name.as_deref() == Some(name) =>
                {
                    return;
                }
                // the 410 surfaces once as an error; the watcher then re-lists
                Ok(_) | Err(_) => {}
            }
        }
    })
    .await
    .is_ok();
    (relisted, found)
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().await);
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["ringlb.io/test"]}, "data": {"k": "v"}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let held = api.get("held").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp set"
    );
    // a second delete changes nothing
    api.delete("held", &DeleteParams::default()).await.unwrap();
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(code(api.get("held").await.unwrap_err()), 404);
    sim.shutdown().await;
}

#[tokio::test]
async fn lease_conflicts_make_leader_election_safe() {
    let sim = sim().await;
    let api: Api<Lease> = Api::namespaced(sim.client().await, "kube-system");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "ringlb-controller"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let held = api.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(
        code(
            api.create(&PostParams::default(), &lease)
                .await
                .unwrap_err()
        ),
        409
    );
    // Two candidates renew from the same read: exactly one wins.
    let mut a = held.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("a".into());
    a.spec.as_mut().unwrap().lease_transitions = Some(1);
    let mut b = held.clone();
    b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let pp = PostParams::default();
    let (ra, rb) = tokio::join!(
        api.replace("ringlb-controller", &pp, &a),
        api.replace("ringlb-controller", &pp, &b)
    );
    assert!(
        ra.is_ok() != rb.is_ok(),
        "exactly one writer wins: {ra:?} {rb:?}"
    );
    let winner = if ra.is_ok() { "a" } else { "b" };
    let now = api.get("ringlb-controller").await.unwrap();
    assert_eq!(now.spec.unwrap().holder_identity.as_deref(), Some(winner));
    sim.shutdown().await;
}

#[tokio::test]
async fn label_and_field_selectors() {
    let sim = Simulator::start(SimOptions {
        kubelet: false,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let client = sim.client().await;
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team", "labels": {"tier": "prod"}}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let prod = ns
        .list(&ListParams::default().labels("tier=prod"))
        .await
        .unwrap();
    assert_eq!(prod.items.len(), 1);
    let all_ns = ns
        .list(&ListParams::default().labels("kubernetes.io/metadata.name in (default,team)"))
        .await
        .unwrap();
    assert_eq!(all_ns.items.len(), 2);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    for (name, app) in [("p1", "web"), ("p2", "web"), ("p3", "db")] {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}))
            .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
        ),
        ["p1", "p2"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app!=web"))
                .await
                .unwrap()
        ),
        ["p3"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=p2"))
                .await
                .unwrap()
        ),
        ["p2"]
    );
    assert_eq!(
        names(
            pods.list(
                &ListParams::default()
                    .fields("status.phase=Pending")
                    .labels("app=db")
            )
            .await
            .unwrap()
        ),
        ["p3"]
    );
    // paging: limit 2 gives a continue token that yields the rest
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("continue token");
    let rest = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(rest), ["p3"]);
    // bad selectors are 400, not a crash
    assert_eq!(
        code(
            pods.list(&ListParams::default().labels("app in web"))
                .await
                .unwrap_err()
        ),
        400
    );
    // objects in a namespace that does not exist: 404
    let ghost: Api<Pod> = Api::namespaced(client, "ghost");
    let p: Pod =
        serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {"containers": []}}))
            .unwrap();
    assert_eq!(
        code(ghost.create(&PostParams::default(), &p).await.unwrap_err()),
        404
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn bookmarks_and_watch_timeouts() {
    let sim = Simulator::start(SimOptions {
        bookmark_interval: Duration::from_millis(200),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default().timeout(1);
    let started = std::time::Instant::now();
    let events: Vec<_> = api
        .watch(&wp, &rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "timeoutSeconds=1 ends the stream after ~1s"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, WatchEvent::Bookmark(b) if b.metadata.resource_version == rv))
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_knobs_fail_writes_and_delay() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().await);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    sim.faults().fail_next_writes(2);
    assert_eq!(
        code(api.create(&PostParams::default(), &cm).await.unwrap_err()),
        500
    );
    assert_eq!(
        code(api.create(&PostParams::default(), &cm).await.unwrap_err()),
        500
    );
    api.create(&PostParams::default(), &cm).await.unwrap();
    sim.faults().set_delay(Duration::from_millis(150));
    let t = std::time::Instant::now();
    api.get("c").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    sim.faults().set_delay(Duration::ZERO);
    sim.shutdown().await;
}

#[tokio::test]
async fn recorder_events_are_core_events_too() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let sim = sim().await;
    let client = sim.client().await;
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let web = svcs
        .create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ringlb-controller".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "AllocationFailed".into(),
        note: Some("pool exhausted".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    let reference = web.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    // The same event again becomes a series (a merge patch through events.k8s.io).
    recorder.publish(&ev, &reference).await.unwrap();
    let core: Api<CoreEvent> = Api::default_namespaced(client);
    let uid = web.metadata.uid.clone().unwrap();
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Service,involvedObject.name=web,involvedObject.uid={uid}"
    ));
    let got = core.list(&lp).await.unwrap().items;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].type_.as_deref(), Some("Warning"));
    assert_eq!(got[0].message.as_deref(), Some("pool exhausted"));
    assert_eq!(
        got[0].reporting_component.as_deref(),
        Some("ringlb-controller")
    );
    assert_eq!(got[0].series.as_ref().map(|s| s.count), Some(Some(2)));
    sim.shutdown().await;
}

#[tokio::test]
async fn kube_runtime_finalizer_helper_works() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event as Fin, finalizer};
    use std::sync::Arc;
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let created = api
        .create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    let ip = created.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let run = |obj: Service| {
        let api = api.clone();
        async move {
            finalizer(&api, "ringlb.io/vip", Arc::new(obj), |ev| async move {
                Ok::<_, std::convert::Infallible>(match ev {
                    Fin::Apply(_) => Action::await_change(),
                    Fin::Cleanup(_) => Action::await_change(),
                })
            })
            .await
        }
    };
    // first pass adds the finalizer (JSON patch: test null, add)
    run(api.get("web").await.unwrap()).await.unwrap();
    let got = api.get("web").await.unwrap();
    assert_eq!(
        got.metadata.finalizers.as_deref(),
        Some(&["ringlb.io/vip".to_string()][..])
    );
    run(got).await.unwrap();
    // delete: held by the finalizer until cleanup removes it (JSON patch: test, remove)
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let held = api.get("web").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    run(held).await.unwrap();
    assert!(
        api.get_opt("web").await.unwrap().is_none(),
        "gone after the finalizer is removed"
    );
    // its ClusterIP was released: the next Service gets it again
    let next = api
        .create(&PostParams::default(), &svc("next"))
        .await
        .unwrap();
    assert_eq!(next.spec.unwrap().cluster_ip.unwrap(), ip);
    sim.shutdown().await;
}

#[tokio::test]
async fn metadata_only_get_list_and_watch() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    api.create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    let m = api.get_metadata("web").await.unwrap();
    assert_eq!(m.metadata.name.as_deref(), Some("web"));
    let l = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 2);
    let rv = l.metadata.resource_version.unwrap();
    let mut w = api
        .watch_metadata(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &svc("two"))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), w.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(o)) => {
                assert_eq!(o.metadata.name.as_deref(), Some("two"));
                break;
            }
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    sim.shutdown().await;
}
