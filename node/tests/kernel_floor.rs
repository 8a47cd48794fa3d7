//! The floor `ringlb-edge node` refuses to start below (`ringlb_ops::kernel::NODE`,
//! 5.17) against this kernel's own answer: the start-up check refuses this kernel
//! exactly when its verifier refuses the node programs. Run in every kernel of the
//! matrix (kernels/src/testbins.rs), so 5.10 shows the refusal and its message
//! and 6.1 onwards the load. Needs root (BPF); skips loudly otherwise.

use ringlb_node::{NodeDatapath, NodeOptions};
use ringlb_ops::kernel::{self, NODE, Verdict};
use ringlb_testkit::tier::require_root;

#[test]
fn the_node_floor_refuses_exactly_the_kernels_that_refuse_the_programs() {
    if !require_root("kernel_floor (loading BPF programs)") {
        return;
    }
    let release = kernel::running_release().expect("uname");
    let verdict = kernel::check(&release, &NODE);
    let opts = NodeOptions {
        pin_dir: None,
        ..NodeOptions::default()
    };
    let load = NodeDatapath::load(&opts);
    eprintln!(
        "kernel {}: start-up check {verdict:?}; load {}",
        release.trim(),
        match &load {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("refused: {e}"),
        }
    );
    match verdict {
        Err(too_old) => {
            assert!(
                load.is_err(),
                "the check refuses {release} but the programs load: the floor is too high"
            );
            let msg = too_old.to_string();
            assert!(
                msg.contains("needs Linux 5.17 or newer") && msg.contains("bpf_loop"),
                "{msg}"
            );
        }
        Ok(Verdict::Supported | Verdict::Untested | Verdict::Unknown) => {
            assert!(
                load.is_ok(),
                "the check lets {release} start but its verifier refuses the programs: {:?}",
                load.err()
            );
        }
    }
}
