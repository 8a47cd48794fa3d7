//! `ringlb-edge speaker --config FILE`: the speaker on its own, peers, policy and
//! prefixes from a YAML file, no Kubernetes. For running or debugging the speaker
//! against a router, and what the process-level tests (kill -9, SIGTERM drain) run.
//!
//! SIGTERM or SIGINT: graceful shutdown (GRACEFUL_SHUTDOWN re-announce, `drainSeconds`,
//! withdraw, Cease). A second signal during the drain skips the rest of the wait.
//! With `onSigterm: restart`, SIGTERM closes the sessions without NOTIFICATION and
//! withdraws nothing (graceful restart, `gr.rs`); SIGINT still drains.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use ringlb_ops::{Health, serve_ops};
use tokio::signal::unix::{SignalKind, signal};

use super::Error;
use super::bfd::hold::HoldStore;
use super::config::SpeakerFile;
use super::gr::OnSigterm;
use super::speaker::Speaker;

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}

pub async fn run(config: &Path, metrics_addr: SocketAddr) -> Result<(), Error> {
    run_with_hold(config, metrics_addr, None).await
}

/// [`run`], holding BFD sessions in `hold` across a restart (`bfd::hold`): the
/// sessions it offers are resumed, and a restart hands the Up ones to it.
pub async fn run_with_hold(
    config: &Path,
    metrics_addr: SocketAddr,
    hold: Option<Arc<dyn HoldStore>>,
) -> Result<(), Error> {
    let cfg = SpeakerFile::load(config)?;
    let registry = Arc::new(tokio::sync::Mutex::new(Registry::with_prefix("ringlb")));
    let health = Health::new();
    let speaker = {
        let mut r = registry.lock().await;
        Speaker::start(cfg.listen_port, &mut r)?
    };
    let (addr, _ops) = serve_ops(metrics_addr, registry.clone(), health.clone())
        .await
        .map_err(io("binding --metrics-addr"))?;
    let mut term = signal(SignalKind::terminate()).map_err(io("installing SIGTERM handler"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io("installing SIGINT handler"))?;
    speaker.set_restart_state(cfg.restart);
    if let Some(h) = hold {
        speaker.set_bfd_hold_store(h);
    }
    for p in cfg.peers {
        speaker.add_peer(p)?;
    }
    let n = cfg.prefixes.len();
    speaker.announce_many(cfg.prefixes);
    health.set_ready(true);
    tracing::info!(%addr, prefixes = n, peers = ?speaker.peers(), "speaker running");
    let restart = tokio::select! {
        _ = term.recv() => cfg.on_sigterm == OnSigterm::Restart,
        _ = int.recv() => false,
    };
    health.set_ready(false);
    if restart {
        let held = speaker.bfd_hold_or_admin_down().await;
        tracing::info!(
            held = held.len(),
            "BFD: Up sessions handed to the datapath, the rest sent AdminDown"
        );
        speaker.abandon();
        tracing::info!("SIGTERM: stopped for a restart; routes left to graceful restart");
        return Ok(());
    }
    tracing::info!("graceful shutdown");
    tokio::select! {
        _ = speaker.drain(cfg.drain) => {}
        _ = term.recv() => { tracing::warn!("second signal: cutting the drain short"); speaker.withdraw_all(); }
        _ = int.recv() => { tracing::warn!("second signal: cutting the drain short"); speaker.withdraw_all(); }
    }
    speaker.shutdown().await;
    tracing::info!("speaker stopped");
    Ok(())
}
