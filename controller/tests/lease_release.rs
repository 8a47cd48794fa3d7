//! The leader's Lease on shutdown and across a reinstall, against a real
//! kube-apiserver, with the flags' default timings (15 s Lease, 2 s retry period):
//! a successor must not wait for the Lease to expire.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::DeleteParams;

/// The chart's defaults, so that waiting for expiry would take 15 s.
const DEFAULT_TIMINGS: [&str; 6] = [
    "--lease-duration",
    "15s",
    "--renew-deadline",
    "10s",
    "--retry-period",
    "2s",
];

/// SIGTERM to the leader: it releases the Lease (no holder, 1 s duration, as
/// client-go's ReleaseOnCancel) and the standby leads within 3 s, not after the
/// 15 s Lease expires.
#[tokio::test]
async fn a_standby_leads_within_3s_of_the_leaders_sigterm() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    let mut a = Ctrl::start(&cluster, "replica-a", &DEFAULT_TIMINGS);
    wait_holder(&client, "replica-a", Duration::from_secs(20)).await;
    let _b = Ctrl::start(&cluster, "replica-b", &DEFAULT_TIMINGS);
    // b is a candidate (it has read the Lease at least once) before a goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    let t0 = Instant::now();
    a.terminate().await;
    assert!(a.logs().contains("released the Lease"), "{}", a.logs());
    let spec = lease(&client).await.unwrap().spec.unwrap();
    if spec.holder_identity.is_none() {
        assert_eq!(spec.lease_duration_seconds, Some(1), "{spec:?}");
    }
    wait_holder(&client, "replica-b", Duration::from_secs(20)).await;
    let took = t0.elapsed();
    eprintln!("the standby led {took:?} after the leader's SIGTERM");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// `helm uninstall` deletes the RBAC and the ServiceAccount while the leader still
/// runs, so its release is refused (403) and the Lease keeps its holder. The next installation's
/// controller (a new ServiceAccount of the same name: another UID) takes the Lease
/// at once, because the Lease is owned by the old ServiceAccount.
#[tokio::test]
async fn a_reinstall_leads_within_3s_although_the_old_leader_could_not_release() {
    let mut cluster = cluster().await;
    let client = cluster.client().await;
    let mut old = Ctrl::start(&cluster, "old-install", &DEFAULT_TIMINGS);
    wait_holder(&client, "old-install", Duration::from_secs(20)).await;
    let owners = lease(&client).await.unwrap().metadata.owner_references;
    let owners = owners.expect("the Lease has an owner");
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "ServiceAccount");
    assert_eq!(owners[0].name, "ringlb-controller");

    // Uninstall: helm deletes the RBAC and the ServiceAccount in one pass, without
    // waiting for the pod, which gets SIGTERM a moment later.
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), RELEASE_NS);
    bindings
        .delete(
            "ringlb-controller-leader-election",
            &DeleteParams::default(),
        )
        .await
        .expect("delete the leader-election RoleBinding");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), RELEASE_NS);
    sas.delete("ringlb-controller", &DeleteParams::default())
        .await
        .expect("delete the ServiceAccount");
    // The RBAC authorizer sees the deletion through its informer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    old.terminate().await;
    assert_eq!(
        holder(&client).await.as_deref(),
        Some("old-install"),
        "the old leader could not release the Lease (its RBAC is gone):\n{}",
        old.logs()
    );

    // Install again: a new ServiceAccount (new UID) and a new controller.
    cluster
        .cp
        .apply_chart_rbac(RELEASE_NS)
        .await
        .expect("the chart's RBAC applies again");
    let kubeconfig = cluster
        .cp
        .service_account_kubeconfig(RELEASE_NS, "ringlb-controller")
        .await
        .expect("a token of the new ServiceAccount");
    cluster.set_kubeconfig(kubeconfig);
    let t0 = Instant::now();
    let new = Ctrl::start(&cluster, "new-install", &DEFAULT_TIMINGS);
    wait_holder(&client, "new-install", Duration::from_secs(20)).await;
    let took = t0.elapsed();
    eprintln!("the new installation led {took:?} after its controller started");
    assert!(took < Duration::from_secs(3), "{took:?}\n{}", new.logs());
    assert!(
        new.logs().contains("previous installation"),
        "{}",
        new.logs()
    );
    let new_uid = sas.get("ringlb-controller").await.unwrap().metadata.uid;
    let owners = lease(&client)
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap();
    assert_eq!(
        Some(owners[0].uid.clone()),
        new_uid,
        "the new ServiceAccount owns it"
    );
}
