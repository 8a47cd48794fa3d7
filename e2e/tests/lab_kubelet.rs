//! The lab kubelet (`controlplane::kubelet`) under the real controllers: a
//! Deployment's pods are bound, get the kubelet's IPs and turn Running and Ready; the
//! real EndpointSlice controller lists them ready; a deleted pod is kept Ready through
//! its grace period (the slice shows it serving and terminating), then deleted, and
//! its IP goes to the ReplicaSet's replacement. (Split out of controlplane.rs.)

use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams};
use ringlb_e2e::controlplane::{KubeletOptions, LabNode};

const V4: [&str; 2] = ["10.244.0.10", "10.244.0.11"];

/// Polls `f` every 100 ms until it gives `Some`, at most `limit`.
async fn until<T, F: std::future::Future<Output = Result<T, String>>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let t0 = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(seen) if t0.elapsed() > limit => {
                panic!("{what}: not after {limit:?}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn ips(p: &Pod) -> Vec<IpAddr> {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|i| i.ip.parse().unwrap())
        .collect()
}

/// (address, ready, serving, terminating) of every endpoint of Service `web`.
/// Waits up to 30 s until the slices list exactly `want`.
async fn endpoints_become(
    slices: &Api<EndpointSlice>,
    want: &[(String, bool, bool, bool)],
    what: &str,
) {
    until(what, Duration::from_secs(30), || async {
        let eps = endpoints(slices).await;
        if eps == want {
            Ok(())
        } else {
            Err(format!("{eps:?}"))
        }
    })
    .await;
}

async fn endpoints(slices: &Api<EndpointSlice>) -> Vec<(String, bool, bool, bool)> {
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let mut v: Vec<_> = slices
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|s| s.endpoints)
        .map(|e| {
            let c = e.conditions.unwrap_or_default();
            (
                e.addresses[0].clone(),
                c.ready == Some(true),
                c.serving == Some(true),
                c.terminating == Some(true),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn deployment_pods_run_ready_terminate_and_the_real_endpointslices_follow() {
    let t_start = Instant::now();
    let cp = cp().await;
    let _kubelet = cp
        .start_kubelet(KubeletOptions {
            nodes: vec![
                LabNode::new("lab-node-1").address("192.0.2.1".parse().unwrap()),
                LabNode::new("lab-node-2").address("192.0.2.2".parse().unwrap()),
                LabNode::new("lab-edge").without_pods(),
            ],
            pod_ips: V4.iter().map(|s| s.parse().unwrap()).collect(),
            pod_cidrs: vec!["fd00:10:244::/64".parse().unwrap()],
        })
        .await
        .expect("the lab kubelet registers its nodes");
    cp.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
         spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n\
         \x20   metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 3\n\
         \x20     containers: [{name: web, image: lab/web, ports: [{containerPort: 8080}]}]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
         spec:\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n",
    )
    .await
    .expect("the Deployment and Service apply");
    let client = cp.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client, "default");

    // 2 pods: bound to the two pod nodes (never the edge), Running, Ready, with one
    // IP of the list and one of the IPv6 CIDR each
    let running = until("2 Running+Ready pods", Duration::from_secs(30), || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await;
        let list = list.map_err(|e| e.to_string())?.items;
        let ok = list.len() == 2
            && list.iter().all(|p| {
                ready(p) && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
        if ok {
            Ok(list)
        } else {
            Err(format!("{} pods", list.len()))
        }
    })
    .await;
    eprintln!("2 Running+Ready pods after {:?}", t_start.elapsed());
    let mut v4: Vec<String> = Vec::new();
    let mut nodes: Vec<String> = Vec::new();
    for p in &running {
        let ips = ips(p);
        assert_eq!(ips.len(), 2, "dual-stack podIPs: {ips:?}");
        assert!(
            ips[0].is_ipv4() && ips[1].is_ipv6(),
            "primary family first: {ips:?}"
        );
        assert!(
            "fd00:10:244::/64"
                .parse::<ipnetwork::IpNetwork>()
                .unwrap()
                .contains(ips[1]),
            "{ips:?}"
        );
        v4.push(ips[0].to_string());
        nodes.push(p.spec.as_ref().unwrap().node_name.clone().unwrap());
    }
    v4.sort();
    nodes.sort();
    assert_eq!(v4, V4, "the pods hold the list's IPs");
    assert_eq!(
        nodes,
        ["lab-node-1", "lab-node-2"],
        "round robin over the pod nodes"
    );

    // the real EndpointSlice controller lists both, ready
    let want: Vec<_> = V4
        .iter()
        .map(|ip| (ip.to_string(), true, true, false))
        .collect();
    endpoints_become(&slices, &want, "both endpoints ready in the EndpointSlice").await;

    // delete one: terminating (still serving) during its 3 s grace, then gone
    let victim = running
        .iter()
        .find(|p| ips(p)[0].to_string() == V4[0])
        .unwrap();
    let name = victim.metadata.name.clone().unwrap();
    let t_del = Instant::now();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    until(
        "the deleted pod serving+terminating",
        Duration::from_secs(3),
        || async {
            let eps = endpoints(&slices).await;
            if eps.contains(&(V4[0].to_string(), false, true, true)) {
                Ok(())
            } else {
                Err(format!("{eps:?}"))
            }
        },
    )
    .await;
    let during = pods
        .get(&name)
        .await
        .expect("still there during the grace period");
    assert!(
        ready(&during),
        "the kubelet keeps it Ready while it terminates"
    );
    until("the deleted pod gone", Duration::from_secs(15), || async {
        match pods.get_opt(&name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    let gone_after = t_del.elapsed();
    assert!(
        gone_after >= Duration::from_secs(2),
        "deleted only at the end of its grace period, not at once ({gone_after:?})"
    );
    eprintln!("deleted pod gone {gone_after:?} after the DELETE (grace 3 s)");
    // its IPv4 address was the last free one of the list: the ReplicaSet's
    // replacement gets it now, and the slice is back to two ready endpoints
    endpoints_become(&slices, &want, "the replacement with the freed IP, ready").await;
    eprintln!("lab kubelet test done in {:?}", t_start.elapsed());
}

/// With kube-scheduler running, the kubelet binds nothing: kube-scheduler places the
/// pods on the kubelet's nodes (Ready, their not-ready taint lifted), as its
/// Scheduled events show, and the kubelet then runs them.
#[tokio::test]
async fn with_kube_scheduler_the_scheduler_binds_and_the_kubelet_runs() {
    let t_start = Instant::now();
    let cp = ringlb_e2e::controlplane::ControlPlane::start(ringlb_e2e::controlplane::Options {
        scheduler: true,
        ..Default::default()
    })
    .await
    .expect("the control plane starts with kube-scheduler");
    let _kubelet = cp
        .start_kubelet(KubeletOptions {
            nodes: vec![LabNode::new("sched-node-1"), LabNode::new("sched-node-2")],
            pod_ips: V4.iter().map(|s| s.parse().unwrap()).collect(),
            pod_cidrs: Vec::new(),
        })
        .await
        .unwrap();
    cp.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
         spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n\
         \x20   metadata: {labels: {app: web}}\n    spec:\n\
         \x20     containers: [{name: web, image: lab/web}]\n",
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client().await, "default");
    let running = until(
        "2 Ready pods placed by kube-scheduler",
        Duration::from_secs(60),
        || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await;
            let list = list.map_err(|e| e.to_string())?.items;
            if list.len() == 2 && list.iter().all(ready) {
                Ok(list)
            } else {
                Err(format!("{} pods", list.len()))
            }
        },
    )
    .await;
    let mut v4: Vec<String> = running.iter().map(|p| ips(p)[0].to_string()).collect();
    v4.sort();
    assert_eq!(v4, V4);
    // the binding came from kube-scheduler: its Scheduled events name the nodes
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cp.client().await, "default");
    let scheduled = until(
        "kube-scheduler's Scheduled events",
        Duration::from_secs(10),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let from_scheduler: Vec<String> = list
                .items
                .iter()
                .filter(|e| e.reason.as_deref() == Some("Scheduled"))
                .filter(|e| e.reporting_controller.as_deref() == Some("default-scheduler"))
                .filter_map(|e| e.note.clone())
                .collect();
            if from_scheduler.len() == 2 {
                Ok(from_scheduler)
            } else {
                Err(format!("{from_scheduler:?}"))
            }
        },
    )
    .await;
    eprintln!("{scheduled:?}; done in {:?}", t_start.elapsed());
}

async fn cp() -> ringlb_e2e::controlplane::ControlPlane {
    ringlb_e2e::controlplane::ControlPlane::start(ringlb_e2e::controlplane::Options::default())
        .await
        .expect("the control plane starts")
}
