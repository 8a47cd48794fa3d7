//! Helpers shared by the simulator's kube-rs tests.
#![allow(dead_code)]

use k8s_openapi::api::core::v1::Service;
use ringlb_e2e::{SimHandle, SimOptions, Simulator};
use serde_json::json;

pub async fn sim() -> SimHandle {
    Simulator::start(SimOptions::default())
        .await
        .expect("simulator starts")
}

/// A LoadBalancer Service selecting `app: NAME`, port 80 -> 8080.
pub fn svc(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

/// The HTTP status of an API error; panics on any other error.
pub fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}
