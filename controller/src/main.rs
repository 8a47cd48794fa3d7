//! ringlb-controller: allocates VIPs for `type: LoadBalancer` Services.
//!
//! Start-up order matters: CRDs checked, Lease acquired, pools loaded, the
//! allocator rebuilt from every Service's status, and only then the controller
//! starts allocating. See docs/controller.md.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, ResourceExt};
use prometheus_client::registry::Registry;
use ringlb_controller::events::Events;
use ringlb_controller::ipam::Ipam;
use ringlb_controller::ipam::PortProto;
use ringlb_controller::ipam::request::{is_ours, service_key, status_ips};
use ringlb_controller::leader::{Elector, LeaderConfig};
use ringlb_controller::metrics::Metrics;
use ringlb_controller::{pools, reconcile};
use ringlb_crds::IPPool;
use ringlb_crds::service::ANNOTATION_SHARED;
use ringlb_ops::{CommonArgs, Health};

/// Allocates VIPs from IPPools for Services of type LoadBalancer and writes them to
/// status.loadBalancer.ingress.
#[derive(Parser, Debug)]
#[command(name = "ringlb-controller", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Also serve LoadBalancer Services that set no spec.loadBalancerClass.
    /// `--default-class=false` serves only class ringlb.io/maglev.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    default_class: bool,

    /// Run leader election (needed with more than one replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ringlb-system")]
    lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = "ringlb-controller")]
    lease_name: String,

    /// This replica's identity in the Lease. Default: $POD_NAME, else hostname-pid.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// How long a Lease is valid without renewal (e.g. 15s, 1500ms).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// The leader gives up (and exits) when it could not renew for this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,

    /// How often candidates retry and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
}

/// `15s`, `1500ms`, `2m`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (like 15s or 500ms)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?} is not a duration (like 15s or 500ms)"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}

/// Fails with an operator-readable message when the IPPool CRD is missing.
async fn check_crds(client: &Client) -> anyhow::Result<()> {
    let api: Api<IPPool> = Api::all(client.clone());
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => anyhow::bail!(
            "the IPPool CRD (ippools.ringlb.io) is not installed: apply crds/*.yaml \
             (or install the Helm chart) and restart"
        ),
        Err(e) => Err(e).context("checking that the ringlb CRDs are installed"),
    }
}

/// One log line per invalid pool, naming every bad field (the pool's status carries an
/// `Invalid` condition too).
fn log_invalid_pools<E: std::fmt::Display>(invalid: &std::collections::BTreeMap<String, Vec<E>>) {
    for (name, errs) in invalid {
        tracing::warn!(
            pool = %name,
            errors = ?errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "IPPool is invalid; not used"
        );
    }
}

/// Loads pools and adopts every ringlb Service's status addresses, before anything
/// is allocated. Conflicts are reported, not fixed.
async fn rebuild(
    client: &Client,
    ipam: &Mutex<Ipam>,
    events: &Events,
    metrics: &Metrics,
    default_class: bool,
) -> anyhow::Result<()> {
    let pool_objs = Api::<IPPool>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing IPPools")?;
    let (p, invalid) = pools::pools_from(pool_objs.items.iter());
    log_invalid_pools(&invalid);
    ipam.lock()
        .unwrap_or_else(|e| e.into_inner())
        .set_pools(p, invalid);

    let mut svcs = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Services")?
        .items;
    svcs.retain(|s| is_ours(s, default_class) && !status_ips(s).is_empty());
    // Oldest first: on a conflict the Service that had the address first keeps it.
    svcs.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            service_key(a),
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                service_key(b),
            ))
    });
    let mut conflicts = Vec::new();
    {
        let mut ipam = ipam.lock().unwrap_or_else(|e| e.into_inner());
        for s in &svcs {
            let sharing = s
                .annotations()
                .get(ANNOTATION_SHARED)
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty());
            let mut ports: Vec<PortProto> = s
                .spec
                .as_ref()
                .and_then(|sp| sp.ports.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|p| PortProto {
                    port: p.port,
                    protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                })
                .collect();
            ports.sort();
            ports.dedup();
            for c in ipam.adopt(&service_key(s), &status_ips(s), sharing.as_deref(), &ports) {
                conflicts.push((s.clone(), c));
            }
        }
        tracing::info!(
            services = ipam.service_count(),
            addresses = ipam.allocated_count(),
            conflicts = conflicts.len(),
            "rebuilt the allocator from Service statuses"
        );
    }
    metrics.adoptions.inc_by(svcs.len() as u64);
    for (svc, c) in conflicts {
        tracing::error!(service = %c.service, ip = %c.ip, holder = %c.holder, "two Services hold one address without a legal share; leaving both alone");
        metrics.warned("rebuild_conflict");
        let note = format!(
            "status holds {}, which {} also holds without a legal share; not renumbering either, fix one of them",
            c.ip, c.holder
        );
        events.warn(&svc, "IPConflict", note).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.common.log_level).map_err(anyhow::Error::msg)?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let leader_cfg = LeaderConfig {
        namespace: args.lease_namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.clone(),
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    };
    if args.leader_elect {
        leader_cfg.validate()?;
    }

    let health = Health::new();
    let mut registry = Registry::with_prefix("ringlb");
    let metrics = Metrics::register(&mut registry);
    let registry = Arc::new(tokio::sync::Mutex::new(registry));
    let (addr, _ops) = ringlb_ops::serve_ops(args.common.metrics_addr, registry, health.clone())
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.common.metrics_addr))?;
    tracing::info!(%addr, %identity, "serving /metrics /healthz /readyz");

    let client = args.common.kube_client().await?;
    check_crds(&client).await?;
    let events = Events::new(client.clone(), Some(identity.clone()));

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    tokio::pin!(shutdown);

    // Standby replicas are healthy and ready; only the leader writes.
    health.set_ready(true);
    let mut lost = if args.leader_elect {
        let mut elector = Elector::new(client.clone(), leader_cfg.clone());
        tokio::select! {
            _ = elector.acquire() => {}
            _ = &mut shutdown => { tracing::info!("shutting down (standby)"); return Ok(()); }
        }
        metrics.leader.set(1);
        tokio::spawn(async move {
            let e = elector.hold().await;
            // Exit at once, wherever the rest of the program is (start-up included):
            // a replica that lost the Lease must not write again. A restart makes it a
            // candidate.
            tracing::error!(error = %e, "stopping: no longer the leader, so no more writes");
            std::process::exit(1);
            #[allow(unreachable_code)]
            e
        })
    } else {
        // Without election this replica is the (only) writer.
        metrics.leader.set(1);
        tokio::spawn(futures::future::pending())
    };

    let ipam = Arc::new(Mutex::new(Ipam::new()));
    rebuild(&client, &ipam, &events, &metrics, args.default_class).await?;

    let (ns_reader, ns_writer) = reflector::store::<Namespace>();
    let ns_task = tokio::spawn(
        watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(ringlb_ops::WatchBackoff::default())
        .reflect(ns_writer)
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "namespace watch");
            }
        }),
    );

    // Pools with a namespaceSelector need the namespaces' labels: allocating before
    // the first list would pick a wrong pool, and a Service never moves afterwards.
    ns_reader
        .wait_until_ready()
        .await
        .context("first list of Namespaces")?;

    let pools_dirty = Arc::new(tokio::sync::Notify::new());
    pools_dirty.notify_one();
    let (ctx, retry_rx) = reconcile::Ctx::new(
        client.clone(),
        ipam.clone(),
        events.clone(),
        metrics.clone(),
        args.default_class,
        ns_reader,
        pools_dirty.clone(),
    );

    // IPPools: every change replaces the allocator's pool set and re-checks all Services.
    let (all_tx, all_rx) = mpsc::unbounded::<()>();
    let (pool_reader, pool_writer) = reflector::store::<IPPool>();
    let pool_api: Api<IPPool> = Api::all(client.clone());
    let pool_task = {
        let reader = pool_reader.clone();
        let ipam = ipam.clone();
        let dirty = pools_dirty.clone();
        let last = Arc::new(Mutex::new(BTreeSet::<String>::new()));
        tokio::spawn(
            watcher(pool_api.clone(), watcher::Config::default())
                .backoff(ringlb_ops::WatchBackoff::default())
                .reflect(pool_writer)
                .for_each(move |ev| {
                    let (reader, ipam, dirty, all_tx, last) = (
                        reader.clone(),
                        ipam.clone(),
                        dirty.clone(),
                        all_tx.clone(),
                        last.clone(),
                    );
                    async move {
                        match ev {
                            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => {
                                let objs = reader.state();
                                let (p, invalid) =
                                    pools::pools_from(objs.iter().map(|o| o.as_ref()));
                                let fingerprint: BTreeSet<String> = objs
                                    .iter()
                                    .map(|o| {
                                        format!(
                                            "{}:{}",
                                            o.name_any(),
                                            serde_json::to_string(&o.spec).unwrap_or_default()
                                        )
                                    })
                                    .collect();
                                let changed = {
                                    let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
                                    let changed = *l != fingerprint;
                                    *l = fingerprint;
                                    changed
                                };
                                if changed {
                                    tracing::info!(
                                        pools = p.len(),
                                        invalid = invalid.len(),
                                        "IPPools changed"
                                    );
                                    log_invalid_pools(&invalid);
                                    ipam.lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .set_pools(p, invalid);
                                    let _ = all_tx.unbounded_send(());
                                }
                                dirty.notify_one();
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "IPPool watch"),
                        }
                    }
                }),
        )
    };
    let status_task = tokio::spawn(pools::status_writer(
        pool_api,
        pool_reader,
        ipam.clone(),
        metrics.clone(),
        pools_dirty,
        Duration::from_millis(500),
    ));

    tracing::info!(default_class = args.default_class, "controller running");
    let result = tokio::select! {
        _ = reconcile::run(ctx, retry_rx, all_rx) => Err(anyhow::anyhow!("the Service controller stopped")),
        res = &mut lost => match res {
            Ok(e) => Err(anyhow::Error::new(e).context("stopping: no longer the leader, so no more writes")),
            Err(e) => Err(anyhow::anyhow!("leader election task failed: {e}")),
        },
        _ = &mut shutdown => {
            tracing::info!("shutting down; releasing the Lease");
            // Stop renewing first, or a renewal could re-take the Lease after release.
            lost.abort();
            if args.leader_elect {
                Elector::new(client.clone(), leader_cfg).release().await;
            }
            Ok(())
        }
    };
    ns_task.abort();
    pool_task.abort();
    status_task.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn flags() {
        let a =
            Args::try_parse_from(["c", "--default-class=false", "--leader-elect=false"]).unwrap();
        assert!(!a.default_class && !a.leader_elect);
        let a = Args::try_parse_from(["c"]).unwrap();
        assert!(a.default_class && a.leader_elect);
        assert!(Args::try_parse_from(["c", "--lease-duration", "fast"]).is_err());
    }
}
