//! The real apply path over the in-memory kernel.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::*;
use crate::kernel::memory::MemoryKernel;
use crate::kernel::netlink::{family_id, write_error};
use crate::model::{Proto, Service};
use crate::plan::fixtures::{backends, key, pod};
use crate::plan::{Backend, Config, Desired, Op};

/// Pods `pods`, each at weight 1.
fn weight_1(pods: &[u8]) -> Vec<Backend> {
    backends(&pods.iter().map(|&p| (p, 1)).collect::<Vec<_>>())
}

/// `services`, each with its pods at weight 1.
fn desired(services: &[(ServiceKey, &[u8])]) -> Desired {
    Desired {
        services: services.iter().map(|(k, p)| (*k, weight_1(p))).collect(),
        ..Default::default()
    }
}

fn datapath(k: MemoryKernel) -> IpvsDatapath<MemoryKernel> {
    IpvsDatapath::new(k, Config::default()).unwrap()
}

/// The kernel holds `want` (ringlb's part) and planning finds nothing to do.
fn converged(dp: &mut IpvsDatapath<MemoryKernel>, want: &Desired) {
    let addrs: BTreeSet<IpAddr> = want.services.keys().map(|k| k.addr).collect();
    let read = dp.read_held(&addrs).unwrap();
    assert_eq!(&read, dp.held(), "the view is what the kernel holds");
    let ops = plan::plan(&read, want, &Config::default()).unwrap();
    assert!(ops.is_empty(), "{ops:?}");
    assert_eq!(read.vips, addrs);
}

#[test]
fn applies_converge_and_a_second_apply_writes_nothing() {
    let mut dp = datapath(MemoryKernel::default());
    let want = desired(&[
        (key(1, 80), &[1, 2]),
        (key(1, 443), &[1]),
        (key(2, 80), &[3]),
    ]);
    let st = dp.apply(&want).unwrap();
    assert_eq!(
        (st.services_created, st.dests_added, st.vips_bound),
        (3, 4, 2)
    );
    converged(&mut dp, &want);
    let w = dp.kernel().writes;
    assert_eq!(dp.apply(&want).unwrap(), ApplyStats::default());
    assert_eq!(dp.kernel().writes, w);
}

/// A write failing at every point of a change: the apply reports it, the view
/// is re-read (it equals the kernel), and the next apply converges.
#[test]
fn a_failed_write_at_any_point_is_reread_and_the_next_apply_converges() {
    let before = desired(&[(key(1, 80), &[5, 3, 1]), (key(2, 80), &[2, 3])]);
    let after = desired(&[(key(1, 80), &[2, 3, 5, 7]), (key(3, 53), &[1, 4])]);
    let mut base = datapath(MemoryKernel::default());
    base.apply(&before).unwrap();
    let total = {
        let mut probe = datapath(base.kernel().clone());
        let w0 = probe.kernel().writes;
        probe.apply(&after).unwrap();
        probe.kernel().writes - w0
    };
    assert!(total > 6, "a change of several writes: {total}");
    for k in 0..total {
        let mut kernel = base.kernel().clone();
        kernel.fail_after = Some(k);
        let mut dp = datapath(kernel);
        let err = dp.apply(&after).expect_err("write {k} fails");
        // An agent that crashed right there and restarts converges too, and
        // leaves nothing of `before` behind.
        let mut restarted = datapath(dp.kernel().clone());
        restarted.kernel_mut().fail_after = None;
        restarted.apply(&after).unwrap();
        converged(&mut restarted, &after);
        assert_eq!(
            restarted.kernel().state.services.len(),
            after.services.len(),
            "crash at write {k}: a service leaked"
        );
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(dp.view_known(), "the re-read succeeded");
        let addrs = after
            .services
            .keys()
            .chain(before.services.keys())
            .map(|k| k.addr)
            .collect();
        let read = dp.read_held(&addrs).unwrap();
        assert_eq!(dp.held(), &read, "failure at write {k}");
        dp.kernel_mut().fail_after = None;
        dp.apply(&after)
            .unwrap_or_else(|e| panic!("failure at write {k}, then: {e}"));
        converged(&mut dp, &after);
    }
}

/// When the re-read after a failed write fails too, nothing is planned from
/// the unknown view until a re-read succeeds.
#[test]
fn an_unknown_view_plans_nothing_until_a_reread_succeeds() {
    let mut dp = datapath(MemoryKernel::default());
    dp.apply(&desired(&[(key(1, 80), &[1])])).unwrap();
    let want = desired(&[(key(1, 80), &[1, 2, 3])]);
    dp.kernel_mut().fail_after = Some(1);
    dp.kernel_mut().fail_reads = true;
    dp.apply(&want).expect_err("the second write fails");
    assert!(!dp.view_known());
    let writes = dp.kernel().writes;
    dp.kernel_mut().fail_after = None;
    let e = dp.apply(&want).expect_err("the re-read fails again");
    assert!(matches!(e, Error::ViewUnknown { .. }), "{e}");
    assert_eq!(dp.kernel().writes, writes, "nothing written");
    assert!(
        dp.apply_service(&key(1, 80), None, None, None).is_err(),
        "no single-service update either"
    );
    dp.kernel_mut().fail_reads = false;
    dp.apply(&want).unwrap();
    assert!(dp.view_known());
    converged(&mut dp, &want);
}

/// Someone else's services (not on a ringlb VIP) are never read, changed or
/// deleted; a service already on a VIP ringlb is asked to serve is taken over.
#[test]
fn other_services_are_left_alone_and_one_on_our_vip_is_adopted() {
    let mut kernel = MemoryKernel::default();
    let theirs = ServiceKey {
        addr: "192.0.2.10".parse().unwrap(),
        port: 80,
        proto: Proto::Tcp,
    };
    let mut rr = Service::mh(theirs, 0);
    rr.sched_name = "rr".into();
    kernel.state.apply(&Op::NewService(rr.clone())).unwrap();
    let mut on_ours = Service::mh(key(1, 80), 0);
    on_ours.sched_name = "wlc".into();
    kernel.state.apply(&Op::NewService(on_ours)).unwrap();
    let stale = crate::model::Dest::new(pod(9), 80, crate::model::Forward::Tunnel, 1);
    kernel.state.apply(&Op::NewDest(key(1, 80), stale)).unwrap();

    let mut dp = datapath(kernel);
    assert!(dp.held().services.is_empty(), "nothing is ringlb's yet");
    let want = desired(&[(key(1, 80), &[1])]);
    let st = dp.apply(&want).unwrap();
    assert_eq!((st.services_created, st.services_updated), (0, 1), "{st:?}");
    converged(&mut dp, &want);
    dp.remove_all().unwrap();
    let left: Vec<_> = dp.kernel().state.services.keys().collect();
    assert_eq!(left, vec![&theirs], "only theirs is left");
    assert_eq!(dp.kernel().state.services[&theirs].service, rr);
}

/// A restarted agent finds what the last one left (its marked VIPs and the
/// services on them), writes nothing for the same desired state, and removes
/// what is no longer wanted; `uninstall` leaves only others' services.
#[test]
fn a_restart_reads_what_the_last_run_left() {
    let want = desired(&[(key(1, 80), &[1, 2]), (key(2, 80), &[3])]);
    let mut first = datapath(MemoryKernel::default());
    first.apply(&want).unwrap();
    let mut kernel = first.kernel().clone();
    let theirs = Service::mh(
        ServiceKey {
            addr: "192.0.2.10".parse().unwrap(),
            port: 80,
            proto: Proto::Udp,
        },
        0,
    );
    kernel.state.apply(&Op::NewService(theirs.clone())).unwrap();

    let mut second = datapath(kernel.clone());
    assert_eq!(second.held().services.len(), 2);
    let w = second.kernel().writes;
    second.apply(&want).unwrap();
    assert_eq!(second.kernel().writes, w, "the same state: nothing written");
    let st = second.apply(&desired(&[(key(1, 80), &[1, 2])])).unwrap();
    assert_eq!((st.services_deleted, st.vips_unbound), (1, 1));

    let mut third = datapath(second.kernel().clone());
    let st = third.remove_all().unwrap();
    assert_eq!((st.services_deleted, st.vips_unbound), (1, 1));
    let left = &third.kernel().state;
    assert_eq!(left.services.keys().collect::<Vec<_>>(), vec![&theirs.key]);
    assert!(left.vips.is_empty());
}

#[test]
fn single_service_updates() {
    let mut dp = datapath(MemoryKernel::default());
    let (http, https) = (key(1, 80), key(1, 443));
    dp.apply_service(&http, Some(&weight_1(&[1, 2])), None, None)
        .unwrap();
    dp.apply_service(&https, Some(&weight_1(&[1])), None, None)
        .unwrap();
    let st = dp
        .apply_service(&http, Some(&weight_1(&[2, 3])), None, None)
        .unwrap();
    assert_eq!((st.dests_added, st.dests_deleted), (1, 1), "{st:?}");
    dp.apply_service(&https, None, None, None).unwrap();
    assert!(
        dp.held().vips.contains(&http.addr),
        "port 80 still uses the VIP"
    );
    converged(&mut dp, &desired(&[(http, &[2, 3])]));
    dp.apply_service(&http, None, None, None).unwrap();
    converged(&mut dp, &Desired::default());
}

#[test]
fn start_up_and_write_errors_say_what_to_do() {
    let no_family = Err(Error::Kernel {
        op: "CTRL_CMD_GETFAMILY",
        target: String::new(),
        errno: -libc::ENOENT,
    });
    let e = family_id(no_family).unwrap_err();
    assert!(matches!(e, Error::NoIpvs));
    assert_eq!(
        e.to_string(),
        "this kernel has no IPVS (modprobe ip_vs ip_vs_mh)"
    );
    let op = Op::NewService(Service::mh(key(1, 80), 0));
    let refused = || Error::Kernel {
        op: "",
        target: String::new(),
        errno: -libc::ENOENT,
    };
    let e = write_error(&op, refused());
    assert_eq!(
        e.to_string(),
        "the IPVS scheduler \"mh\" is not available (modprobe ip_vs_mh)"
    );
    let e = write_error(&Op::DelService(key(1, 80)), refused());
    assert!(
        e.to_string()
            .starts_with("DEL_SERVICE 10.100.0.1:80/tcp: the kernel answered"),
        "{e}"
    );
    assert_eq!(e.metric_label(), "kernel");
}
