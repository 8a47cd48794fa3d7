//! docs/services.md stays true: its table names every `spec` field of a Service (as
//! `k8s_openapi` knows them) and every annotation ringlb reads, and nothing else.

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::ServiceSpec;
use ringlb_crds::service::ANNOTATIONS;

fn page() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/services.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The first cell of every table row, without its backticks.
fn first_cells(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(cell, _)| cell.to_string())
        .collect()
}

/// The first cells of the page's table rows that `keep` keeps.
fn listed(keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    first_cells(&page())
        .into_iter()
        .filter(|c| keep(c))
        .collect()
}

/// Asserts that the page lists every one of `wanted` and nothing else; `unknown_is`
/// says what the extra ones are not.
fn assert_lists_exactly(listed: &BTreeSet<String>, wanted: &BTreeSet<String>, unknown_is: &str) {
    let missing: Vec<_> = wanted.difference(listed).collect();
    let unknown: Vec<_> = listed.difference(wanted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/services.md: missing {missing:?}, {unknown_is} {unknown:?}"
    );
}

/// Every property of `ServiceSpec`, from its JSON schema (the API's own names).
fn spec_fields() -> BTreeSet<String> {
    let schema = schemars::schema_for!(ServiceSpec);
    let v = serde_json::to_value(&schema).unwrap();
    v["properties"]
        .as_object()
        .expect("ServiceSpec's schema has properties")
        .keys()
        .map(|k| format!("spec.{k}"))
        .collect()
}

#[test]
fn the_table_lists_every_service_spec_field() {
    let fields = spec_fields();
    // The check can fail: the schema really has the fields this page is about.
    assert!(
        fields.contains("spec.sessionAffinity") && fields.len() >= 20,
        "{fields:?}"
    );
    let listed = listed(|c| c.starts_with("spec."));
    assert_lists_exactly(&listed, &fields, "not ServiceSpec fields");
}

#[test]
fn the_table_lists_every_annotation_ringlb_reads() {
    let listed = listed(|c| c.contains('/'));
    let mut wanted: BTreeSet<String> = ANNOTATIONS.iter().map(|(n, ..)| n.to_string()).collect();
    wanted.insert("service.beta.kubernetes.io/load-balancer-source-ranges".into());
    assert_lists_exactly(&listed, &wanted, "not read by ringlb");
}

#[test]
fn first_cells_reads_table_rows_only() {
    let t = "| field | x |\n|---|---|\n| `spec.type` | a |\nprose `spec.ports`\n| `a/b` | c |";
    assert_eq!(first_cells(t), ["spec.type", "a/b"]);
}
