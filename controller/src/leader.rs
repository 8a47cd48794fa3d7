//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Only the holder of the Lease writes anything. Each replica keeps the Lease record
//! it last saw and *when it saw it change* on its own monotonic clock (as client-go
//! does), so clock skew between nodes does not matter: a Lease is taken over only
//! after its record has not changed for a whole `leaseDurationSeconds`.
//! Every write is a `replace` carrying the `resourceVersion` that was read, so two
//! candidates racing for an expired Lease cannot both win: the API server answers
//! the second with 409 Conflict.
//!
//! The holder renews every `retry_period`; if it cannot renew for `renew_deadline`
//! (shorter than the lease duration), or it sees another holder, it has lost and
//! the program exits, so it stops writing before anyone else may take over.
//!
//! On shutdown the holder releases the Lease as client-go's `ReleaseOnCancel` does
//! (no holder, `leaseDurationSeconds: 1`), so a standby takes it on its next round.
//!
//! A release can fail when the program's credentials are gone, as on `helm
//! uninstall`, which deletes the ServiceAccount and RBAC while the pod is still
//! running. So the Lease is owned (`ownerReferences`) by the replica's
//! ServiceAccount (`--service-account`): the garbage collector deletes it with the
//! ServiceAccount, and a candidate whose ServiceAccount has the owner's name but
//! another UID knows the Lease was written by a previous installation, whose
//! tokens the API server no longer accepts, and takes it at once instead of
//! waiting for it to expire.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use ringlb_ops::Heartbeat;

/// Leader election settings (from flags).
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// This replica's ServiceAccount (in `namespace`), the Lease's owner; `None`
    /// (outside a pod) leaves the Lease without an owner.
    pub service_account: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader election: bad settings: {0}")]
    Config(String),
    #[error("leader election: lost the Lease {namespace}/{name}: {reason}")]
    Lost {
        namespace: String,
        name: String,
        reason: String,
    },
}

impl LeaderConfig {
    pub fn validate(&self) -> Result<(), Error> {
        if self.renew_deadline >= self.lease_duration {
            return Err(Error::Config(format!(
                "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?})",
                self.renew_deadline, self.lease_duration
            )));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(Error::Config(format!(
                "--retry-period ({:?}) must be shorter than --renew-deadline ({:?})",
                self.retry_period, self.renew_deadline
            )));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(Error::Config("--lease-duration must be at least 1s".into()));
        }
        Ok(())
    }
}

/// What to do with the Lease as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder stopped renewing: take it.
    TakeOver,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and renews.
    Wait,
}

/// The pure rule. `unchanged_for` is how long the record has looked the same to us;
/// `previous_install` says the Lease was written under credentials that no longer
/// exist (see [`written_by_previous_install`]).
pub fn decide(
    me: &str,
    holder: Option<&str>,
    unchanged_for: Duration,
    lease_duration: Duration,
    previous_install: bool,
) -> Decision {
    match holder {
        None | Some("") => Decision::TakeOver,
        Some(h) if h == me => Decision::Renew,
        Some(_) if previous_install => Decision::TakeOver,
        Some(_) if unchanged_for >= lease_duration => Decision::TakeOver,
        Some(_) => Decision::Wait,
    }
}

/// This replica's ServiceAccount, as read from the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub uid: String,
}

impl Owner {
    fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ServiceAccount".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            ..Default::default()
        }
    }
}

/// True when the Lease is owned by a ServiceAccount of our ServiceAccount's name but
/// another UID: it was deleted and created again (an uninstall and a new install),
/// so the holder's tokens are no longer accepted and it cannot write any more.
pub fn written_by_previous_install(owners: &[OwnerReference], me: &Owner) -> bool {
    owners.iter().any(|o| {
        o.kind == "ServiceAccount" && o.api_version == "v1" && o.name == me.name && o.uid != me.uid
    })
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    /// Fingerprint of the record last seen and when it last changed.
    seen: Option<(String, Instant)>,
    /// This replica's ServiceAccount, once read.
    owner: Option<Owner>,
    owner_looked_up: bool,
}

impl Elector {
    pub fn new(client: kube::Client, cfg: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            seen: None,
            owner: None,
            owner_looked_up: false,
        }
    }

    /// Reads this replica's ServiceAccount (once). Without it the Lease has no owner
    /// and a reinstall waits for an unreleased Lease to expire; that is logged.
    async fn look_up_owner(&mut self) {
        if self.owner_looked_up {
            return;
        }
        self.owner_looked_up = true;
        let Some(name) = &self.cfg.service_account else {
            return;
        };
        let api: Api<ServiceAccount> =
            Api::namespaced(self.api.clone().into_client(), &self.cfg.namespace);
        match api.get(name).await {
            Ok(sa) => {
                if let Some(uid) = sa.metadata.uid {
                    self.owner = Some(Owner {
                        name: name.clone(),
                        uid,
                    });
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                service_account = %format!("{}/{name}", self.cfg.namespace),
                "reading this replica's ServiceAccount failed: the Lease gets no owner, so \
                 after a reinstall an unreleased Lease is taken over only once it expires"
            ),
        }
    }

    fn owner_references(&self) -> Option<Vec<OwnerReference>> {
        self.owner.as_ref().map(|o| vec![o.reference()])
    }

    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.cfg.lease_duration.as_secs().max(1) as i32),
            acquire_time: acquire,
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: read, decide, write. `Ok(true)` when we hold the Lease afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        self.look_up_owner().await;
        let current = match self.api.get_opt(&self.cfg.name).await? {
            Some(l) => l,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        owner_references: self.owner_references(),
                        ..Default::default()
                    },
                    spec: Some(self.spec(Some(MicroTime(Timestamp::now())), 0)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = current.spec.clone().unwrap_or_default();
        let fingerprint = format!(
            "{:?}|{:?}|{:?}",
            spec.holder_identity,
            spec.renew_time.as_ref().map(|t| t.0.to_string()),
            current.metadata.resource_version
        );
        let now = Instant::now();
        let changed_at = match &self.seen {
            Some((f, at)) if *f == fingerprint => *at,
            _ => {
                self.seen = Some((fingerprint, now));
                now
            }
        };
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.cfg.lease_duration);
        let previous_install = self.owner.as_ref().is_some_and(|me| {
            written_by_previous_install(
                current
                    .metadata
                    .owner_references
                    .as_deref()
                    .unwrap_or_default(),
                me,
            )
        });
        let decision = decide(
            &self.cfg.identity,
            spec.holder_identity.as_deref(),
            now - changed_at,
            duration,
            previous_install,
        );
        if decision == Decision::TakeOver && previous_install {
            tracing::info!(
                holder = ?spec.holder_identity,
                "the Lease was written by a previous installation (its ServiceAccount \
                 is gone): taking it over without waiting for it to expire"
            );
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let new_spec = match decision {
            Decision::Wait => return Ok(false),
            Decision::Renew => {
                let mut s = self.spec(spec.acquire_time.clone(), transitions);
                s.acquire_time = spec.acquire_time;
                s
            }
            Decision::TakeOver => self.spec(Some(MicroTime(Timestamp::now())), transitions + 1),
        };
        let mut lease = current;
        lease.spec = Some(new_spec);
        if let Some(refs) = self.owner_references() {
            // Ours only: a previous installation's ServiceAccount is gone.
            lease.metadata.owner_references = Some(refs);
        }
        // `lease.metadata.resourceVersion` is the one we read: a precondition.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blocks until this replica holds the Lease. Beats `heartbeat` after every round
    /// that got an answer or an error: only a request that hangs silences it.
    pub async fn acquire(&mut self, heartbeat: &Heartbeat) {
        loop {
            let round = self.try_acquire_or_renew().await;
            heartbeat.beat();
            match round {
                Ok(true) => {
                    tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "became leader");
                    return;
                }
                Ok(false) => tracing::debug!("Lease held by another replica; waiting"),
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: reading/writing the Lease failed")
                }
            }
            tokio::time::sleep(self.cfg.retry_period).await;
        }
    }

    /// Renews until the Lease is lost; returns why. Beats `heartbeat` after every
    /// renewal attempt.
    pub async fn hold(&mut self, heartbeat: &Heartbeat) -> Error {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            // A request that hangs must not outlive the renew deadline: past it a
            // standby may hold the Lease while this replica still writes.
            let budget = self.cfg.renew_deadline.saturating_sub(last_ok.elapsed());
            let round = tokio::time::timeout(budget, self.try_acquire_or_renew()).await;
            heartbeat.beat();
            let reason = match round {
                Ok(Ok(true)) => {
                    last_ok = Instant::now();
                    continue;
                }
                Ok(Ok(false)) => "another replica holds it".to_string(),
                Ok(Err(e)) => format!("renew failed: {e}"),
                Err(_) => format!(
                    "no answer within the renew deadline ({:?})",
                    self.cfg.renew_deadline
                ),
            };
            if reason.starts_with("another") || last_ok.elapsed() >= self.cfg.renew_deadline {
                return Error::Lost {
                    namespace: self.cfg.namespace.clone(),
                    name: self.cfg.name.clone(),
                    reason,
                };
            }
            tracing::warn!(%reason, "leader election: could not renew; retrying until the renew deadline");
        }
    }

    /// Gives the Lease up (on shutdown) so a standby takes over at once: no holder
    /// and a lease duration of 1 s, as client-go's `ReleaseOnCancel` writes it.
    pub async fn release(&mut self) {
        let mut lease = match self.api.get_opt(&self.cfg.name).await {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "releasing the Lease: reading it failed");
                return;
            }
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            tracing::info!(holder = ?spec.holder_identity, "not releasing the Lease: not ours");
            return;
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.cfg.name, "released the Lease"),
            Err(e) => tracing::warn!(error = %e, "releasing the Lease failed"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let d = Duration::from_secs(15);
        let z = Duration::ZERO;
        assert_eq!(decide("me", None, z, d, false), Decision::TakeOver);
        assert_eq!(decide("me", Some(""), z, d, false), Decision::TakeOver);
        let long = Duration::from_secs(100);
        assert_eq!(decide("me", Some("me"), long, d, false), Decision::Renew);
        let s14 = Duration::from_secs(14);
        assert_eq!(decide("me", Some("you"), s14, d, false), Decision::Wait);
        let s15 = Duration::from_secs(15);
        assert_eq!(decide("me", Some("you"), s15, d, false), Decision::TakeOver);
        // A holder from a previous installation is not waited for.
        assert_eq!(decide("me", Some("you"), z, d, true), Decision::TakeOver);
        assert_eq!(decide("me", Some("me"), z, d, true), Decision::Renew);
    }

    #[test]
    fn a_previous_install_is_told_by_the_service_account_uid() {
        let me = Owner {
            name: "ringlb-controller".into(),
            uid: "new".into(),
        };
        let sa = |name: &str, uid: &str| OwnerReference {
            api_version: "v1".into(),
            kind: "ServiceAccount".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        };
        assert!(!written_by_previous_install(&[], &me), "no owner: unknown");
        assert!(!written_by_previous_install(
            &[sa("ringlb-controller", "new")],
            &me
        ));
        assert!(written_by_previous_install(
            &[sa("ringlb-controller", "old")],
            &me
        ));
        // Another ServiceAccount (a second controller, a renamed one) says nothing.
        assert!(!written_by_previous_install(&[sa("other", "old")], &me));
        let mut dep = sa("ringlb-controller", "old");
        dep.kind = "Deployment".into();
        dep.api_version = "apps/v1".into();
        assert!(!written_by_previous_install(&[dep], &me));
    }

    /// The flags' defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub(crate) fn config() -> LeaderConfig {
        LeaderConfig {
            namespace: "ns".into(),
            name: "l".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            service_account: None,
        }
    }

    #[test]
    fn config_checks_ordering() {
        let mut c = config();
        assert!(c.validate().is_ok());
        c.renew_deadline = Duration::from_secs(15);
        assert!(c.validate().is_err());
        c.renew_deadline = Duration::from_secs(10);
        c.retry_period = Duration::from_secs(10);
        assert!(c.validate().is_err());
    }
}
