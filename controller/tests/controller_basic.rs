//! The real controller binary against a real kube-apiserver: the everyday paths.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ringlb_controller::cleanup::CLEANUP_MAX_WAIT;
use serde_json::json;

#[tokio::test]
async fn create_gets_vip_within_one_second_and_delete_frees_it() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/30").await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    // Let the controller come up (first reconcile proves it).
    assert_eq!(
        create_and_wait_ips(&client, "warmup", json!({}), Duration::from_secs(20)).await,
        ["192.0.2.0".parse::<std::net::IpAddr>().unwrap()]
    );

    let t0 = Instant::now();
    let ips = create_and_wait_ips(&client, "web", json!({}), Duration::from_secs(1)).await;
    let took = t0.elapsed();
    assert_eq!(ips, ["192.0.2.1".parse::<std::net::IpAddr>().unwrap()]);
    eprintln!("create -> VIP in status: {took:?}");
    let svc = get_svc(&client, "web").await;
    let ing = &svc
        .status
        .as_ref()
        .unwrap()
        .load_balancer
        .as_ref()
        .unwrap()
        .ingress
        .as_ref()
        .unwrap()[0];
    assert_eq!(ing.ip_mode.as_deref(), Some("VIP"));
    assert_eq!(condition(&svc), Some(("True".into(), "Allocated".into())));

    // Fill the pool, delete one, and the freed address goes to the next Service.
    create_svc(&client, &lb_service("c", 80, json!({}))).await;
    create_and_wait_ips(&client, "d", json!({}), Duration::from_secs(5)).await;
    create_svc(&client, &lb_service("e", 80, json!({}))).await;
    wait_reason(&client, "e", "PoolExhausted", Duration::from_secs(5)).await;
    // Released after the edges' cleanup wait (the finalizer; tests/cleanup_finalizer.rs).
    delete_svc(&client, "web").await;
    assert_eq!(
        wait_ips(&client, "e", CLEANUP_MAX_WAIT + Duration::from_secs(5)).await,
        ips,
        "e reuses web's freed address"
    );
}

#[tokio::test]
async fn requested_ip_and_refusals() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);

    assert_eq!(
        create_and_wait_ips(
            &client,
            "want",
            json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": "192.0.2.77"}}}),
            Duration::from_secs(20)
        )
        .await,
        ["192.0.2.77".parse::<std::net::IpAddr>().unwrap()]
    );
    // The deprecated field works too.
    assert_eq!(
        create_and_wait_ips(
            &client,
            "legacy",
            json!({"spec": {"loadBalancerIP": "192.0.2.78"}}),
            Duration::from_secs(5)
        )
        .await,
        ["192.0.2.78".parse::<std::net::IpAddr>().unwrap()]
    );

    // Refusals: each a Warning Event with its reason and a False condition.
    let cases = [
        (
            "taken",
            json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": "192.0.2.77"}}}),
            "IPInUse",
        ),
        (
            "outside",
            json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": "203.0.113.1"}}}),
            "IPOutsidePools",
        ),
        (
            "garbage",
            json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": "not-an-ip"}}}),
            "MalformedAnnotation",
        ),
        (
            "v6",
            json!({"spec": {"ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}}),
            "UnsupportedFamily",
        ),
        (
            "nopool",
            json!({"metadata": {"annotations": {"ringlb.io/ip-pool": "missing"}}}),
            "PoolNotFound",
        ),
    ];
    for (name, extra, _) in &cases {
        create_svc(&client, &lb_service(name, 80, extra.clone())).await;
    }
    for (name, _, reason) in &cases {
        wait_warning(&client, name, reason, Duration::from_secs(5)).await;
        let svc = get_svc(&client, name).await;
        assert_eq!(
            condition(&svc),
            Some(("False".into(), reason.to_string())),
            "{name}"
        );
        assert!(ingress_ips(&svc).is_empty(), "{name} got no address");
    }
    let ctrl = &_ctrl;
    let n = ctrl
        .metric("ringlb_controller_refusals_total{reason=\"ip_in_use\"}")
        .await;
    assert_eq!(n, Some(1.0), "{}", ctrl.metrics_text().await);

    // The cause goes away (holder deleted): the refused Service is retried by itself.
    delete_svc(&client, "want").await;
    assert_eq!(
        wait_ips(&client, "taken", CLEANUP_MAX_WAIT + Duration::from_secs(5)).await,
        ["192.0.2.77".parse::<std::net::IpAddr>().unwrap()]
    );
}

#[tokio::test]
async fn sharing_and_dual_stack() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(&client, "v4", &["192.0.2.0/24"], |_| {}).await;
    create_pool(&client, "v6", &["2001:db8::/64"], |_| {}).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);

    let shared = |name: &str, port: i32, key: &str| {
        lb_service(
            name,
            port,
            json!({"metadata": {"annotations": {"ringlb.io/allow-shared-ip": key}}}),
        )
    };
    create_svc(&client, &shared("dns-tcp", 53, "dns")).await;
    let a = wait_ips(&client, "dns-tcp", Duration::from_secs(20)).await;
    create_svc(&client, &shared("dns-web", 80, "dns")).await;
    assert_eq!(
        wait_ips(&client, "dns-web", Duration::from_secs(5)).await,
        a,
        "same key, other port: shared"
    );
    create_svc(&client, &shared("dns-clash", 53, "dns")).await;
    let c = wait_ips(&client, "dns-clash", Duration::from_secs(5)).await;
    assert_ne!(c, a, "same key, same port: not shared");
    create_svc(&client, &shared("other", 8080, "other-key")).await;
    let o = wait_ips(&client, "other", Duration::from_secs(5)).await;
    assert!(o != a && o != c);
    // Explicitly asking for the shared address without the key is refused.
    create_svc(
        &client,
        &lb_service(
            "intruder",
            9,
            json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": a[0].to_string()}}}),
        ),
    )
    .await;
    wait_warning(&client, "intruder", "IPInUse", Duration::from_secs(5)).await;

    // Dual-stack: RequireDualStack gets both, in spec.ipFamilies order.
    let ds = create_and_wait_ips(
        &client,
        "ds",
        json!({"spec": {"ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}}),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(ds.len(), 2);
    assert!(ds[0].is_ipv6() && ds[1].is_ipv4(), "{ds:?}");
    // 2001:db8:: is the /64's subnet-router anycast address, never handed out.
    assert_eq!(ds[0], "2001:db8::1".parse::<std::net::IpAddr>().unwrap());
    // PreferDualStack gets both while both families have pools.
    let p = create_and_wait_ips(
        &client,
        "prefer",
        json!({"spec": {"ipFamilies": ["IPv4"], "ipFamilyPolicy": "PreferDualStack"}}),
        Duration::from_secs(5),
    )
    .await;
    assert!(p.len() == 2 && p[0].is_ipv4() && p[1].is_ipv6(), "{p:?}");
    // Single-stack IPv6.
    let six = create_and_wait_ips(
        &client,
        "six",
        json!({"spec": {"ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}}),
        Duration::from_secs(5),
    )
    .await;
    assert!(six.len() == 1 && six[0].is_ipv6());
}

#[tokio::test]
async fn exhausted_pool_then_new_pool_allocates_without_touching_the_service() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(&client, "tiny", &["192.0.2.10/32"], |_| {}).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    create_and_wait_ips(&client, "first", json!({}), Duration::from_secs(20)).await;
    create_svc(&client, &lb_service("second", 80, json!({}))).await;
    wait_warning(&client, "second", "PoolExhausted", Duration::from_secs(5)).await;
    assert_eq!(
        condition(&get_svc(&client, "second").await),
        Some(("False".into(), "PoolExhausted".into()))
    );
    let t0 = Instant::now();
    create_pool(&client, "more", &["198.51.100.0/24"], |_| {}).await;
    assert_eq!(
        wait_ips(&client, "second", Duration::from_secs(5)).await,
        ["198.51.100.0".parse::<std::net::IpAddr>().unwrap()]
    );
    eprintln!(
        "pool added -> pending Service allocated in {:?}",
        t0.elapsed()
    );

    // Pool status: counts per family and Ready.
    let pools: kube::Api<ringlb_crds::IPPool> = kube::Api::all(client.clone());
    wait_for(Duration::from_secs(5), "pool status counts", || {
        let pools = pools.clone();
        async move {
            let p = pools.get("tiny").await.ok()?;
            let v4 = p.status.as_ref()?.ipv4.as_ref()?;
            (v4.allocated == 1 && v4.free == "0").then_some(())
        }
    })
    .await;

    // Shrinking a pool away from a Service keeps its address and warns.
    let patch = json!({"spec": {"cidrs": ["192.0.2.99/32"]}});
    pools
        .patch(
            "tiny",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    wait_warning(&client, "first", "IPOutsidePools", Duration::from_secs(5)).await;
    assert_eq!(
        ingress_ips(&get_svc(&client, "first").await),
        ["192.0.2.10".parse::<std::net::IpAddr>().unwrap()]
    );
}

#[tokio::test]
async fn class_and_type_changes() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/30").await;
    let _ctrl = Ctrl::start(&cluster, "c1", &["--default-class=false"]);
    let ip = create_and_wait_ips(
        &client,
        "ours",
        json!({"spec": {"loadBalancerClass": "ringlb.io/maglev"}}),
        Duration::from_secs(20),
    )
    .await;
    create_svc(&client, &lb_service("noclass", 80, json!({}))).await;
    create_svc(
        &client,
        &lb_service(
            "theirs",
            80,
            json!({"spec": {"loadBalancerClass": "example.com/other"}}),
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in ["noclass", "theirs"] {
        let s = get_svc(&client, n).await;
        assert!(
            ingress_ips(&s).is_empty() && condition(&s).is_none(),
            "{n} is not ours with --default-class=false"
        );
    }
    // Type changes to ClusterIP: status cleared, released after the cleanup wait (the
    // finalizer goes then); the address is reused.
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    let patch = json!({"spec": {"type": "ClusterIP", "loadBalancerClass": null}});
    api.patch(
        "ours",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let released = CLEANUP_MAX_WAIT + Duration::from_secs(5);
    wait_for(released, "status cleared and finalizer removed", || {
        let client = client.clone();
        async move {
            let s = get_svc(&client, "ours").await;
            let finalized = s
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty());
            (ingress_ips(&s).is_empty() && condition(&s).is_none() && !finalized).then_some(())
        }
    })
    .await;
    assert_eq!(
        create_and_wait_ips(
            &client,
            "next",
            json!({"spec": {"loadBalancerClass": "ringlb.io/maglev"}}),
            Duration::from_secs(5)
        )
        .await,
        ip
    );
}

#[tokio::test]
async fn namespace_and_service_selectors_pick_the_pool() {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::Api;
    use kube::api::PostParams;

    let cluster = cluster().await;
    let client = cluster.client().await;
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "prod", "labels": {"tier": "gold"}}}))
            .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    create_pool(&client, "gold", &["198.51.100.0/24"], |s| {
        s.priority = -1;
        s.namespace_selector =
            Some(serde_json::from_value(json!({"matchLabels": {"tier": "gold"}})).unwrap());
    })
    .await;
    create_pool(&client, "edge", &["203.0.113.0/24"], |s| {
        s.priority = -2;
        s.service_selector = Some(
            serde_json::from_value(
                json!({"matchExpressions": [{"key": "edge", "operator": "Exists"}]}),
            )
            .unwrap(),
        );
    })
    .await;
    create_pool(&client, "main", &["192.0.2.0/24"], |_| {}).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);

    let mut in_prod = lb_service("api", 80, json!({}));
    in_prod.metadata.namespace = Some("prod".into());
    let prod: Api<Service> = Api::namespaced(client.clone(), "prod");
    prod.create(&PostParams::default(), &in_prod).await.unwrap();
    create_svc(&client, &lb_service("plain", 80, json!({}))).await;
    create_svc(
        &client,
        &lb_service("edgy", 80, json!({"metadata": {"labels": {"edge": "yes"}}})),
    )
    .await;

    let ip = wait_for(Duration::from_secs(20), "prod/api VIP", || {
        let prod = prod.clone();
        async move { ingress_ips(&prod.get("api").await.ok()?).first().copied() }
    })
    .await;
    assert_eq!(ip.to_string(), "198.51.100.0", "namespace selector");
    assert_eq!(
        wait_ips(&client, "plain", Duration::from_secs(5)).await[0].to_string(),
        "192.0.2.0"
    );
    assert_eq!(
        wait_ips(&client, "edgy", Duration::from_secs(5)).await[0].to_string(),
        "203.0.113.0",
        "service selector + priority"
    );
}

#[tokio::test]
async fn pool_status_shows_overlaps_and_usage() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(&client, "wide", &["192.0.2.0/24", "2001:db8::/64"], |_| {}).await;
    create_pool(&client, "narrow", &["192.0.2.128/25"], |_| {}).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    create_and_wait_ips(
        &client,
        "a",
        json!({"spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}}),
        Duration::from_secs(20),
    )
    .await;
    let pools: kube::Api<ringlb_crds::IPPool> = kube::Api::all(client.clone());
    let cond = |p: &ringlb_crds::IPPool, t: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let wide = wait_for(Duration::from_secs(5), "wide pool status", || {
        let pools = pools.clone();
        async move {
            let p = pools.get("wide").await.ok()?;
            (p.status.as_ref()?.ipv6.as_ref()?.allocated == 1).then_some(p)
        }
    })
    .await;
    let st = wide.status.as_ref().unwrap();
    assert_eq!(st.ipv4.as_ref().unwrap().free, "255");
    assert_eq!(st.ipv6.as_ref().unwrap().free, "18446744073709551614");
    assert_eq!(cond(&wide, "Ready").unwrap().0, "True");
    let (overlapping, msg) = cond(&wide, "Overlapping").unwrap();
    assert_eq!(overlapping, "True");
    assert!(msg.contains("narrow"), "{msg}");

    // A pool the schema accepts but the controller cannot use (overlapping blocks
    // inside one pool) is marked Invalid, naming the problem, and is not used.
    create_pool(
        &client,
        "dup",
        &["198.51.100.0/24", "198.51.100.128/25"],
        |s| s.priority = -5,
    )
    .await;
    let dup = wait_for(Duration::from_secs(5), "dup pool Invalid", || {
        let pools = pools.clone();
        async move {
            let p = pools.get("dup").await.ok()?;
            (cond(&p, "Invalid")?.0 == "True").then_some(p)
        }
    })
    .await;
    assert_eq!(cond(&dup, "Ready").unwrap().0, "False");
    assert!(
        cond(&dup, "Invalid").unwrap().1.contains("overlaps"),
        "{:?}",
        cond(&dup, "Invalid")
    );
    let b = create_and_wait_ips(&client, "b", json!({}), Duration::from_secs(5)).await;
    // "narrow" sorts before "wide" at equal priority; the invalid pool (priority -5)
    // would come first if it were used.
    assert_eq!(
        b[0].to_string(),
        "192.0.2.129",
        "the invalid pool is skipped"
    );
}

/// A deleted Service that someone else's finalizer keeps: as the Kubernetes service
/// controller does, the VIP is withdrawn at once (the status), held while a live edge
/// has not acknowledged that (its Lease), then released and our finalizer removed,
/// while the object itself waits for the other finalizer.
#[tokio::test]
async fn terminating_service_releases_its_vip_after_the_cleanup_wait() {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, DeleteParams, Patch, PatchParams};
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    edge_lease(&client, "edge-1", None).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    let want = json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": "192.0.2.50"}}});
    let mut held = lb_service("held", 80, want.clone());
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create_svc(&client, &held).await;
    assert_eq!(
        wait_ips(&client, "held", Duration::from_secs(20)).await,
        ["192.0.2.50".parse::<std::net::IpAddr>().unwrap()]
    );
    let api = Api::<Service>::namespaced(client.clone(), "default");
    api.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(
        get_svc(&client, "held")
            .await
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // While the edges withdraw it, its address is still in use.
    create_svc(&client, &lb_service("next", 80, want)).await;
    wait_warning(&client, "next", "IPInUse", Duration::from_secs(10)).await;
    assert!(ingress_ips(&get_svc(&client, "next").await).is_empty());
    let cleared = wait_for(
        Duration::from_secs(10),
        "held's VIP out of its status",
        || {
            let client = client.clone();
            async move {
                let s = get_svc(&client, "held").await;
                ingress_ips(&s).is_empty().then_some(s)
            }
        },
    )
    .await;
    let rv = cleared.metadata.resource_version.clone().unwrap();
    edge_lease(&client, "edge-1", Some(&rv)).await;

    // Once the edge has acknowledged, the address moves on by itself; "held" is still there, with
    // only the other finalizer and no VIP.
    assert_eq!(
        wait_ips(&client, "next", CLEANUP_MAX_WAIT + Duration::from_secs(10)).await,
        ["192.0.2.50".parse::<std::net::IpAddr>().unwrap()]
    );
    let still = get_svc(&client, "held").await;
    assert_eq!(
        still.metadata.finalizers,
        Some(vec!["example.com/hold".to_string()])
    );
    assert!(ingress_ips(&still).is_empty());
    let patch = json!({"metadata": {"finalizers": null}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}
