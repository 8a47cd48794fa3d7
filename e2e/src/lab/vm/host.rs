//! The host half of the IPVS lab (`ringlb-lab ipvs-vm`): the real control plane
//! and ringlb-controller on the host, the Service with its VIP made before the
//! guest boots, the guest's image (the kernel matrix's common archive, its module
//! archive, and `lab.cpio` with the lab's programs, their libraries and the
//! kubeconfigs), one boot under qemu with a NIC whose only way out is a `guestfwd`
//! to kube-apiserver, and the guest's report.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use ringlb_kernels::{initramfs::Rootfs, qemu, report};

use super::guest::BIN_DIR;
use super::{
    FIGURE, GUEST_ADDR, GUEST_ADMIN_KUBECONFIG, GUEST_API, GUEST_ETC, TEST_NAME, VmConfig,
};
use crate::controlplane::{ControlPlane, LabKubelet};
use crate::lab::daemon::Daemon;
use crate::lab::{Addrs, Bins, api, config};

/// What `ringlb-lab ipvs-vm` does.
#[derive(Debug, Clone)]
pub struct Options {
    /// A kernel line of the matrix (5.10, 6.1, 6.12, newest) or a package name.
    pub kernel: String,
    pub cache: PathBuf,
    /// Console, results, images.
    pub out: PathBuf,
    pub flows: u16,
    pub long_flows: u16,
    /// The whole guest, boot to power-off.
    pub timeout: Duration,
    pub memory_mb: u32,
}

/// Host programs the guest runs, copied with their libraries (busybox, ip, tc,
/// iptables and ipvsadm are in the matrix's common archive already).
const GUEST_TOOLS: &[&str] = &[
    "/usr/sbin/bird",
    "/usr/sbin/birdc",
    "/usr/sbin/nft",
    "/usr/sbin/ethtool",
    "/usr/bin/curl",
];

/// The control plane's side: running until dropped.
struct Api {
    _kubelet: LabKubelet,
    cp: ControlPlane,
}

/// Runs the lab; true when every guest check passed.
pub fn run(o: &Options) -> anyhow::Result<bool> {
    let t0 = Instant::now();
    let bins = Bins::discover()?;
    std::fs::create_dir_all(&o.out)?;
    let boot = qemu::BootOptions {
        accel: "tcg".into(),
        memory_mb: o.memory_mb,
        smp: 2,
        timeout: o.timeout,
        test_timeout: o.timeout.saturating_sub(Duration::from_secs(60)),
        tests: vec![TEST_NAME.into()],
        extra_initrd: vec![o.out.join("lab.cpio")],
        qemu_args: Vec::new(),
    };
    let plan = ringlb_kernels::Plan {
        kernels: vec![o.kernel.clone()],
        cache: o.cache.clone(),
        out: o.out.clone(),
        workspace: PathBuf::from("."),
        boot: boot.clone(),
        jobs: 1,
        refresh: false,
        bench: None,
    };
    let kernel = ringlb_kernels::prepare_kernels(&plan)?.remove(0);
    let t_kernel = t0.elapsed();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let a = Addrs::three_workers();
    let etc = o.out.join("etc");
    std::fs::create_dir_all(&etc)?;
    let api = rt.block_on(start_api(&a, &etc))?;
    let mut controller = Daemon::spawn(
        &o.out,
        "controller",
        None,
        &[
            &bins.controller.display().to_string(),
            "--kubeconfig",
            &etc.join("controller-direct.kubeconfig")
                .display()
                .to_string(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-elect=false",
        ],
        &[],
    )?;
    let vip = rt.block_on(service_with_vip(&api.cp, &a, &mut controller))?;
    let t_api = t0.elapsed();
    eprintln!("ipvs-vm: control plane, controller and Service ready in {t_api:?}: VIP {vip}");
    let cfg = VmConfig {
        vip,
        flows: o.flows,
        long_flows: o.long_flows,
    };
    std::fs::write(etc.join("vm.json"), serde_json::to_string_pretty(&cfg)?)?;
    let common = o.out.join("common.cpio");
    ringlb_kernels::initramfs::build_common(&o.out.join("stage"), &[], &[], &common)?;
    lab_image(&bins, &etc, &o.out.join("stage"), &o.out.join("lab.cpio"))?;
    std::fs::remove_dir_all(o.out.join("stage"))?;

    let connect = format!("cmd:{} connect {}", bins.lab.display(), api.cp.api_addr());
    if connect.contains(',') {
        bail!("qemu's option syntax cannot carry a comma: {connect}");
    }
    let boot = qemu::BootOptions {
        qemu_args: vec![
            "-netdev".into(),
            format!("user,id=n0,restrict=on,guestfwd=tcp:{GUEST_API}-{connect}"),
            "-device".into(),
            "virtio-net-pci,netdev=n0".into(),
        ],
        ..boot
    };
    let t_boot = Instant::now();
    let dir = o.out.join(&kernel.label);
    // once more if the kernel panics while booting, as the matrix does
    let b = ringlb_kernels::boot_retrying_an_early_panic(&kernel, &common, &dir, &boot)?;
    controller.stop(Duration::from_secs(3));
    drop(api);
    let g = report::parse(&b.results);
    let runs = [(kernel.label.clone(), g.clone())];
    println!("\n{}", report::table(&runs));
    for l in b.results.lines().filter(|l| l.starts_with(FIGURE)) {
        println!("{}", l.trim_end());
    }
    println!(
        "ipvs-vm: kernel {} ({}): guest {:.0}s{} (console {}); kernel ready {:.0}s, control plane + Service {:.0}s, total {:.0}s",
        kernel.label,
        kernel.abi,
        t_boot.elapsed().as_secs_f64(),
        if b.timed_out { ", TIMED OUT" } else { "" },
        b.console.display(),
        t_kernel.as_secs_f64(),
        (t_api - t_kernel).as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let n = report::totals(&runs);
    println!(
        "ipvs-vm: {} passed, {} failed, {} skipped",
        n.passed, n.failed, n.skipped
    );
    Ok(g.done && n.failed == 0 && n.passed > 0)
}

/// The control plane with the chart's RBAC and the lab kubelet; writes the
/// kubeconfigs: the edges' and nodes' for the guest's ToR bridge, an admin one
/// for the guest program (at [`GUEST_API`]), the controller's for the host.
async fn start_api(a: &Addrs, etc: &Path) -> anyhow::Result<Api> {
    let tor: IpAddr = a.tor_fabric.parse()?;
    let guest_api: SocketAddr = GUEST_API.parse()?;
    let (cp, kubelet) = api::start_control_plane(a, vec![tor, guest_api.ip()]).await?;
    let bridge = SocketAddr::new(tor, a.api_port);
    // the guest has its own copy of the CA, at a path of its own
    std::fs::copy(cp.ca_cert(), etc.join("ca.crt"))?;
    let guest_ca = format!("{GUEST_ETC}/ca.crt");
    let copy = |from: &Path, via: SocketAddr, to: &str| -> anyhow::Result<()> {
        let p = cp.kubeconfig_via(from, via)?;
        let text = std::fs::read_to_string(&p)?;
        let ca = cp.ca_cert().display().to_string();
        std::fs::write(etc.join(to), text.replace(&ca, &guest_ca))?;
        Ok(())
    };
    copy(cp.kubeconfig_path(), bridge, "kubeconfig")?;
    copy(cp.kubeconfig_path(), guest_api, GUEST_ADMIN_KUBECONFIG)?;
    for sa in [api::EDGE_SA, api::NODE_SA] {
        let direct = cp
            .service_account_kubeconfig(api::RELEASE_NAMESPACE, sa)
            .await?;
        copy(&direct, bridge, &format!("{sa}.kubeconfig"))?;
    }
    let direct = cp
        .service_account_kubeconfig(api::RELEASE_NAMESPACE, api::CONTROLLER_SA)
        .await?;
    std::fs::copy(&direct, etc.join("controller-direct.kubeconfig"))?;
    Ok(Api {
        _kubelet: kubelet,
        cp,
    })
}

/// The lab's manifests (3 replicas) and a LoadBalancer Service `web` (80 ->
/// 8080); waits for its VIP and for an EndpointSlice with every pod ready.
async fn service_with_vip(
    cp: &ControlPlane,
    a: &Addrs,
    controller: &mut Daemon,
) -> anyhow::Result<String> {
    for (name, yaml) in config::manifests(a) {
        cp.apply_yaml(&yaml).await.with_context(|| name)?;
    }
    cp.apply_yaml(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  type: LoadBalancer\n  selector:\n    app: web\n  ports:\n  - port: {}\n    targetPort: {}\n    protocol: TCP\n",
        a.port, a.target_port
    ))
    .await?;
    let client = cp.client().await;
    let svcs: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client, "default");
    let limit = Duration::from_secs(60);
    let start = Instant::now();
    loop {
        controller.check_alive()?;
        let vip = svcs
            .get("web")
            .await?
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .and_then(|i| i.into_iter().next())
            .and_then(|i| i.ip);
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let ready: usize = slices
            .list(&lp)
            .await?
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        match vip {
            Some(v) if ready == a.pods.len() => return Ok(v),
            seen if start.elapsed() > limit => {
                bail!(
                    "no VIP with {} ready endpoints after {limit:?}: VIP {seen:?}, {ready} ready",
                    a.pods.len()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `lab.cpio`: the project's two programs (debug info stripped: they are copied
/// into guest RAM), the host tools of [`GUEST_TOOLS`], the kubeconfigs and
/// `vm.json` in [`GUEST_ETC`], and `/tests/ipvs_lab`, which gives the guest its
/// address on qemu's network and runs `ringlb-lab vm-guest`.
fn lab_image(bins: &Bins, etc: &Path, stage: &Path, out: &Path) -> anyhow::Result<()> {
    let fs = Rootfs::new(stage)?;
    for (host, name) in [(&bins.edge, "ringlb-edge"), (&bins.lab, "ringlb-lab")] {
        let guest = format!("{BIN_DIR}/{name}");
        fs.copy_with_libs(host, &guest)?;
        let staged = fs.root.join(guest.trim_start_matches('/'));
        let st = std::process::Command::new("strip")
            .arg("--strip-debug")
            .arg(&staged)
            .status()
            .context("strip (binutils)")?;
        if !st.success() {
            bail!("strip --strip-debug {} failed", staged.display());
        }
    }
    for tool in GUEST_TOOLS {
        fs.copy_with_libs(Path::new(tool), tool)
            .with_context(|| format!("{tool} (scripts/setup.sh installs it)"))?;
    }
    for e in std::fs::read_dir(etc)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "controller-direct.kubeconfig" {
            fs.copy(&e.path(), &format!("{GUEST_ETC}/{name}"))?;
        }
    }
    let script = format!(
        "#!/bin/sh\n# the IPVS lab (ringlb-lab ipvs-vm): qemu's user network is how the guest reaches kube-apiserver\nip link set eth0 up && ip addr add {GUEST_ADDR} dev eth0 || exit 1\nexec {BIN_DIR}/ringlb-lab vm-guest --etc {GUEST_ETC}\n"
    );
    fs.write(&format!("/tests/{TEST_NAME}"), script.as_bytes(), true)?;
    fs.archive(out)
}
