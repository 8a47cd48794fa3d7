//! Writes through the API simulator with kube-rs: status subresource isolation,
//! merge/JSON/strategic patches, and server-side apply (field ownership, removal of
//! dropped fields, conflicts between managers).

mod common;
use common::{code, sim, svc};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn status_subresource_is_isolated() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let ingress =
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}}});
    api.create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    // A main-resource patch cannot write status...
    let after = api
        .patch("web", &PatchParams::default(), &Patch::Merge(&ingress))
        .await
        .unwrap();
    assert!(
        after
            .status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .is_none()
    );
    // ...the status subresource can, and it cannot change the spec.
    let mut both = ingress.clone();
    both["spec"] = json!({"type": "ClusterIP"});
    let after = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );
    assert_eq!(
        after
            .status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()[0]
            .ip
            .as_deref(),
        Some("192.0.2.1")
    );
    // A PUT of the main resource keeps the stored status.
    let mut replaced = after.clone();
    replaced.status = None;
    let kept = api
        .replace("web", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert!(
        kept.status
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .is_some()
    );
    // Server-side apply on status, as the controller writes it.
    let ssa = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"conditions": [{"type": "ringlb.io/IPAllocated", "status": "True", "reason": "Allocated", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let pp = PatchParams::apply("ringlb-controller").force();
    let applied = api
        .patch_status("web", &pp, &Patch::Apply(&ssa))
        .await
        .unwrap();
    let st = applied.status.unwrap();
    assert_eq!(st.conditions.unwrap()[0].type_, "ringlb.io/IPAllocated");
    assert!(
        st.load_balancer.unwrap().ingress.is_some(),
        "apply merges, it does not wipe other status fields"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn patch_flavours() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().await);
    let pp = PatchParams::apply("test-manager");
    // Apply creates...
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    api.patch("c", &pp, &Patch::Apply(&cm)).await.unwrap();
    // ...and merges what another manager applies...
    let cm2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"b": "2"}});
    let got = api
        .patch(
            "c",
            &PatchParams::apply("other-manager"),
            &Patch::Apply(&cm2),
        )
        .await
        .unwrap();
    assert_eq!(got.data.unwrap().len(), 2);
    // ...while a manager that drops a key it applied before removes it.
    let cm3 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"z": "9"}});
    let got = api.patch("c", &pp, &Patch::Apply(&cm3)).await.unwrap();
    let keys: Vec<String> = got.data.unwrap().into_keys().collect();
    assert_eq!(keys, ["b", "z"]);
    let cm4 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "z": "9"}});
    api.patch("c", &pp, &Patch::Apply(&cm4)).await.unwrap();
    // JSON patch, with a failing test op giving 422 and changing nothing.
    let ops: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/a", "value": "x"}]))
            .unwrap();
    let got = api
        .patch("c", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(got.data.as_ref().unwrap()["a"], "x");
    let bad: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/a", "value": "nope"}]))
            .unwrap();
    assert_eq!(
        code(
            api.patch("c", &PatchParams::default(), &Patch::<()>::Json(bad))
                .await
                .unwrap_err()
        ),
        422
    );
    // Strategic merge: a null deletes a key.
    let got = api
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {"b": null}})),
        )
        .await
        .unwrap();
    assert_eq!(got.data.unwrap().keys().collect::<Vec<_>>(), ["a", "z"]);
    // Apply needs a field manager.
    let err = api
        .patch("c", &PatchParams::default(), &Patch::Apply(&cm2))
        .await;
    assert!(err.is_err());
    sim.shutdown().await;
}

#[tokio::test]
async fn server_side_apply_tracks_what_each_manager_owns() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    api.create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    let pp = PatchParams::apply("ringlb-controller").force();
    let cond = json!({"type": "ringlb.io/IPAllocated", "status": "True", "reason": "Allocated", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let with_ip = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7", "ipMode": "VIP"}]}, "conditions": [cond]}});
    let first = api
        .patch_status("web", &pp, &Patch::Apply(&with_ip))
        .await
        .unwrap();
    assert!(
        first
            .metadata
            .managed_fields
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.manager.as_deref() == Some("ringlb-controller"))
    );
    // The same apply again is a no-op: no new resourceVersion, no watch event.
    let again = api
        .patch_status("web", &pp, &Patch::Apply(&with_ip))
        .await
        .unwrap();
    assert_eq!(
        first.metadata.resource_version,
        again.metadata.resource_version
    );
    // Another writer's condition survives the controller's applies.
    let other = json!({"status": {"conditions": [{"type": "example.com/Other", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status("web", &PatchParams::default(), &Patch::Strategic(&other))
        .await
        .unwrap();
    // Releasing: the controller applies its status without the ingress; it goes.
    let released = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"conditions": [{"type": "ringlb.io/IPAllocated", "status": "False", "reason": "NotOurs", "message": "", "lastTransitionTime": "2026-01-01T00:00:01Z"}]}});
    let after = api
        .patch_status("web", &pp, &Patch::Apply(&released))
        .await
        .unwrap();
    let st = after.status.unwrap();
    assert!(
        st.load_balancer
            .and_then(|l| l.ingress)
            .unwrap_or_default()
            .is_empty(),
        "ingress the manager dropped is removed"
    );
    let conds = st.conditions.unwrap();
    assert_eq!(conds.len(), 2, "{conds:?}");
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "ringlb.io/IPAllocated" && c.status == "False")
    );
    assert!(conds.iter().any(|c| c.type_ == "example.com/Other"));
    sim.shutdown().await;
}

#[tokio::test]
async fn apply_conflicts_between_managers_unless_forced() {
    let sim = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(sim.client().await);
    let cm = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"owner": v}});
    api.patch("c", &PatchParams::apply("a"), &Patch::Apply(cm("a")))
        .await
        .unwrap();
    // the same value from another manager is shared ownership, not a conflict
    api.patch("c", &PatchParams::apply("b"), &Patch::Apply(cm("a")))
        .await
        .unwrap();
    // a different value is a conflict...
    let err = api
        .patch("c", &PatchParams::apply("c"), &Patch::Apply(cm("c")))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.starts_with("Apply failed with") && s.message.contains(".data.owner"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    // ...unless forced
    let got = api
        .patch(
            "c",
            &PatchParams::apply("c").force(),
            &Patch::Apply(cm("c")),
        )
        .await
        .unwrap();
    assert_eq!(got.data.unwrap()["owner"], "c");
    // "a" drops the field: "b" and "c" still own it, so it stays
    let empty = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"other": "x"}});
    let got = api
        .patch("c", &PatchParams::apply("a"), &Patch::Apply(empty))
        .await
        .unwrap();
    assert_eq!(got.data.unwrap()["owner"], "c");
    sim.shutdown().await;
}

#[tokio::test]
async fn dry_run_checks_and_defaults_but_stores_nothing() {
    let sim = sim().await;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let rv = sim.resource_version();
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let dry = api.create(&pp, &svc("web")).await.unwrap();
    let ip = dry.spec.unwrap().cluster_ip.unwrap();
    assert!(api.get_opt("web").await.unwrap().is_none(), "not stored");
    assert_eq!(sim.resource_version(), rv, "no resourceVersion used");
    // the allocation was not consumed either
    let real = api
        .create(&PostParams::default(), &svc("web"))
        .await
        .unwrap();
    assert_eq!(real.spec.unwrap().cluster_ip.unwrap(), ip);
    // invalid objects fail the dry run the same way
    let mut bad = svc("bad");
    bad.spec.as_mut().unwrap().ports = Some(vec![]);
    assert_eq!(code(api.create(&pp, &bad).await.unwrap_err()), 422);
    sim.shutdown().await;
}
