//! Feed the speaker from the API and report back.
//!
//! ```text
//!  watch BGPPeer ──┐
//!  watch BGPAdv  ──┼─ reflector stores ─ dirty ─> resync: select_for_node (pure)
//!  watch IPPool  ──┤                                  + Secrets (MD5 passwords)
//!  watch this Node ┘                                  -> Speaker::set_peers
//!  status loop: every peer's watch value -> merge_node_session -> replace_status
//!               every skipped peer's problem (report.rs) ┘ (+ a Warning Event once)
//! ```
//!
//! A resync also runs every minute, which picks up Secret changes (Secrets are read,
//! not watched, to keep the RBAC to `get` on the referenced ones).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use ringlb_crds::{BGPAdvertisement, BGPPeer, IPPool, SecretKeyRef};
use tokio::sync::Notify;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use ringlb_bgp::Error;
pub mod report;
pub mod select;

use crate::watch::watch_into;
use report::{STATE_CONFLICT, STATE_INVALID, SecretProblem, peer_conditions, problem_entry};
use ringlb_bgp::Speaker;
use select::{Selection, merge_node_session, node_session, select_for_node};

/// Who this node is.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub node_name: String,
    /// BGP identifier: usually the node's IPv4 address.
    pub router_id: Ipv4Addr,
}

fn api_err(what: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |e| Error::Io {
        what: what.to_string(),
        source: std::io::Error::other(e),
    }
}

type Passwords = HashMap<(String, String, String), Result<String, SecretProblem>>;

/// The MD5 passwords the peers name, or why each cannot be had. When a read fails
/// (API timeout, 5xx, 403), the password read last time is kept: a passing API
/// problem must not reset a working session. A Secret that is gone, or lacks the key,
/// drops the password.
async fn passwords(client: &Client, peers: &[Arc<BGPPeer>], previous: &Passwords) -> Passwords {
    let mut out = HashMap::new();
    for p in peers {
        let Some(r) = &p.spec.password_secret_ref else {
            continue;
        };
        let key = r.key.clone().unwrap_or_else(|| "password".into());
        let k = (r.namespace.clone(), r.name.clone(), key.clone());
        let api: Api<Secret> = Api::namespaced(client.clone(), &r.namespace);
        let got = match api.get_opt(&r.name).await {
            Ok(Some(s)) => {
                let data = s.data.unwrap_or_default();
                match data.get(&key).map(|b| String::from_utf8(b.0.clone())) {
                    Some(Ok(v)) => Ok(v),
                    _ => Err(SecretProblem::NoKey {
                        key,
                        // A key whose value is not UTF-8 is no usable key either.
                        keys: data
                            .iter()
                            .filter(|(_, v)| std::str::from_utf8(&v.0).is_ok())
                            .map(|(k, _)| k.clone())
                            .collect(),
                    }),
                }
            }
            Ok(None) => Err(SecretProblem::NotFound),
            Err(e) => match previous.get(&k) {
                Some(Ok(v)) => {
                    tracing::warn!(error = %e, secret = %r.name, namespace = %r.namespace,
                        "reading BGP password Secret; keeping the last one read");
                    Ok(v.clone())
                }
                _ => Err(SecretProblem::Unreadable {
                    reason: match &e {
                        kube::Error::Api(s) if s.code == 403 => format!(
                            "forbidden (HTTP 403): the edge's ServiceAccount may not get it ({})",
                            s.message
                        ),
                        other => other.to_string(),
                    },
                }),
            },
        };
        out.insert(k, got);
    }
    out
}

/// What the status loop writes for one `BGPPeer` selecting this node.
#[derive(Debug, Clone)]
enum Report {
    /// A session: its speaker status.
    Session { name: String, addr: IpAddr },
    /// No session here: why (`NodeSession.state`, condition type and reason, message).
    Problem {
        name: String,
        state: &'static str,
        condition: &'static str,
        reason: &'static str,
        message: String,
    },
}

impl Report {
    fn name(&self) -> &str {
        match self {
            Report::Session { name, .. } | Report::Problem { name, .. } => name,
        }
    }
}

/// The reports of one selection: sessions, then conflicts, then invalid peers.
fn reports(sel: &Selection) -> Vec<Report> {
    let mut out: Vec<Report> = sel
        .names
        .iter()
        .zip(&sel.peers)
        .map(|(name, p)| Report::Session {
            name: name.clone(),
            addr: p.address,
        })
        .collect();
    out.extend(sel.conflicts.iter().map(|c| Report::Problem {
        name: c.peer.clone(),
        state: STATE_CONFLICT,
        condition: "Conflict",
        reason: "SessionConflict",
        message: c.message(),
    }));
    out.extend(sel.errors.iter().map(|(name, e)| {
        let secret = sel.secret_problems.iter().find(|(n, _)| n == name);
        Report::Problem {
            name: name.clone(),
            state: STATE_INVALID,
            condition: "Invalid",
            reason: secret.map_or("InvalidSpec", |(_, r)| *r),
            message: e.to_string(),
        }
    }));
    out
}

/// Run until the API watches end: keep the speaker's peers in line with the objects
/// selecting this node, and keep this node's entry in each `BGPPeer` status current.
/// Feeds `speaker` from the API until the watches end. `heartbeat` beats once per
/// round (at least every minute).
pub async fn run(
    client: Client,
    node: NodeContext,
    speaker: Arc<Speaker>,
    heartbeat: ringlb_ops::Heartbeat,
) -> Result<(), Error> {
    let dirty = Arc::new(Notify::new());
    let (peers, t1) = watch_into(
        Api::<BGPPeer>::all(client.clone()),
        watcher::Config::default(),
        dirty.clone(),
    );
    let (adverts, t2) = watch_into(
        Api::<BGPAdvertisement>::all(client.clone()),
        watcher::Config::default(),
        dirty.clone(),
    );
    let (pools, t3) = watch_into(
        Api::<IPPool>::all(client.clone()),
        watcher::Config::default(),
        dirty.clone(),
    );
    let (nodes, t4) = watch_into(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", node.node_name)),
        dirty.clone(),
    );
    let names: Arc<Mutex<Vec<Report>>> = Arc::default();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ringlb-edge".into(),
            instance: Some(node.node_name.clone()),
        },
    );
    // (BGPPeer, message) of the Warnings already sent: one Event per new problem.
    let mut warned: std::collections::HashSet<(String, String)> = Default::default();
    // A Weak reference: the status loop must not keep the speaker alive, or the
    // agent's exit could not take it back to send its Cease (`agent::stop`).
    let status_task = tokio::spawn(status_loop(
        client.clone(),
        node.node_name.clone(),
        Arc::downgrade(&speaker),
        names.clone(),
    ));

    let mut tick = tokio::time::interval(Duration::from_secs(60));
    let mut last_passwords = Passwords::new();
    loop {
        heartbeat.beat();
        tokio::select! {
            _ = dirty.notified() => {}
            _ = tick.tick() => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // coalesce bursts
        let node_labels = nodes
            .state()
            .first()
            .map(|n| n.labels().clone())
            .unwrap_or_default();
        let peer_objs = peers.state();
        let pw = passwords(&client, &peer_objs, &last_passwords).await;
        last_passwords = pw.clone();
        let lookup = |r: &SecretKeyRef| {
            let key = r.key.clone().unwrap_or_else(|| "password".into());
            pw.get(&(r.namespace.clone(), r.name.clone(), key))
                .cloned()
                .unwrap_or(Err(SecretProblem::NotFound))
        };
        let peer_list: Vec<BGPPeer> = peer_objs.iter().map(|p| (**p).clone()).collect();
        let adv_list: Vec<BGPAdvertisement> =
            adverts.state().iter().map(|a| (**a).clone()).collect();
        let pool_list: Vec<IPPool> = pools.state().iter().map(|p| (**p).clone()).collect();
        let sel = select_for_node(
            &node_labels,
            node.router_id,
            &peer_list,
            &adv_list,
            &pool_list,
            &lookup,
        );
        let now_reports = reports(&sel);
        let mut still = std::collections::HashSet::new();
        for r in &now_reports {
            let Report::Problem {
                name,
                reason,
                message,
                ..
            } = r
            else {
                continue;
            };
            tracing::warn!(bgppeer = %name, reason = %reason, "BGPPeer runs no session on this node: {message}");
            let key = (name.clone(), message.clone());
            still.insert(key.clone());
            if warned.contains(&key) {
                continue;
            }
            let Some(obj) = peer_objs.iter().find(|p| p.name_any() == *name) else {
                continue;
            };
            let ev = Event {
                type_: EventType::Warning,
                reason: (*reason).into(),
                note: Some(format!("edge {}: {message}", node.node_name)),
                action: "ConfigurePeer".into(),
                secondary: None,
            };
            let (recorder, obj_ref) = (recorder.clone(), obj.object_ref(&()));
            tokio::spawn(async move {
                if let Err(e) = recorder.publish(&ev, &obj_ref).await {
                    tracing::warn!(error = %e, reason = %ev.reason, "writing Event failed");
                }
            });
            warned.insert(key);
        }
        // A problem that went away and comes back is worth a new Event.
        warned.retain(|k| still.contains(k));
        *names.lock().unwrap_or_else(|p| p.into_inner()) = now_reports;
        if let Err(e) = speaker.set_peers(sel.peers).await {
            tracing::warn!(error = %e, "applying BGP peers");
        }
        if [&t1, &t2, &t3, &t4].iter().all(|t| t.is_finished()) {
            status_task.abort();
            return Ok(());
        }
    }
}

async fn status_loop(
    client: Client,
    node: String,
    speaker: std::sync::Weak<Speaker>,
    names: Arc<Mutex<Vec<Report>>>,
) {
    let api: Api<BGPPeer> = Api::all(client);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut written: HashMap<String, ringlb_crds::NodeSession> = HashMap::new();
    loop {
        tick.tick().await;
        let list = names.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for report in list {
            let name = report.name().to_string();
            let (entry, reason) = match &report {
                Report::Session { addr, .. } => {
                    // the strong reference lives only for this read, never across an await
                    let Some(sp) = speaker.upgrade() else {
                        return; // the agent is stopping
                    };
                    let Some(st) = sp.peer_status(*addr) else {
                        continue;
                    };
                    let entry = node_session(&node, &st.borrow());
                    drop((st, sp));
                    (entry, None)
                }
                Report::Problem {
                    state,
                    condition,
                    reason,
                    message,
                    ..
                } => (
                    problem_entry(&node, state, message.clone()),
                    Some((*condition, *reason)),
                ),
            };
            if written.get(&name) == Some(&entry) {
                continue;
            }
            match write_status(&api, &name, entry.clone(), reason).await {
                Ok(()) => {
                    written.insert(name, entry);
                }
                Err(e) => tracing::debug!(bgppeer = %name, error = %e, "BGPPeer status"),
            }
        }
    }
}

/// Read-modify-replace with the object's resourceVersion: other nodes write their own
/// entries of the same list, so a conflict (409) means "read again and retry".
async fn write_status(
    api: &Api<BGPPeer>,
    name: &str,
    entry: ringlb_crds::NodeSession,
    reason: Option<(&str, &str)>,
) -> Result<(), Error> {
    for _ in 0..5 {
        let Some(mut obj) = api
            .get_opt(name)
            .await
            .map_err(api_err("reading BGPPeer"))?
        else {
            return Ok(());
        };
        let mut status = obj.status.clone().unwrap_or_default();
        let changed = merge_node_session(&mut status, entry.clone());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let conditions =
            peer_conditions(&status.nodes, reason.as_slice(), &status.conditions, &now);
        // Conditions other writers set are kept.
        let mut merged: Vec<_> = status
            .conditions
            .iter()
            .filter(|c| !conditions.iter().any(|n| n.type_ == c.type_))
            .cloned()
            .collect();
        merged.extend(conditions);
        if !changed && merged == status.conditions {
            return Ok(());
        }
        status.conditions = merged;
        obj.status = Some(status);
        match api.replace_status(name, &PostParams::default(), &obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(api_err("writing BGPPeer status")(e)),
        }
    }
    Ok(())
}
