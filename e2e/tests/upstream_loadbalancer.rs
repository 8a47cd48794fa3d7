//! Kubernetes' own LoadBalancer tests against ringlb, in `make test`
//! (docs/conformance.md): the real cluster (as in `real_cluster.rs`), `helm install`,
//! then the upstream `e2e.test` from the client behind the ToR with the selection in
//! [`conformance::MAKE_TEST`]: 13 of the 17 `[Feature:LoadBalancer]` tests (the other
//! four, among them the two 20-minute rolling-update tests, run in `make conformance`;
//! the constant's doc says why each is left out here). Every
//! selected spec must pass, none may skip itself, and afterwards no pool address,
//! ToR route, edge BPF entry, pod restart or panic may be left.
//!
//! Needs root, `make k8s` (e2e.test) and the images of `make cluster-images`; skips
//! loudly when not root or a tool is missing (a failure under `CI=true`).

use std::time::{Duration, Instant};

use ringlb_e2e::realcluster::conformance::{self, Suite};
use ringlb_e2e::realcluster::{self, Options, RealCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubernetes_loadbalancer_tests_pass_with_ringlb() {
    if let Some(why) = realcluster::skip_reason() {
        ringlb_testkit::tier::skip(format_args!("real cluster: {why}"));
        return;
    }
    let prefix = format!("up{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("ringlb-{prefix}"));
    let t0 = Instant::now();
    let rc = RealCluster::up(Options::new(&prefix, &dir))
        .await
        .unwrap_or_else(|e| panic!("bringing the cluster up: {e}"));
    eprintln!("cluster up in {:.1} s", t0.elapsed().as_secs_f64());
    tokio::task::block_in_place(|| run(&rc));
}

fn run(rc: &RealCluster) {
    rc.helm_install("")
        .unwrap_or_else(|e| panic!("helm install: {e}\n{}", rc.log_tails(30)));
    let report_dir = realcluster::repo_root().join("target/conformance/make-test");
    let suite = Suite {
        focus: conformance::MAKE_TEST.join("|"),
        skip: None,
        report_dir,
        timeout: Duration::from_secs(20 * 60),
    };
    let out = rc
        .run_e2e(&suite)
        .unwrap_or_else(|e| panic!("running e2e.test: {e}"));
    eprintln!("{}", out.table());
    let totals = out
        .totals
        .clone()
        .unwrap_or_else(|| panic!("e2e.test printed no summary; its log: {:?}", out.log));
    assert_eq!(
        totals.ran,
        conformance::MAKE_TEST.len() as u32,
        "the selection matches exactly one spec per entry:\n{}",
        out.table()
    );
    assert!(
        totals.clean(),
        "every selected upstream test passes and none skips itself: {totals:?}\n{}",
        out.table()
    );
    let left = rc.leftovers(Duration::from_secs(90));
    assert!(
        left.is_empty(),
        "the suite's Services left something behind: {left:#?}"
    );
}
