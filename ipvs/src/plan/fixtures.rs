//! Pods, service keys and backends by number, for the tests of the planner and
//! of the apply path.

use std::net::IpAddr;

use super::Backend;
use crate::model::{Proto, ServiceKey};

/// Pod `n`: 10.1.0.n.
pub(crate) fn pod(n: u8) -> IpAddr {
    IpAddr::from([10, 1, 0, n])
}

/// VIP `n` (10.100.0.n), TCP `port`.
pub(crate) fn key(n: u8, port: u16) -> ServiceKey {
    ServiceKey {
        addr: IpAddr::from([10, 100, 0, n]),
        port,
        proto: Proto::Tcp,
    }
}

/// Backends from (pod number, weight) pairs.
pub(crate) fn backends(pods: &[(u8, u32)]) -> Vec<Backend> {
    pods.iter()
        .map(|&(p, weight)| Backend {
            addr: pod(p),
            weight,
        })
        .collect()
}
