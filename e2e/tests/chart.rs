//! The Helm chart (`charts/ringlb`) with the real helm, against the real control plane
//! (etcd + kube-apiserver + kube-controller-manager, `ringlb_controlplane`):
//!
//! - the values table in the chart's README is the one `values.yaml`'s `# --`
//!   comments give, key for key (`RINGLB_BLESS=1` rewrites it);
//! - `helm lint` passes with the default and the example values;
//! - `values.schema.json` and the templates refuse bad values, naming the value;
//! - the rendered workloads agree with the RBAC files (ServiceAccounts, the Lease),
//!   carry the capabilities, mounts and grace period the programs need, and pass
//!   only flags the programs accept (each program parses them, `--help` last);
//!
//! What the API server accepts and stores: `chart_install.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

mod chart_util;

use chart_util::*;
use ringlb_e2e::controlplane::chart_dir;
use serde_json::Value;

const BEGIN: &str = "<!-- BEGIN GENERATED: values table (see e2e/tests/chart.rs) -->";
const END: &str = "<!-- END GENERATED: values table -->";
const BLESS: &str = "RINGLB_BLESS=1 cargo nextest run -p ringlb-e2e --test chart";

/// `values.yaml`'s keys that carry a `# --` description, as dotted paths, with the
/// description (continuation `#` lines joined). Keys under a described key are its
/// default's content, not keys of their own.
fn described_keys(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(rest) = trimmed.strip_prefix("# --") {
            pending = Some(rest.trim().to_string());
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('#') {
            if let Some(p) = pending.as_mut().filter(|_| !rest.starts_with('#')) {
                p.push(' ');
                p.push_str(rest.trim());
            }
            continue;
        }
        let desc = pending.take();
        if trimmed.is_empty() || trimmed.starts_with('-') {
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        stack.retain(|(i, _)| *i < indent);
        let parent: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        let path = if parent.is_empty() {
            key.trim_matches('"').to_string()
        } else {
            format!("{}.{}", parent.join("."), key.trim_matches('"'))
        };
        stack.push((indent, key.trim_matches('"').to_string()));
        let under_described = out
            .keys()
            .any(|k: &String| path.starts_with(&format!("{k}.")));
        if let (Some(d), false) = (desc, under_described) {
            out.insert(path, d);
        }
    }
    out
}

struct Row {
    key: String,
    kind: &'static str,
    default: String,
    description: String,
}

/// Walks the parsed values: a described key is a row (its whole value the default);
/// an undescribed non-empty map is descended into; anything else is a key without a
/// description, returned in the second list.
fn rows(
    value: &Value,
    prefix: &str,
    described: &BTreeMap<String, String>,
    out: &mut Vec<Row>,
    undescribed: &mut Vec<String>,
) {
    let Value::Object(map) = value else { return };
    for (k, v) in map {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(d) = described.get(&path) {
            let kind = match v {
                Value::Bool(_) => "bool",
                Value::Number(n) if n.is_i64() || n.is_u64() => "int",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "list",
                Value::Object(_) => "object",
                Value::Null => "null",
            };
            out.push(Row {
                key: path,
                kind,
                default: serde_json::to_string(v).expect("JSON"),
                description: d.clone(),
            });
        } else if matches!(v, Value::Object(m) if !m.is_empty()) {
            rows(v, &path, described, out, undescribed);
        } else {
            undescribed.push(path);
        }
    }
}

fn values_text() -> String {
    std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml")
}

/// The README table generated from values.yaml, and its rows' keys.
fn generated_table() -> (String, Vec<String>) {
    let text = values_text();
    let values: Value = serde_yaml::from_str(&text).expect("values.yaml parses");
    let described = described_keys(&text);
    let (mut table, mut undescribed) = (Vec::new(), Vec::new());
    rows(&values, "", &described, &mut table, &mut undescribed);
    assert!(
        undescribed.is_empty(),
        "values.yaml keys without a `# --` description: {undescribed:?}"
    );
    let known: BTreeSet<&String> = table.iter().map(|r| &r.key).collect();
    let stray: Vec<&String> = described.keys().filter(|k| !known.contains(k)).collect();
    assert!(stray.is_empty(), "descriptions of no value: {stray:?}");
    let esc = |s: &str| s.replace('|', "\\|");
    let mut md = String::from("| key | type | default | description |\n|---|---|---|---|\n");
    for r in &table {
        md.push_str(&format!(
            "| `{}` | {} | `{}` | {} |\n",
            r.key,
            r.kind,
            esc(&r.default),
            esc(&r.description)
        ));
    }
    (md, table.into_iter().map(|r| r.key).collect())
}

/// Every key of values.yaml (every leaf, or the described map holding it) is a row of
/// the README's table, every row is a key, and the rows say what the comments say.
#[test]
fn readme_values_table_matches_values_yaml() {
    let (table, keys) = generated_table();
    let readme_path = chart_dir().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("chart README");
    let (Some(b), Some(e)) = (readme.find(BEGIN), readme.find(END)) else {
        panic!("README.md has no {BEGIN} ... {END} block");
    };
    let current = &readme[b + BEGIN.len()..e];
    let want = format!("\n{table}");
    if current == want {
        return;
    }
    if std::env::var_os("RINGLB_BLESS").is_some_and(|v| v == "1") {
        let new = format!("{}{BEGIN}{want}{}", &readme[..b], &readme[e..]);
        std::fs::write(&readme_path, new).expect("write README");
        return;
    }
    let in_readme: BTreeSet<String> = current
        .lines()
        .filter_map(|l| {
            l.strip_prefix("| `")?
                .split_once('`')
                .map(|(k, _)| k.to_string())
        })
        .collect();
    let in_values: BTreeSet<String> = keys.into_iter().collect();
    let missing: Vec<_> = in_values.difference(&in_readme).collect();
    let extra: Vec<_> = in_readme.difference(&in_values).collect();
    panic!(
        "the README's values table disagrees with values.yaml: keys missing from the \
         table {missing:?}, rows of no key {extra:?}{}; regenerate: {BLESS}",
        if missing.is_empty() && extra.is_empty() {
            " (the keys agree; a type, default or description differs)"
        } else {
            ""
        }
    );
}

#[test]
fn described_keys_follow_nesting_and_skip_default_content() {
    let text = "# -- top\na: 1\n## section\nb:\n  # -- inner\n  # more\n  c: x\n  \
                # -- a map\n  d:\n    e: 1\n    # -- not a key of its own\n    f: 2\n";
    let got = described_keys(text);
    let want: BTreeMap<String, String> = [("a", "top"), ("b.c", "inner more"), ("b.d", "a map")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
}

// ---------------------------------------------------------------------------------
// helm lint, the schema, the rendered objects
// ---------------------------------------------------------------------------------

#[test]
fn helm_lint_passes_with_default_and_example_values() {
    let example = example_values();
    for extra in [vec![], vec!["--values", example.to_str().unwrap()]] {
        let mut cmd = helm(&std::env::temp_dir());
        cmd.args(["lint", "--strict"]).arg(chart_dir()).args(&extra);
        let (ok, out, err) = run(cmd, "");
        assert!(ok, "helm lint --strict {extra:?}:\n{out}{err}");
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

/// A bad value fails `helm template` (so `install` and `upgrade` too) before anything
/// reaches the cluster, and the message names the value.
#[test]
fn bad_values_are_refused_with_a_message_that_names_them() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "controller.replicas=-1"], "/controller/replicas"),
        (&["--set", "controller.replicas=two"], "want integer"),
        (
            &["--set", "controller.replicaz=3"],
            "'replicaz' not allowed",
        ),
        (&["--set", "edge.xdpMode=fast"], "/edge/xdpMode"),
        (&["--set", "logFormat=xml"], "/logFormat"),
        (&["--set", "edge.sourceV4=eth0"], "/edge/sourceV4"),
        (&["--set", "edge.ringSize=70000"], "/edge/ringSize"),
        (&["--set", "edge.pinDir=/tmp/x"], "/edge/pinDir"),
        (
            &["--set", "controller.leaderElection.leaseDuration=15"],
            "leaseDuration",
        ),
        (&["--set", "pools[0].name=x"], "missing property 'spec'"),
        (&["--set", "edge.interface="], "edge.interface is required"),
        (
            &["--set", "controller.leaderElection.enabled=false"],
            "needs controller.leaderElection.enabled",
        ),
        (
            &["--set", "edge.terminationGracePeriodSeconds=20"],
            "must be longer than edge.drainSeconds (30)",
        ),
        (
            &["--set", "edge.sourceV4=", "--set", "edge.sourceV6="],
            "edge.sourceV4 or edge.sourceV6 must be set",
        ),
        (
            &["--set", "metrics.serviceMonitor.enabled=true"],
            "no monitoring.coreos.com/v1 ServiceMonitor API",
        ),
        (
            &[
                "--set",
                "nodeAgent.excludeEdgeNodes=true",
                "--set",
                "nodeAgent.affinity.nodeAffinity.x=1",
            ],
            "set excludeEdgeNodes=false",
        ),
    ];
    for (args, want) in cases {
        match template(args) {
            Ok(_) => panic!("helm template {args:?} rendered; it should refuse"),
            Err(e) => assert!(
                e.contains(want),
                "helm template {args:?}: {want:?} not in:\n{e}"
            ),
        }
    }
    // The same keys with good values render.
    template_ok(&[
        "--set",
        "controller.replicas=3",
        "--set",
        "edge.sourceV4=10.0.0.5",
    ]);
    let with_monitor = template_ok(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
    ]);
    let objs = docs(&with_monitor);
    find(&objs, "ServiceMonitor", "ringlb");
    for c in ["controller", "edge", "node"] {
        find(&objs, "Service", &format!("ringlb-{c}-metrics"));
    }
}

/// The names of one kind rendered in `objs`.
fn names(objs: &[Value], kind: &str) -> BTreeSet<String> {
    objs.iter()
        .filter(|o| o["kind"] == kind)
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

fn args(workload: &Value) -> Vec<String> {
    container(workload)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn caps(workload: &Value) -> BTreeSet<String> {
    let sc = &container(workload)["securityContext"]["capabilities"];
    assert_eq!(
        sc["drop"],
        serde_json::json!(["ALL"]),
        "drops every capability first"
    );
    sc["add"]
        .as_array()
        .map(|a| a.iter().map(|c| c.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn env_value<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let env = container(workload)["env"].as_array().expect("env");
    &env.iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("env {name}"))["value"]
}

fn env_field_ref<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let env = container(workload)["env"].as_array().expect("env");
    &env.iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("env {name}"))["valueFrom"]["fieldRef"]["fieldPath"]
}

/// Each workload runs as the ServiceAccount its RBAC file grants, the controller's
/// Lease is the one its Role may update, and each pod has what its program needs.
#[test]
fn workloads_agree_with_the_rbac_and_carry_what_the_programs_need() {
    let objs = docs(&template_ok(&[]));
    objects_are_labelled_and_in_the_release_namespace(&objs);
    let ctrl = find(&objs, "Deployment", "ringlb-controller");
    let edge = find(&objs, "DaemonSet", "ringlb-edge");
    let node = find(&objs, "DaemonSet", "ringlb-node");
    workloads_run_as_their_service_accounts(&objs, ctrl, edge, node);
    controller_leader_elects_on_the_lease_its_role_names(&objs, ctrl);
    edge_has_host_network_capabilities_bpffs_and_grace(edge);
    node_agent_runs_on_every_node_with_the_bpf_capabilities(node);
    one_log_format_for_the_three_programs(&objs);
    bpffs_is_mounted_by_an_init_container(edge, node);
    turning_a_component_off_takes_its_rbac_with_it();
}

/// Every object carries the chart's name label; namespaced ones are in the release namespace.
fn objects_are_labelled_and_in_the_release_namespace(objs: &[Value]) {
    for o in objs {
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "ringlb",
            "{o}"
        );
        let namespaced = !matches!(
            o["kind"].as_str().unwrap(),
            "ClusterRole" | "ClusterRoleBinding" | "IPPool" | "BGPPeer" | "BGPAdvertisement"
        );
        if namespaced {
            assert_eq!(o["metadata"]["namespace"], NS, "{o}");
        }
    }
}

/// Each workload runs as its rendered ServiceAccount, has both probes, and selects its pods.
fn workloads_run_as_their_service_accounts(
    objs: &[Value],
    ctrl: &Value,
    edge: &Value,
    node: &Value,
) {
    let sas = names(objs, "ServiceAccount");
    for (w, sa) in [
        (ctrl, "ringlb-controller"),
        (edge, "ringlb-edge"),
        (node, "ringlb-node"),
    ] {
        assert_eq!(w["spec"]["template"]["spec"]["serviceAccountName"], sa);
        assert!(sas.contains(sa), "ServiceAccount {sa} rendered: {sas:?}");
        let probes = &container(w);
        assert_eq!(probes["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(probes["readinessProbe"]["httpGet"]["path"], "/readyz");
        let sel = &w["spec"]["selector"]["matchLabels"];
        for (k, v) in sel.as_object().unwrap() {
            assert_eq!(&w["spec"]["template"]["metadata"]["labels"][k], v);
        }
    }
}

/// Controller: 2 replicas, leader election on the Lease its Role names, restricted.
fn controller_leader_elects_on_the_lease_its_role_names(objs: &[Value], ctrl: &Value) {
    assert_eq!(ctrl["spec"]["replicas"], 2);
    let role = find(objs, "Role", "ringlb-controller-leader-election");
    let lease_names = role["rules"][1]["resourceNames"].clone();
    let a = args(ctrl);
    assert!(a.contains(&"--leader-elect=true".to_string()), "{a:?}");
    let lease = a
        .iter()
        .find_map(|x| x.strip_prefix("--lease-name="))
        .expect("--lease-name");
    assert_eq!(
        lease_names,
        serde_json::json!([lease]),
        "the Role covers the Lease"
    );
    assert_eq!(env_field_ref(ctrl, "POD_NAMESPACE"), "metadata.namespace");
    assert_eq!(env_field_ref(ctrl, "POD_NAME"), "metadata.name");
    assert_eq!(
        env_field_ref(ctrl, "POD_SERVICE_ACCOUNT"),
        "spec.serviceAccountName"
    );
    assert_eq!(
        role["rules"][2]["resourceNames"],
        serde_json::json!([ctrl["spec"]["template"]["spec"]["serviceAccountName"]]),
        "the Role lets the controller read its own ServiceAccount, the Lease's owner"
    );
    assert_eq!(
        ctrl["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );
    assert!(caps(ctrl).is_empty());
    assert_eq!(
        container(ctrl)["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container(ctrl)["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    let pdb = find(objs, "PodDisruptionBudget", "ringlb-controller");
    assert_eq!(pdb["spec"]["selector"], ctrl["spec"]["selector"]);
}

/// Edge: edge nodes, host network, its capabilities, bpffs, a grace period longer
/// than the BGP drain.
fn edge_has_host_network_capabilities_bpffs_and_grace(edge: &Value) {
    let pod = &edge["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["ringlb.io/edge"], "true");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let want: BTreeSet<String> = ["BPF", "NET_ADMIN", "SYS_ADMIN", "NET_BIND_SERVICE"]
        .map(String::from)
        .into();
    assert_eq!(caps(edge), want, "BGP on port 179 needs NET_BIND_SERVICE");
    assert_eq!(env_field_ref(edge, "NODE_NAME"), "spec.nodeName");
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/sys/fs/bpf");
    assert_eq!(
        container(edge)["volumeMounts"][0]["mountPath"],
        "/sys/fs/bpf"
    );
    let a = args(edge);
    let drain = a
        .iter()
        .find_map(|x| x.strip_prefix("--drain="))
        .expect("--drain");
    let drain: u64 = drain.trim_end_matches('s').parse().unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > drain);
    assert!(a.contains(&"--source-v4=$(HOST_IP)".to_string()), "{a:?}");
    assert_eq!(env_field_ref(edge, "HOST_IP"), "status.hostIP");
    assert_eq!(env_field_ref(edge, "RINGLB_HOST_IPS"), "status.hostIPs");
    let no_passive = docs(&template_ok(&["--set", "edge.bgpListenPort=0"]));
    let e = find(&no_passive, "DaemonSet", "ringlb-edge");
    assert!(
        !caps(e).contains("NET_BIND_SERVICE"),
        "no port below 1024, no bind cap"
    );
}

/// Node agent: every node (edges pass their own pods' packets to it), every taint
/// tolerated, the same BPF capabilities; with excludeEdgeNodes, workers only.
fn node_agent_runs_on_every_node_with_the_bpf_capabilities(node: &Value) {
    let pod = &node["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert!(pod["affinity"].is_null(), "{:?}", pod["affinity"]);
    let workers_only = docs(&template_ok(&["--set", "nodeAgent.excludeEdgeNodes=true"]));
    let w = find(&workers_only, "DaemonSet", "ringlb-node");
    let term = &w["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term["key"], "ringlb.io/edge");
    assert_eq!(term["operator"], "NotIn");
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    let want: BTreeSet<String> = ["BPF", "NET_ADMIN", "SYS_ADMIN"].map(String::from).into();
    assert_eq!(caps(node), want);
    assert_eq!(env_field_ref(node, "NODE_NAME"), "spec.nodeName");
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/sys/fs/bpf");
}

/// One log format for the three programs: plain text unless json is asked for.
fn one_log_format_for_the_three_programs(objs: &[Value]) {
    let json = docs(&template_ok(&["--set", "logFormat=json"]));
    for (kind, name) in [
        ("Deployment", "ringlb-controller"),
        ("DaemonSet", "ringlb-edge"),
        ("DaemonSet", "ringlb-node"),
    ] {
        assert_eq!(
            env_value(find(objs, kind, name), "RINGLB_LOG_FORMAT"),
            "text"
        );
        assert_eq!(
            env_value(find(&json, kind, name), "RINGLB_LOG_FORMAT"),
            "json"
        );
    }
}

/// bpffs: an init container mounts it on the host (Bidirectional, so privileged
/// there only); the agents see it with HostToContainer.
fn bpffs_is_mounted_by_an_init_container(edge: &Value, node: &Value) {
    let no_mount = docs(&template_ok(&["--set", "mountBpffs=false"]));
    for w in [edge, node] {
        let pod = &w["spec"]["template"]["spec"];
        let init = &pod["initContainers"][0];
        assert_eq!(init["name"], "mount-bpffs", "{pod}");
        assert_eq!(
            init["image"],
            container(w)["image"],
            "the agent's own image"
        );
        assert_eq!(
            init["args"],
            serde_json::json!(["mount-bpffs", "--path=/sys/fs/bpf"])
        );
        assert_eq!(init["securityContext"]["privileged"], true);
        assert_eq!(init["volumeMounts"][0]["name"], pod["volumes"][0]["name"]);
        assert_eq!(init["volumeMounts"][0]["mountPath"], "/sys/fs/bpf");
        assert_eq!(init["volumeMounts"][0]["mountPropagation"], "Bidirectional");
        let main = container(w);
        assert!(
            main["securityContext"].get("privileged").is_none(),
            "{main}"
        );
        assert_eq!(main["volumeMounts"][0]["mountPath"], "/sys/fs/bpf");
        assert_eq!(
            main["volumeMounts"][0]["mountPropagation"],
            "HostToContainer"
        );
        let name = w["metadata"]["name"].as_str().unwrap();
        let off = find(&no_mount, "DaemonSet", name);
        assert!(
            off["spec"]["template"]["spec"]
                .get("initContainers")
                .is_none(),
            "mountBpffs=false: no init container in {name}"
        );
    }
}

/// Turning a component off takes its RBAC with it.
fn turning_a_component_off_takes_its_rbac_with_it() {
    let no_node = docs(&template_ok(&["--set", "nodeAgent.enabled=false"]));
    assert!(!names(&no_node, "ServiceAccount").contains("ringlb-node"));
    assert!(!names(&no_node, "ClusterRole").contains("ringlb-node"));
    assert!(names(&no_node, "DaemonSet") == BTreeSet::from(["ringlb-edge".to_string()]));
}

/// Every flag the chart passes is one the program accepts with a value it parses:
/// each program parses the rendered args (with `--help` last, so nothing starts).
/// Needs the binaries: `cargo build -p ringlb-controller -p ringlb-edge --bins`.
#[test]
fn rendered_flags_are_accepted_by_the_programs() {
    let bins = ringlb_e2e::lab::Bins::discover().unwrap_or_else(|e| panic!("{e}"));
    let example = example_values();
    for extra in [vec![], vec!["--values", example.to_str().unwrap()]] {
        let mut set = extra.clone();
        set.extend([
            "--set",
            "edge.sourceV6=2001:db8::1",
            "--set",
            "edge.routerId=hostIP",
        ]);
        set.extend(["--set", "nodeAgent.interfaces={eth0,eth1}"]);
        let objs = docs(&template_ok(&set));
        for (kind, name, bin) in [
            ("Deployment", "ringlb-controller", &bins.controller),
            ("DaemonSet", "ringlb-edge", &bins.edge),
            ("DaemonSet", "ringlb-node", &bins.edge),
        ] {
            let a: Vec<String> = args(find(&objs, kind, name))
                .into_iter()
                .map(|a| a.replace("$(HOST_IP)", "192.0.2.1"))
                .collect();
            let mut cmd = Command::new(bin);
            cmd.args(&a).arg("--help").env_remove("RINGLB_LOG");
            if let Some(init) =
                find(&objs, kind, name)["spec"]["template"]["spec"]["initContainers"].as_array()
            {
                for c in init {
                    let a: Vec<&str> = c["args"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap())
                        .collect();
                    let mut init_cmd = Command::new(bin);
                    init_cmd.args(&a).arg("--help");
                    let (ok, _, err) = run(init_cmd, "");
                    assert!(ok, "init container {a:?} --help refused:\n{err}");
                }
            }
            let (ok, _, err) = run(cmd, "");
            assert!(
                ok,
                "{} {a:?} --help refuses the chart's flags:\n{err}",
                bin.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Against the API server
// ---------------------------------------------------------------------------------
