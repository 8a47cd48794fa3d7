//! The generated CRDs: no drift from the types, valid k8s-openapi CRDs, structural
//! schemas, and the schema's rules refuse bad objects with a message naming the field.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use ringlb_crds::{admission, generate};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Fails when a checked-in generated file differs from what the types generate.
/// `RINGLB_BLESS=1 cargo test -p ringlb-crds` (or `make crds`) rewrites them.
#[test]
fn generated_files_match_the_types() {
    let bless = std::env::var_os("RINGLB_BLESS").is_some();
    let mut stale = Vec::new();
    for (rel, body) in generate::files().unwrap() {
        let path = repo_root().join(&rel);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != body {
            if bless {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &body).unwrap();
            } else {
                stale.push(rel);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "generated files drifted from the types (run `make crds`): {stale:?}"
    );
}

fn checked_in_crds() -> Vec<CustomResourceDefinition> {
    let mut out = Vec::new();
    for dir in ["crds", "charts/ringlb/crds"] {
        let mut names: Vec<_> = std::fs::read_dir(repo_root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{dir} should hold the three CRDs");
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap();
            let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap_or_else(|e| {
                panic!("{} is not a CustomResourceDefinition: {e}", p.display())
            });
            out.push(crd);
        }
    }
    out
}

#[test]
fn yaml_deserializes_as_crds_with_status_and_columns() {
    for crd in checked_in_crds() {
        let name = crd.metadata.name.clone().unwrap();
        assert_eq!(crd.spec.group, "ringlb.io", "{name}");
        assert_eq!(crd.spec.scope, "Cluster", "{name}");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.served && v.storage, "{name}");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{name}: status subresource"
        );
        assert!(
            v.additional_printer_columns
                .as_ref()
                .is_some_and(|c| !c.is_empty()),
            "{name}: printer columns"
        );
    }
}

/// A structural schema (apiextensions.k8s.io/v1 requires one): every node has a
/// type, and no JSON-Schema constructs the API server refuses.
#[test]
fn schemas_are_structural() {
    fn walk(v: &Value, path: &str, bad: &mut Vec<String>) {
        let obj = v.as_object().unwrap();
        let typed = obj.contains_key("type")
            || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
            || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        if !typed {
            bad.push(format!("{path}: no type"));
        }
        for forbidden in [
            "$ref",
            "additionalItems",
            "patternProperties",
            "dependencies",
            "definitions",
            "$schema",
        ] {
            if obj.contains_key(forbidden) {
                bad.push(format!("{path}: has {forbidden}"));
            }
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (k, child) in props {
                walk(child, &format!("{path}.{k}"), bad);
            }
        }
        if let Some(items) = obj.get("items") {
            walk(items, &format!("{path}[*]"), bad);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            for alt in obj.get(key).and_then(Value::as_array).into_iter().flatten() {
                // Inside these, types are not allowed to differ from the parent; kube
                // emits them only for enums and int-or-string, never typeless.
                if alt.get("properties").is_some() {
                    bad.push(format!("{path}.{key}: declares properties"));
                }
            }
        }
    }
    for crd in generate::crds() {
        let schema = admission::schema_of(&crd).unwrap();
        let mut bad = Vec::new();
        walk(&schema, "", &mut bad);
        assert!(bad.is_empty(), "{:?}: {bad:?}", crd.metadata.name);
    }
}

fn refusals(crd: &CustomResourceDefinition, object: Value) -> Vec<String> {
    admission::validate(&admission::schema_of(crd).unwrap(), &object)
}

fn pool(spec: Value) -> Value {
    json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"}, "spec": spec})
}

fn peer(spec: Value) -> Value {
    json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer", "metadata": {"name": "tor"}, "spec": spec})
}

/// Asserts that the schema of `crd` accepts each spec, made an object by `object`.
fn assert_each_accepted(
    crd: &CustomResourceDefinition,
    object: impl Fn(Value) -> Value,
    specs: &[Value],
) {
    for spec in specs {
        let errs = refusals(crd, object(spec.clone()));
        assert!(errs.is_empty(), "{spec} refused: {errs:?}");
    }
}

/// Asserts that the schema of `crd` refuses each `(spec, field, words)`, the spec made
/// an object by `object`, naming `field` with `words`.
fn assert_each_refused(
    crd: &CustomResourceDefinition,
    object: impl Fn(Value) -> Value,
    cases: &[(Value, &str, &str)],
) {
    for (spec, field, words) in cases {
        let errors = refusals(crd, object(spec.clone()));
        assert!(
            errors
                .iter()
                .any(|e| e.contains(field) && e.contains(words)),
            "expected a refusal naming {field:?} with {words:?}, got {errors:?}"
        );
    }
}

#[test]
fn ippool_rules() {
    let crd = ringlb_crds::generate::crds().remove(0);
    assert_eq!(crd.spec.names.kind, "IPPool");
    assert_each_accepted(
        &crd,
        pool,
        &[
            json!({"cidrs": ["192.0.2.0/24", "2001:db8::/64"]}),
            json!({"ranges": [{"start": "192.0.2.10", "end": "192.0.2.20"}]}),
            json!({"ranges": [{"start": "9.255.255.255", "end": "10.0.0.0"}]}),
            json!({"ranges": [{"start": "2001:db8::1", "end": "2001:db8::9"}], "avoidBuggyIPs": true, "priority": -3}),
            // A host address as a /32 or /128, and the whole space, have no host bits.
            json!({"cidrs": ["10.9.1.5/32"]}),
            json!({"cidrs": ["2001:db8::1/128"]}),
            json!({"cidrs": ["0.0.0.0/0"]}),
        ],
    );
    assert_each_refused(
        &crd,
        pool,
        &[
            (
                json!({"cidrs": ["10.0.0.0/33"]}),
                "spec.cidrs",
                "must be a CIDR",
            ),
            (json!({"cidrs": ["banana"]}), "spec.cidrs", "must be a CIDR"),
            (
                json!({"ranges": [{"start": "10.0.0.9", "end": "10.0.0.1"}]}),
                "spec.ranges[0]",
                "start must not be after end",
            ),
            (
                json!({"ranges": [{"start": "10.0.1.0", "end": "10.0.0.255"}]}),
                "spec.ranges[0]",
                "start must not be after end",
            ),
            (
                json!({"ranges": [{"start": "10.0.0.1", "end": "2001:db8::1"}]}),
                "spec.ranges[0]",
                "same address family",
            ),
            (
                json!({"ranges": [{"start": "10.0.0.300", "end": "10.0.0.1"}]}),
                "spec.ranges[0].start",
                "must be an IP address",
            ),
            (json!({}), "spec", "at least one entry"),
            // Host bits set: refused, naming the entry and its network (not widened).
            (
                json!({"cidrs": ["192.0.2.0/24", "10.9.1.5/24"]}),
                "spec.cidrs[1]",
                "10.9.1.5/24 has host bits set; write its network address",
            ),
            (
                json!({"cidrs": ["2001:db8::1/64"]}),
                "spec.cidrs[0]",
                "2001:db8::1/64 has host bits set",
            ),
            (
                json!({"cidrs": ["10.0.0.0/8"], "priority": "high"}),
                "spec.priority",
                "integer",
            ),
        ],
    );
}

#[test]
fn bgppeer_rules() {
    let crd = ringlb_crds::generate::crds().remove(1);
    assert_eq!(crd.spec.names.kind, "BGPPeer");
    assert_each_accepted(
        &crd,
        peer,
        &[
            json!({"peerAddress": "10.0.0.1", "peerASN": 65000, "myASN": 4294967295u32, "holdTime": 3, "keepaliveTime": 1}),
            json!({"peerAddress": "fd00::1", "peerASN": 1, "myASN": 2, "holdTime": 0, "sourceAddress": "fd00::2"}),
        ],
    );
    assert_each_refused(
        &crd,
        peer,
        &[
            (
                json!({"peerAddress": "10.0.0.1", "peerASN": 0, "myASN": 65001}),
                "spec.peerASN",
                "greater than or equal to 1",
            ),
            (
                json!({"peerAddress": "10.0.0.1", "peerASN": 4294967296u64, "myASN": 65001}),
                "spec.peerASN",
                "less than or equal to 4294967295",
            ),
            (
                json!({"peerAddress": "10.0.0.1", "peerASN": 1, "myASN": 2, "holdTime": 2}),
                "spec.holdTime",
                "0 or at least 3",
            ),
            (
                json!({"peerAddress": "tor-1", "peerASN": 1, "myASN": 2}),
                "spec.peerAddress",
                "IPv4 or IPv6",
            ),
            (
                json!({"peerAddress": "10.0.0.1", "peerASN": 1, "myASN": 2, "holdTime": 9, "keepaliveTime": 9}),
                "spec",
                "keepaliveTime must be less than holdTime",
            ),
            (
                json!({"peerAddress": "10.0.0.1", "peerASN": 1}),
                "spec.myASN",
                "Required",
            ),
        ],
    );
}

#[test]
fn bgpadvertisement_rules() {
    let crd = ringlb_crds::generate::crds().remove(2);
    let adv = |spec: Value| json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPAdvertisement", "metadata": {"name": "a"}, "spec": spec});
    assert_each_accepted(
        &crd,
        adv,
        &[
            json!({"communities": ["65535:0", "0:1"], "largeCommunities": ["4294967295:0:1"], "localPref": 200, "aggregationLength": {"v4": 24, "v6": 64}}),
        ],
    );
    assert_each_refused(
        &crd,
        adv,
        &[
            (
                json!({"communities": ["65536:0"]}),
                "spec.communities",
                "0..65535",
            ),
            (
                json!({"communities": ["no-export"]}),
                "spec.communities",
                "ASN:VALUE",
            ),
            (
                json!({"largeCommunities": ["1:2"]}),
                "spec.largeCommunities",
                "GLOBAL:LOCAL1:LOCAL2",
            ),
            (
                json!({"aggregationLength": {"v4": 33}}),
                "spec.aggregationLength.v4",
                "less than or equal to 32",
            ),
        ],
    );
}

/// The Rust `validate()` agrees with the schema on the same bad objects.
#[test]
fn validate_agrees_with_the_schema() {
    let bad_pool: ringlb_crds::IPPool =
        serde_json::from_value(pool(json!({"cidrs": ["10.0.0.0/33"]}))).unwrap();
    assert!(
        bad_pool
            .spec
            .validate()
            .unwrap_err()
            .to_string()
            .contains("spec.cidrs[0]")
    );
    let host_bits: ringlb_crds::IPPool =
        serde_json::from_value(pool(json!({"cidrs": ["10.9.1.5/24"]}))).unwrap();
    let rust = host_bits.spec.validate().unwrap_err().to_string();
    assert!(
        rust.contains("spec.cidrs[0]: 10.9.1.5/24 has host bits set"),
        "{rust}"
    );
    let crd = ringlb_crds::generate::crds().remove(0);
    let schema = refusals(&crd, pool(json!({"cidrs": ["10.9.1.5/24"]})));
    // The schema's words, then validate() adds the network.
    let message = rust
        .split_once(": ")
        .unwrap()
        .1
        .split(" (the network is")
        .next()
        .unwrap();
    assert!(
        schema.iter().any(|e| e.contains("spec.cidrs[0]")),
        "{schema:?}"
    );
    assert!(
        schema.iter().any(|e| e.contains(message)),
        "the schema's words {schema:?} differ from validate()'s {message:?}"
    );
    let bad_peer: ringlb_crds::BGPPeer = serde_json::from_value(peer(
        json!({"peerAddress": "10.0.0.1", "peerASN": 0, "myASN": 1}),
    ))
    .unwrap();
    assert!(
        bad_peer
            .spec
            .validate()
            .unwrap_err()
            .to_string()
            .contains("spec.peerASN")
    );
}

/// The API server refuses a CRD whose CEL rules it estimates over the cost budget,
/// and it bounds a rule by the `maxItems`/`maxLength` of what the rule walks. So every
/// list and string a rule reads must carry those limits. (kube-cel's own estimator is
/// too coarse to check this: it does not flag an unbounded `self.all(...)` on a list.)
#[test]
fn cel_rules_read_only_bounded_lists_and_strings() {
    fn unbounded(v: &Value, path: &str, out: &mut Vec<String>) {
        match v.get("type").and_then(Value::as_str) {
            Some("array") if v.get("maxItems").is_none() => {
                out.push(format!("{path}: array without maxItems"))
            }
            Some("string") if v.get("maxLength").is_none() && v.get("enum").is_none() => {
                out.push(format!("{path}: string without maxLength"))
            }
            _ => {}
        }
        if let Some(items) = v.get("items") {
            unbounded(items, &format!("{path}[*]"), out);
        }
        for (k, child) in v
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            unbounded(child, &format!("{path}.{k}"), out);
        }
    }
    // The check can fail: an unbounded list of unbounded strings is caught twice.
    let mut out = Vec::new();
    unbounded(
        &json!({"type": "array", "items": {"type": "string"}}),
        "x",
        &mut out,
    );
    assert_eq!(out.len(), 2, "{out:?}");

    let mut checked = 0;
    for crd in generate::crds() {
        let schema = admission::schema_of(&crd).unwrap();
        let mut rules = Vec::new();
        collect_rules(&schema, &mut rules);
        assert!(!rules.is_empty());
        for (node, rule) in rules {
            let mut out = Vec::new();
            match node.get("properties").and_then(Value::as_object) {
                // An object's rule reads the fields it names.
                Some(props) => {
                    for (k, child) in props.iter().filter(|(k, _)| rule.contains(k.as_str())) {
                        unbounded(child, k, &mut out);
                    }
                }
                None => unbounded(&node, "self", &mut out),
            }
            assert!(
                out.is_empty(),
                "{:?}: rule {rule:?} reads unbounded data: {out:?}",
                crd.metadata.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} rules checked");
}

fn collect_rules(v: &Value, out: &mut Vec<(Value, String)>) {
    if let Some(rules) = v.get("x-kubernetes-validations").and_then(Value::as_array) {
        for r in rules {
            out.push((v.clone(), r["rule"].as_str().unwrap().to_string()));
        }
    }
    if let Some(props) = v.get("properties").and_then(Value::as_object) {
        for child in props.values() {
            collect_rules(child, out);
        }
    }
    if let Some(items) = v.get("items") {
        collect_rules(items, out);
    }
}
