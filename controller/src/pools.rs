//! IPPools: turning objects into allocator pools, and writing pool status
//! (allocated/free per family; Ready, Invalid and Overlapping conditions).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use ringlb_crds::ippool::FamilyUsage;
use ringlb_crds::{Condition, IPPool, IPPoolStatus};

use crate::ipam::{Family, Ipam, Pool, PoolError};
use crate::metrics::Metrics;
use crate::status::FIELD_MANAGER;

/// Parses every IPPool; invalid ones are set aside with their errors.
pub fn pools_from<'a>(
    objs: impl IntoIterator<Item = &'a IPPool>,
) -> (Vec<Pool>, BTreeMap<String, Vec<PoolError>>) {
    let mut pools = Vec::new();
    let mut invalid = BTreeMap::new();
    for obj in objs {
        let name = obj.name_any();
        match Pool::from_spec(&name, &obj.spec) {
            Ok(p) => pools.push(p),
            Err(errs) => {
                invalid.insert(name, errs);
            }
        }
    }
    (pools, invalid)
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    old: Option<&IPPoolStatus>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" }.to_string();
    let prev = old.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
    Condition {
        type_: type_.into(),
        last_transition_time: match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        },
        status,
        reason: reason.into(),
        message,
        observed_generation: None,
    }
}

/// The status a pool should have now.
pub fn pool_status(ipam: &Ipam, name: &str, old: Option<&IPPoolStatus>, now: Time) -> IPPoolStatus {
    let mut st = IPPoolStatus::default();
    let invalid = ipam.invalid_pools().get(name);
    for u in ipam.usage(name) {
        let fu = FamilyUsage {
            allocated: u.allocated,
            free: u.free.to_string(),
        };
        match u.family {
            Family::V4 => st.ipv4 = Some(fu),
            Family::V6 => st.ipv6 = Some(fu),
        }
    }
    let overlaps = ipam.overlaps().remove(name).unwrap_or_default();
    st.conditions = vec![
        condition(
            "Ready",
            invalid.is_none(),
            if invalid.is_none() {
                "Valid"
            } else {
                "Invalid"
            },
            if invalid.is_none() {
                "pool is in use".into()
            } else {
                "pool is invalid; see the Invalid condition".into()
            },
            old,
            &now,
        ),
        match invalid {
            Some(errs) => condition(
                "Invalid",
                true,
                "InvalidSpec",
                errs.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                old,
                &now,
            ),
            None => condition("Invalid", false, "Valid", String::new(), old, &now),
        },
        if overlaps.is_empty() {
            condition("Overlapping", false, "NoOverlap", String::new(), old, &now)
        } else {
            condition(
                "Overlapping",
                true,
                "Overlaps",
                format!(
                    "overlaps pool(s) {}; an address is still given to one Service at most",
                    overlaps.join(", ")
                ),
                old,
                &now,
            )
        },
    ];
    st
}

/// Writes changed pool statuses and pool gauges, at most every `interval`, while
/// `dirty` is set. Runs only on the leader.
pub async fn status_writer(
    api: Api<IPPool>,
    store: Store<IPPool>,
    ipam: Arc<std::sync::Mutex<Ipam>>,
    metrics: Metrics,
    dirty: Arc<tokio::sync::Notify>,
    interval: Duration,
) {
    loop {
        dirty.notified().await;
        let objs = store.state();
        let now = Time(Timestamp::now());
        let wanted: Vec<(String, IPPoolStatus, bool)> = {
            let ipam = ipam.lock().unwrap_or_else(|e| e.into_inner());
            // Deleted pools must not leave stale gauges behind.
            metrics.pool_allocated.clear();
            metrics.pool_free.clear();
            objs.iter()
                .map(|o| {
                    let name = o.name_any();
                    let st = pool_status(&ipam, &name, o.status.as_ref(), now.clone());
                    let same = o.status.as_ref() == Some(&st);
                    for u in ipam.usage(&name) {
                        metrics.set_pool_usage(&name, u.family.label(), u.allocated, u.free);
                    }
                    (name, st, same)
                })
                .collect()
        };
        for (name, st, same) in wanted {
            if same {
                continue;
            }
            let patch = serde_json::json!({ "status": st });
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            if let Err(e) = api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
                tracing::warn!(pool = %name, error = %e, "writing IPPool status failed");
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_crds::IPPoolSpec;

    fn obj(name: &str, cidrs: &[&str]) -> IPPool {
        IPPool::new(
            name,
            IPPoolSpec {
                cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
                ranges: vec![],
                auto_assign: true,
                avoid_buggy_ips: false,
                service_selector: None,
                namespace_selector: None,
                priority: 0,
            },
        )
    }

    #[test]
    fn status_counts_and_conditions() {
        let objs = [
            obj("a", &["192.0.2.0/24", "2001:db8::/64"]),
            obj("b", &["192.0.2.128/25"]),
            obj("bad", &["x"]),
        ];
        let (pools, invalid) = pools_from(objs.iter());
        let mut ipam = Ipam::new();
        ipam.set_pools(pools, invalid);
        let now = Time(Timestamp::from_second(100).unwrap());
        let st = pool_status(&ipam, "a", None, now.clone());
        assert_eq!(
            st.ipv4,
            Some(FamilyUsage {
                allocated: 0,
                free: "256".into()
            })
        );
        assert_eq!(st.ipv6.as_ref().unwrap().free, "18446744073709551616");
        let c = |st: &IPPoolStatus, t: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .status
                .clone()
        };
        assert_eq!(c(&st, "Ready"), "True");
        assert_eq!(c(&st, "Overlapping"), "True");
        let bad = pool_status(&ipam, "bad", None, now.clone());
        assert_eq!(c(&bad, "Ready"), "False");
        assert!(
            bad.conditions[1].message.contains("spec.cidrs[0]"),
            "{:?}",
            bad.conditions
        );
        // Unchanged state: identical status (so no write), transition time kept.
        let later = Time(Timestamp::from_second(200).unwrap());
        assert_eq!(pool_status(&ipam, "a", Some(&st), later), st);
    }
}
