//! `reconcile` against a mocked API server (tower-test, as kube-rs's controller-rs
//! does): every request the reconcile makes is checked (method, path, body) and
//! answered in turn; after the reconcile, no request may be left.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use ringlb_crds::IPPool;
use ringlb_crds::edge_ack;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle};

use super::{Ctx, Error, REFUSED_RETRY, RESYNC, lock, reconcile};
use crate::backends::{BACKENDS_CONDITION_TYPE, FAILOVER_CONDITION_TYPE};
use crate::cleanup::FINALIZER;
use crate::events::Events;
use crate::ipam::Ipam;
use crate::metrics::Metrics;
use crate::pools::pools_from;
use crate::status::CONDITION_TYPE;

const STATUS_PATH: &str = "/api/v1/namespaces/shop/services/web/status";
const SERVICE_PATH: &str = "/api/v1/namespaces/shop/services/web";
/// The cleanup wait in these tests.
const WAIT: Duration = Duration::from_millis(100);
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

/// The API server's side of the mocked client.
struct ApiServer(Handle<Request<Body>, Response<Body>>);

impl ApiServer {
    /// Takes the next request, checks its method and path, answers `reply` with 200
    /// (`Value::Null`: the request's own body, as a create does), and returns the
    /// request's query string and JSON body.
    async fn expect(&mut self, method: Method, path: &str, reply: &Value) -> (String, Value) {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .unwrap_or_else(|_| panic!("no {method} {path} within 5 s"))
            .expect("the client is gone");
        assert_eq!((req.method(), req.uri().path()), (&method, path));
        let query = req.uri().query().unwrap_or_default().to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let answer = serde_json::to_vec(if reply.is_null() { &body } else { reply }).unwrap();
        send.send_response(Response::builder().body(Body::from(answer)).unwrap());
        (query, body)
    }

    /// Expects the status patch of `shop/web`, answers it with `svc`, and returns the
    /// patch's query string and body.
    async fn expect_status_patch(&mut self, svc: &Service) -> (String, Value) {
        let reply = serde_json::to_value(svc).unwrap();
        self.expect(Method::PATCH, STATUS_PATH, &reply).await
    }

    /// Expects a (metadata) patch of `shop/web`, answers it with `svc`, and returns
    /// the patch's body.
    async fn expect_service_patch(&mut self, svc: &Service) -> Value {
        let reply = serde_json::to_value(svc).unwrap();
        self.expect(Method::PATCH, SERVICE_PATH, &reply).await.1
    }

    /// Expects an Event about `shop/web` and returns it.
    async fn expect_event(&mut self) -> Value {
        self.expect(Method::POST, EVENTS_PATH, &Value::Null).await.1
    }

    /// Reconciles `svc` (seen on the watch first), failing on any request it makes.
    async fn reconcile_silently(&mut self, svc: Service, ctx: &Arc<Ctx>) -> Action {
        seen(ctx, &svc);
        tokio::select! {
            res = reconcile(Arc::new(svc), ctx.clone()) => res.unwrap(),
            Some((req, _)) = self.0.next_request() => {
                panic!("unexpected request {} {}", req.method(), req.uri())
            }
        }
    }

    /// Reconciles `svc` (seen on the watch first) through its first allocation: its
    /// status patch and its IPAllocated Event. Returns the status patch.
    async fn allocate(&mut self, ctx: &Arc<Ctx>, svc: &Service) -> Value {
        let run = start(ctx, svc);
        let (_, patch) = self.expect_status_patch(svc).await;
        self.expect_event().await;
        run.await.unwrap().unwrap();
        patch
    }

    /// Drops the controller and asserts that nothing else was asked: once every
    /// client is dropped, the request queue must be empty.
    async fn expect_nothing_more(mut self, ctx: Arc<Ctx>) {
        drop(ctx);
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .expect("a client is still alive");
        if let Some((req, _)) = next {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }
}

/// A live edge Lease on node `node` that acknowledged `applied` (`None`: nothing yet).
fn edge_lease(node: &str, applied: Option<&str>) -> Lease {
    let applied = applied.map(|a| a.parse().unwrap());
    let now = k8s_openapi::jiff::Timestamp::now();
    serde_json::from_value(edge_ack::lease_manifest(
        "ringlb-system",
        node,
        applied,
        now,
    ))
    .unwrap()
}

/// The controller with one live edge that acknowledges nothing (so a cleanup waits
/// the whole `WAIT`), and the writer of the edge Leases' store.
fn setup() -> (Arc<Ctx>, ApiServer) {
    let (ctx, api, _edges) = setup_with_edges();
    (ctx, api)
}

/// A reconciler over pool `192.0.2.8/29` talking to a mocked API.
fn setup_with_edges() -> (Arc<Ctx>, ApiServer, Writer<Lease>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let spec = serde_json::from_value(json!({"cidrs": ["192.0.2.8/29"]})).unwrap();
    let pool = IPPool::new("main", spec);
    let mut ipam = Ipam::new();
    let (pools, invalid) = pools_from([&pool]);
    ipam.set_pools(pools, invalid);
    let (namespaces, _) = kube::runtime::reflector::store();
    let (edges, mut edges_writer) = kube::runtime::reflector::store();
    edges_writer.apply_watcher_event(&watcher::Event::Apply(edge_lease("e1", None)));
    let (mut ctx, _retry_rx) = Ctx::new(
        client.clone(),
        Arc::new(Mutex::new(ipam)),
        Events::new(client, Some("test".into())),
        Metrics::register(&mut Registry::default()),
        true,
        super::Caches {
            namespaces,
            edge_acks: edges,
        },
        Arc::default(),
    );
    Arc::get_mut(&mut ctx).expect("not shared yet").cleanup_wait = WAIT;
    (ctx, ApiServer(handle), edges_writer)
}

/// `shop/web`, type LoadBalancer, with our finalizer and `extra` merged into it.
fn web(extra: Value) -> Service {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                     "resourceVersion": "7", "generation": 1, "finalizers": [FINALIZER]},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// Puts `svc` in the controller's Service cache, as the watch would have.
fn seen(ctx: &Ctx, svc: &Service) {
    let mut guard = lock(&ctx.services_writer);
    let writer = guard.as_mut().expect("the controller was not started");
    writer.apply_watcher_event(&watcher::Event::Apply(svc.clone()));
}

/// Starts reconciling `svc`, seen on the watch first; the test answers its requests.
fn start(ctx: &Arc<Ctx>, svc: &Service) -> JoinHandle<Result<Action, Error>> {
    seen(ctx, svc);
    tokio::spawn(reconcile(Arc::new(svc.clone()), ctx.clone()))
}

/// `svc` with the status that `patch` wrote.
fn patched(mut svc: Service, patch: &Value) -> Service {
    svc.status = serde_json::from_value(patch["status"].clone()).unwrap();
    svc
}

fn held(ctx: &Ctx) -> Vec<String> {
    let ipam = lock(&ctx.ipam);
    ipam.held("shop/web")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[tokio::test]
async fn a_service_gets_an_address_and_its_status_patched() {
    let (ctx, mut api) = setup();
    let svc = web(json!({}));
    let run = start(&ctx, &svc);

    let (query, patch) = api.expect_status_patch(&svc).await;
    assert_eq!(query, "&fieldManager=ringlb-controller");
    assert_eq!(
        patch["status"]["loadBalancer"]["ingress"],
        json!([{"ip": "192.0.2.8", "ipMode": "VIP"}])
    );
    let cond = &patch["status"]["conditions"][0];
    assert_eq!(
        (&cond["type"], &cond["status"], &cond["reason"]),
        (&json!(CONDITION_TYPE), &json!("True"), &json!("Allocated"))
    );
    assert_eq!(
        patch["metadata"]["resourceVersion"], "7",
        "the patch is conditional on the version read"
    );

    let event = api.expect_event().await;
    assert_eq!(
        (&event["type"], &event["reason"], &event["note"]),
        (
            &json!("Normal"),
            &json!("IPAllocated"),
            &json!("allocated 192.0.2.8")
        )
    );
    assert_eq!(event["regarding"]["name"], "web");

    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));
    assert_eq!(held(&ctx), ["192.0.2.8"]);
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn an_address_outside_every_pool_is_refused_with_a_warning() {
    let (ctx, mut api) = setup();
    let svc = web(json!({"metadata": {"annotations": {
        "ringlb.io/load-balancer-ips": "198.51.100.7"
    }}}));
    let run = start(&ctx, &svc);

    let (_, patch) = api.expect_status_patch(&svc).await;
    assert!(
        patch["status"].get("loadBalancer").is_none(),
        "no ingress written: {patch}"
    );
    let cond = &patch["status"]["conditions"][0];
    assert_eq!(
        (&cond["status"], &cond["reason"]),
        (&json!("False"), &json!("IPOutsidePools"))
    );
    let event = api.expect_event().await;
    assert_eq!(
        (&event["type"], &event["reason"]),
        (&json!("Warning"), &json!("IPOutsidePools"))
    );
    assert!(
        event["note"].as_str().unwrap().contains("198.51.100.7"),
        "{event}"
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(REFUSED_RETRY));
    assert!(held(&ctx).is_empty());

    // Reconciled again with the refusal already in its status: no patch, no Event.
    let mut refused = svc;
    refused.status = serde_json::from_value(json!({"conditions": [cond]})).unwrap();
    let again = api.reconcile_silently(refused, &ctx).await;
    assert_eq!(again, Action::requeue(REFUSED_RETRY));
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn a_kept_address_no_pool_covers_warns_without_a_patch() {
    let (ctx, mut api) = setup();
    // Allocated before its pool was deleted: the status already says so.
    let svc = web(json!({"status": {
        "loadBalancer": {"ingress": [{"ip": "198.51.100.7", "ipMode": "VIP"}]},
        "conditions": [{"type": CONDITION_TYPE, "status": "True", "reason": "Allocated",
                        "message": "allocated 198.51.100.7", "observedGeneration": 1,
                        "lastTransitionTime": "2024-01-01T00:00:00Z"}]
    }}));
    let run = start(&ctx, &svc);
    let event = api.expect_event().await;
    assert_eq!(
        (&event["type"], &event["reason"]),
        (&json!("Warning"), &json!("IPOutsidePools"))
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));
    assert_eq!(held(&ctx), ["198.51.100.7"], "kept, not renumbered");
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn deleted_and_foreign_services_are_left_alone() {
    let (ctx, mut api) = setup();
    let deleting = web(json!({"metadata": {
        "deletionTimestamp": "2024-01-01T00:00:00Z", "finalizers": ["other.io/x"]
    }}));
    let never_ours = |spec: Value| web(json!({"metadata": {"finalizers": null}, "spec": spec}));
    let foreign = never_ours(json!({"loadBalancerClass": "other.io/lb"}));
    let cluster_ip = never_ours(json!({"type": "ClusterIP"}));
    for (case, svc) in [
        ("deleting", deleting),
        ("foreign class", foreign),
        ("ClusterIP", cluster_ip),
    ] {
        let action = api.reconcile_silently(svc, &ctx).await;
        assert_eq!(action, Action::await_change(), "{case}");
    }
    assert!(held(&ctx).is_empty());
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn a_service_that_stops_being_ours_is_released_and_cleared() {
    let (ctx, mut api) = setup();
    let patch = api.allocate(&ctx, &web(json!({}))).await;

    // Its type changes away from LoadBalancer; the status still holds our ingress.
    let moved = patched(web(json!({"spec": {"type": "ClusterIP"}})), &patch);
    let run = start(&ctx, &moved);
    let (_, clear) = api.expect_status_patch(&moved).await;
    assert_eq!(
        clear["status"]["loadBalancer"],
        json!({"ingress": null}),
        "{clear}"
    );
    assert_eq!(clear["status"]["conditions"], Value::Null, "{clear}");
    // The edges get the cleanup wait to withdraw the VIP: the address stays held.
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(WAIT));
    assert_eq!(held(&ctx), ["192.0.2.8"]);
    let mut cleared = moved.clone();
    cleared.status = None;
    let again = api.reconcile_silently(cleared.clone(), &ctx).await;
    assert_ne!(again, Action::await_change(), "still waiting");
    assert_eq!(held(&ctx), ["192.0.2.8"]);

    // The wait is over: released, the finalizer removed, one Event.
    tokio::time::sleep(WAIT).await;
    let run = start(&ctx, &cleared);
    let mut done = cleared.clone();
    done.metadata.finalizers = None;
    let unfinalize = api.expect_service_patch(&done).await;
    assert_eq!(
        unfinalize,
        json!({"metadata": {"resourceVersion": "7", "finalizers": null}})
    );
    let event = api.expect_event().await;
    assert_eq!(
        (&event["reason"], &event["note"]),
        (
            &json!("IPReleased"),
            &json!("no longer a ringlb Service; released 192.0.2.8")
        )
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    assert!(held(&ctx).is_empty());
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn the_finalizer_goes_on_before_the_first_vip() {
    let (ctx, mut api) = setup();
    let mut svc = web(json!({}));
    svc.metadata.finalizers = Some(vec!["other.io/x".into()]);
    let run = start(&ctx, &svc);
    let mut finalized = svc.clone();
    finalized.metadata.finalizers = Some(vec!["other.io/x".into(), FINALIZER.into()]);
    finalized.metadata.resource_version = Some("8".into());
    let patch = api.expect_service_patch(&finalized).await;
    assert_eq!(
        patch,
        json!({"metadata": {"resourceVersion": "7", "finalizers": ["other.io/x", FINALIZER]}})
    );
    // The status patch is conditional on the version the finalizer patch returned.
    let (_, status) = api.expect_status_patch(&finalized).await;
    assert_eq!(status["metadata"]["resourceVersion"], "8");
    assert_eq!(
        status["status"]["loadBalancer"]["ingress"],
        json!([{"ip": "192.0.2.8", "ipMode": "VIP"}])
    );
    api.expect_event().await; // IPAllocated
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn a_deleted_service_is_withdrawn_then_released_then_unfinalized() {
    let (ctx, mut api) = setup();
    let patch = api.allocate(&ctx, &web(json!({}))).await;

    let deletion = json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}});
    let mut deleting = patched(web(deletion), &patch);
    let run = start(&ctx, &deleting);
    let (_, clear) = api.expect_status_patch(&deleting).await;
    assert_eq!(clear["status"]["loadBalancer"], json!({"ingress": null}));
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(WAIT));
    assert_eq!(held(&ctx), ["192.0.2.8"], "held while the edges withdraw");

    tokio::time::sleep(WAIT).await;
    deleting.status = None;
    let run = start(&ctx, &deleting);
    let unfinalize = api.expect_service_patch(&deleting).await;
    assert_eq!(unfinalize["metadata"]["finalizers"], Value::Null);
    // No Event about an object that is going away.
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    assert!(held(&ctx).is_empty());
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn the_finalizer_goes_once_every_live_edge_acknowledged_the_withdrawal() {
    let (ctx, mut api, mut edges) = setup_with_edges();
    api.allocate(&ctx, &web(json!({}))).await;

    // Cleared at resourceVersion 7 (the fixture's): edge e1 has acted on 6 only.
    let mut deleting = web(json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}));
    deleting.status = None;
    edges.apply_watcher_event(&watcher::Event::Apply(edge_lease("e1", Some("6"))));
    let again = api.reconcile_silently(deleting.clone(), &ctx).await;
    assert_ne!(again, Action::await_change(), "e1 has not reached 7");
    assert_eq!(held(&ctx), ["192.0.2.8"]);

    // e1 reaches 7, and a second edge whose Lease has expired is not waited for.
    edges.apply_watcher_event(&watcher::Event::Apply(edge_lease("e1", Some("7"))));
    let mut gone = edge_lease("e2", Some("1"));
    gone.spec.as_mut().unwrap().renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            "2024-01-01T00:00:00Z".parse().unwrap(),
        ));
    edges.apply_watcher_event(&watcher::Event::Apply(gone));
    let run = start(&ctx, &deleting);
    let unfinalize = api.expect_service_patch(&deleting).await;
    assert_eq!(unfinalize["metadata"]["finalizers"], Value::Null);
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    assert!(
        held(&ctx).is_empty(),
        "released well before the longest wait"
    );
    api.expect_nothing_more(ctx).await;
}

/// Puts `shop/web`'s EndpointSlice (one endpoint, ready or not) in the controller's
/// cache and marks the slices listed, as the EndpointSlice watch would have.
fn slice_seen(ctx: &Ctx, ready: bool) {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-abc", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready}}]
    }))
    .unwrap();
    let mut guard = lock(&ctx.slices_writer);
    let writer = guard.as_mut().expect("the controller was not started");
    writer.apply_watcher_event(&watcher::Event::Apply(slice));
    ctx.slices_listed
        .store(true, std::sync::atomic::Ordering::Release);
}

fn condition<'a>(patch: &'a Value, type_: &str) -> &'a Value {
    patch["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} in {patch}"))
}

#[tokio::test]
async fn the_backends_condition_follows_the_endpoint_slices_without_events() {
    let (ctx, mut api) = setup();
    slice_seen(&ctx, true);
    let svc = web(json!({}));
    let patch = api.allocate(&ctx, &svc).await;
    assert_eq!(condition(&patch, CONDITION_TYPE)["status"], "True");
    let backends = condition(&patch, BACKENDS_CONDITION_TYPE);
    assert_eq!(
        (&backends["status"], &backends["reason"]),
        (&json!("True"), &json!("BackendsReady"))
    );

    // Its only endpoint goes unready: one patch flips BackendsReady, the allocation
    // condition is kept, and no Event is sent (the edges report VIPUnhealthy).
    let allocated = patched(svc, &patch);
    slice_seen(&ctx, false);
    let run = start(&ctx, &allocated);
    let (_, flip) = api.expect_status_patch(&allocated).await;
    assert_eq!(condition(&flip, CONDITION_TYPE)["status"], "True");
    let backends = condition(&flip, BACKENDS_CONDITION_TYPE);
    assert_eq!(
        (&backends["status"], &backends["reason"]),
        (&json!("False"), &json!("NoReadyBackends"))
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));
    api.expect_nothing_more(ctx).await;
}

#[tokio::test]
async fn the_failover_condition_follows_the_endpoint_slices_beside_backends_ready() {
    let (ctx, mut api) = setup();
    slice_seen(&ctx, true);
    let ann = json!({"metadata": {"annotations": {"ringlb.io/failover-vip": "198.51.100.7"}}});
    let svc = web(ann);
    let patch = api.allocate(&ctx, &svc).await;
    let f = condition(&patch, FAILOVER_CONDITION_TYPE);
    assert_eq!(
        (&f["status"], &f["reason"]),
        (&json!("False"), &json!("LocalBackendsReady"))
    );

    // Its only endpoint goes unready: FailoverActive True beside BackendsReady False,
    // in one patch, and no Event (the edges report FailoverActive themselves).
    let allocated = patched(svc, &patch);
    slice_seen(&ctx, false);
    let run = start(&ctx, &allocated);
    let (_, flip) = api.expect_status_patch(&allocated).await;
    assert_eq!(condition(&flip, BACKENDS_CONDITION_TYPE)["status"], "False");
    let f = condition(&flip, FAILOVER_CONDITION_TYPE);
    assert_eq!(
        (&f["status"], &f["reason"], &f["message"]),
        (
            &json!("True"),
            &json!("NoReadyBackends"),
            &json!(
                "no ready endpoint on 80/TCP: the edges send its new flows to failover VIP \
                 198.51.100.7"
            )
        )
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));

    // The annotation removed: the condition goes, nothing else changes.
    let mut failed_over = patched(allocated, &flip);
    failed_over.metadata.annotations = None;
    let run = start(&ctx, &failed_over);
    let (_, gone) = api.expect_status_patch(&failed_over).await;
    let types: Vec<&Value> = gone["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["type"])
        .collect();
    assert_eq!(types, [CONDITION_TYPE, BACKENDS_CONDITION_TYPE]);
    assert_eq!(run.await.unwrap().unwrap(), Action::requeue(RESYNC));
    api.expect_nothing_more(ctx).await;
}
