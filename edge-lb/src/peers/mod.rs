//! Feed the speaker from the API and report back.
//!
//! ```text
//!  watch BGPPeer ──┐
//!  watch BGPAdv  ──┼─ reflector stores ─ dirty ─> resync: select_for_node (pure)
//!  watch IPPool  ──┤                                  + Secrets (MD5 passwords)
//!  watch this Node ┘                                  -> Speaker::set_peers
//!  status loop: every peer's watch value -> merge_node_session -> replace_status
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
use kube::{Api, Client, ResourceExt};
use ringlb_crds::{BGPAdvertisement, BGPPeer, IPPool, SecretKeyRef};
use tokio::sync::Notify;

use ringlb_bgp::Error;
pub mod select;

use crate::watch::watch_into;
use ringlb_bgp::Speaker;
use select::{merge_node_session, node_session, select_for_node};

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

type Passwords = HashMap<(String, String, String), String>;

/// The MD5 passwords the peers name. When a read fails (API timeout, 5xx), the
/// password read last time is kept: a passing API problem must not reset a working
/// session. Only a Secret that is gone, or lacks the key, drops the password.
async fn passwords(client: &Client, peers: &[Arc<BGPPeer>], previous: &Passwords) -> Passwords {
    let mut out = HashMap::new();
    for p in peers {
        let Some(r) = &p.spec.password_secret_ref else {
            continue;
        };
        let key = r.key.clone().unwrap_or_else(|| "password".into());
        let api: Api<Secret> = Api::namespaced(client.clone(), &r.namespace);
        match api.get_opt(&r.name).await {
            Ok(Some(s)) => {
                let v = s
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&key))
                    .and_then(|b| String::from_utf8(b.0.clone()).ok());
                if let Some(v) = v {
                    out.insert((r.namespace.clone(), r.name.clone(), key), v);
                }
            }
            Ok(None) => {
                tracing::warn!(secret = %r.name, namespace = %r.namespace, "BGP password Secret not found")
            }
            Err(e) => {
                tracing::warn!(error = %e, secret = %r.name, "reading BGP password Secret; keeping the last one read");
                let k = (r.namespace.clone(), r.name.clone(), key);
                if let Some(v) = previous.get(&k) {
                    out.insert(k, v.clone());
                }
            }
        }
    }
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
    let names: Arc<Mutex<Vec<(String, IpAddr)>>> = Arc::default();
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
            pw.get(&(r.namespace.clone(), r.name.clone(), key)).cloned()
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
        for (name, e) in &sel.errors {
            tracing::warn!(bgppeer = %name, error = %e, "BGPPeer skipped");
        }
        *names.lock().unwrap_or_else(|p| p.into_inner()) = sel
            .names
            .iter()
            .cloned()
            .zip(sel.peers.iter().map(|p| p.address))
            .collect();
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
    names: Arc<Mutex<Vec<(String, IpAddr)>>>,
) {
    let api: Api<BGPPeer> = Api::all(client);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut written: HashMap<String, ringlb_crds::NodeSession> = HashMap::new();
    loop {
        tick.tick().await;
        let list = names.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (name, addr) in list {
            // the strong reference lives only for this read, never across an await
            let Some(sp) = speaker.upgrade() else {
                return; // the agent is stopping
            };
            let Some(st) = sp.peer_status(addr) else {
                continue;
            };
            let entry = node_session(&node, &st.borrow());
            drop((st, sp));
            if written.get(&name) == Some(&entry) {
                continue;
            }
            match write_status(&api, &name, entry.clone()).await {
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
        if !merge_node_session(&mut status, entry.clone()) {
            return Ok(());
        }
        obj.status = Some(status);
        match api.replace_status(name, &PostParams::default(), &obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(api_err("writing BGPPeer status")(e)),
        }
    }
    Ok(())
}
