#!/usr/bin/env bash
# A first install, timed phase by phase, as far as this machine allows
# (docs/install.md, "How long a first install takes"):
#
#   1. images       scripts/build-images.sh (`make images`): cargo build --release,
#                   Debian base (debootstrap), OCI layouts + docker-archives
#   2. go build     scripts/build-k8s.sh (`make k8s`): etcd, kube-apiserver,
#                   kube-controller-manager, kubectl, helm from their Go modules
#   3. harness      cargo build of `ringlb-controlplane` (the tests' control plane as
#                   a daemon)
#   4. cluster      that daemon: real etcd + kube-apiserver + kube-controller-manager,
#                   no ringlb CRDs yet
#   5. helm install helm install ringlb charts/ringlb -n ringlb-system
#                   --create-namespace -f VALUES
#   6. controller   what the kubelet would do with one pod of deployment/ringlb-controller
#                   (see below), until its readiness probe passes
#   7. expose       kubectl create deployment web; kubectl expose deployment web
#                   --type=LoadBalancer --port=80; until status.loadBalancer.ingress[0].ip
#
# then removes everything it made (processes, mount namespace, temporary folder).
#
# The stand-in (step 6). There is no container runtime here, so no kubelet: the
# chart's pods are created by kube-controller-manager and stay Pending. For one
# controller pod this script does the kubelet's part by hand, from the API objects:
#   - image: the pod's `image` must be the tag the build wrote to images/out/oci;
#     that layout is unpacked with umoci (the "pull");
#   - the pod's args and env exactly (fieldRefs resolved as the kubelet does; the
#     args are also checked equal to `helm get manifest`), entrypoint from the image;
#   - the ServiceAccount token: a TokenRequest bound to that pod, with the CA from
#     configmap kube-root-ca.crt and the namespace, in a tmpfs at
#     /var/run/secrets/kubernetes.io/serviceaccount (read-only), found by the program's
#     in-cluster config through KUBERNETES_SERVICE_HOST/PORT;
#   - securityContext: runAsUser/runAsGroup, no supplementary groups, an empty
#     capability bounding set, no_new_privs, a read-only root (bind mount) in a
#     private mount namespace, chroot into the image's rootfs;
#   - the readiness probe: GET /readyz on the container's `metrics` port.
# Not done: a network namespace and pod IP (the program uses the host's network, so
# the API server is reached at 127.0.0.1, not through the `kubernetes` Service and
# kube-proxy), cgroups and resource limits, seccomp, /etc/hosts and resolv.conf, the
# second replica, the edge and node-agent DaemonSets (they need nodes to attach XDP
# and tc to; the network-namespace lab, docs/lab.md, runs those).
#
# Usage: sudo scripts/first-install.sh [VALUES]   (default charts/ringlb/examples/values-lab.yaml)
# Env: CARGO, CARGO_TARGET_DIR, XDG_CACHE_HOME/GOCACHE/GOMODCACHE (where the Go build
# goes), FIRST_INSTALL_SKIP_BUILD=1 (skip phases 1-3: reuse images/out, the Go build
# and the harness as they are). Needs root (debootstrap, chroot, mount).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VALUES=$(realpath "${1:-charts/ringlb/examples/values-lab.yaml}")
NS=ringlb-system
RELEASE=ringlb
SA=ringlb-controller

if [ "$(id -u)" -ne 0 ]; then
  echo "first-install: needs root (debootstrap, chroot, mount); run: sudo $0 $*" >&2
  exit 1
fi
CARGO=${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d /tmp/ringlb-first-install.XXXXXX)
T0=$EPOCHREALTIME
TIMES=()
CP_PID="" CTL_PID=""

say() { printf '\nfirst-install: [%5.1fs] %s\n' "$(elapsed "$T0")" "$*"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
phase() { # phase NAME FUNCTION: runs it, records its seconds
  local name=$1 s=$EPOCHREALTIME
  say "$name"
  "$2"
  TIMES+=("$name|$(elapsed "$s")")
}

stop_pid() { # stop_pid PID GRACE: TERM, then KILL after GRACE seconds
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid name
  set +e
  [ -n "$CTL_PID" ] && stop_pid "$CTL_PID" 10
  [ -n "$CP_PID" ] && stop_pid "$CP_PID" 30
  # a control plane killed before its drop leaves its programs: stop them by PID
  for f in "$WORK"/ringlb-cp-*/pids; do
    [ -f "$f" ] || continue
    while read -r pid name; do stop_pid "$pid" 5; done <"$f"
  done
  if grep -q " $WORK" /proc/self/mountinfo; then
    echo "first-install: mounts left under $WORK:" >&2
    grep " $WORK" /proc/self/mountinfo >&2
  fi
  rm -rf "$WORK"
  echo "first-install: cleaned up (processes stopped, $WORK removed)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- phases 1-3: builds ------------------------------------------------------------

build_images() { CARGO=$CARGO nice -n 10 bash scripts/build-images.sh; }

build_k8s() {
  nice -n 10 bash scripts/build-k8s.sh | tail -n 1 >"$WORK/assets"
}

build_harness() {
  nice -n 10 "$CARGO" build --release --locked -p ringlb-controlplane --bin ringlb-controlplane
}

# --- phase 4: the cluster ----------------------------------------------------------

start_cluster() {
  TMPDIR=$WORK RINGLB_K8S_ASSETS=$ASSETS "$TARGET_DIR/release/ringlb-controlplane" \
    "$WORK/cp" >"$WORK/controlplane.log" 2>&1 &
  CP_PID=$!
  local i
  for ((i = 0; i < 1200; i++)); do
    [ -f "$WORK/cp/ready" ] && { cat "$WORK/controlplane.log"; return; }
    kill -0 "$CP_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$WORK/controlplane.log" >&2
  echo "first-install: the control plane did not start" >&2
  return 1
}

kubectl() { "$ASSETS/kubectl" --kubeconfig "$WORK/cp/kubeconfig" "$@"; }
helm() {
  HELM_CONFIG_HOME=$WORK/helm/config HELM_CACHE_HOME=$WORK/helm/cache \
    HELM_DATA_HOME=$WORK/helm/data "$ASSETS/helm" --kubeconfig "$WORK/cp/kubeconfig" "$@"
}

# --- phase 5 -----------------------------------------------------------------------

helm_install() {
  echo "\$ helm install $RELEASE charts/ringlb -n $NS --create-namespace -f ${VALUES#"$ROOT"/}"
  helm install "$RELEASE" charts/ringlb -n "$NS" --create-namespace -f "$VALUES" | sed -n 1,5p
}

# --- phase 6: the kubelet's part for one controller pod ----------------------------

# kubelet.py pod POD.json DEPLOY.json OUT.json: the container to run, from the pod
# (fieldRefs resolved) after checking its args against the release's Deployment.
# kubelet.py run SPEC.json: mounts (private mount namespace), chroot, drop
# privileges as the securityContext says, exec the entrypoint.
write_kubelet_py() {
  cat >"$WORK/kubelet.py" <<'PY'
import ctypes, json, os, subprocess, sys

def pod(pod_path, deploy_path, out_path, rootfs, secrets, host, port, entrypoint):
    p = json.load(open(pod_path)); d = json.load(open(deploy_path))
    c = p["spec"]["containers"][0]
    want = d["spec"]["template"]["spec"]["containers"][0].get("args", [])
    if c.get("args", []) != want:
        sys.exit(f"pod args {c.get('args')} != helm get manifest's {want}")
    fields = {"metadata.name": p["metadata"]["name"],
              "metadata.namespace": p["metadata"]["namespace"],
              "spec.nodeName": "first-install", "status.hostIP": "127.0.0.1"}
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
           "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for e in c.get("env", []):
        env[e["name"]] = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    ps, cs = p["spec"].get("securityContext", {}), c.get("securityContext", {})
    sc = {**ps, **cs}
    # Kubernetes: `command` replaces the image's Entrypoint; `args` replace its Cmd.
    argv = c.get("command") or json.loads(entrypoint)
    probe = c["readinessProbe"]["httpGet"]
    port = probe["port"]
    if isinstance(port, str):
        port = next(x["containerPort"] for x in c["ports"] if x.get("name") == port)
    spec = {"rootfs": rootfs, "secrets": secrets, "argv": argv + c.get("args", []),
            "env": env, "uid": sc["runAsUser"], "gid": sc["runAsGroup"],
            "ro": sc.get("readOnlyRootFilesystem", False),
            "nnp": not sc.get("allowPrivilegeEscalation", True),
            "port": port, "readyz": f"http://127.0.0.1:{port}{probe['path']}",
            "caps_added": sc.get("capabilities", {}).get("add", [])}
    if spec["caps_added"]:
        sys.exit(f"this stand-in runs no capabilities; the pod adds {spec['caps_added']}")
    json.dump(spec, open(out_path, "w"), indent=1)
    print(f"  pod {p['metadata']['name']}: image {c['image']}, user {spec['uid']}:{spec['gid']}, "
          f"read-only root {spec['ro']}, no_new_privs {spec['nnp']}, capabilities: none")
    print("  argv: " + " ".join(spec["argv"]))

def deployment(name):  # from a stream of JSON objects (kubectl -o json of many)
    text, dec, i = sys.stdin.read(), json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        o, i = dec.raw_decode(text, i)
        if o["kind"] == "Deployment" and o["metadata"]["name"] == name:
            return json.dump(o, sys.stdout)

def run(spec_path):
    s = json.load(open(spec_path)); r = s["rootfs"]
    sa = os.path.join(r, "run/secrets/kubernetes.io/serviceaccount")  # /var/run -> /run
    os.makedirs(sa, exist_ok=True)
    sh = lambda *a: subprocess.run(["mount", *a], check=True)
    sh("--bind", r, r)
    sh("-t", "proc", "proc", os.path.join(r, "proc"))
    sh("-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", sa)
    for f in ("token", "ca.crt", "namespace"):
        with open(os.path.join(s["secrets"], f), "rb") as src, open(os.path.join(sa, f), "wb") as dst:
            dst.write(src.read())
        os.chmod(os.path.join(sa, f), 0o644)
    sh("-o", "remount,bind,ro", sa)
    if s["ro"]:
        sh("-o", "remount,bind,ro", r)
    libc = ctypes.CDLL(None, use_errno=True)
    os.chroot(r); os.chdir("/")
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):  # PR_CAPBSET_DROP: an empty bounding set
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            sys.exit(f"PR_CAPBSET_DROP {cap}: errno {ctypes.get_errno()}")
    os.setgroups([]); os.setgid(s["gid"]); os.setuid(s["uid"])
    if s["nnp"] and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        sys.exit("PR_SET_NO_NEW_PRIVS failed")
    os.execve(s["argv"][0], s["argv"], s["env"])

if __name__ == "__main__":
    {"pod": pod, "run": run, "deployment": deployment}[sys.argv[1]](*sys.argv[2:])
PY
}

# The pod kube-controller-manager created for the Deployment, once it exists.
controller_pod() {
  local i name
  for ((i = 0; i < 300; i++)); do
    name=$(kubectl -n "$NS" get pods -l app.kubernetes.io/name=ringlb,app.kubernetes.io/component=controller \
      -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
    [ -n "$name" ] && { echo "$name"; return; }
    sleep 0.2
  done
  echo "first-install: no controller pod was created" >&2
  return 1
}

# The image "pull": the pod's image must be a tag the build wrote.
unpack_image() {
  local image=$1 repo tag
  repo=${image%:*} tag=${image##*:}
  if [ ! -d "images/out/oci/${repo##*/}" ]; then
    echo "first-install: no layout images/out/oci/${repo##*/} for image $image" >&2
    return 1
  fi
  umoci unpack --image "images/out/oci/${repo##*/}:$tag" "$WORK/bundle" >/dev/null
  skopeo inspect --config "oci:images/out/oci/${repo##*/}:$tag" |
    python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["config"]["Entrypoint"]))' \
      >"$WORK/entrypoint"
}

service_account_files() { # service_account_files POD: the projected volume's files
  local pod=$1 uid
  mkdir -p "$WORK/sa"
  uid=$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.metadata.uid}')
  kubectl -n "$NS" create token "$SA" --duration=1h \
    --bound-object-kind=Pod --bound-object-name="$pod" --bound-object-uid="$uid" >"$WORK/sa/token"
  kubectl -n "$NS" get configmap kube-root-ca.crt -o jsonpath='{.data.ca\.crt}' >"$WORK/sa/ca.crt"
  printf '%s' "$NS" >"$WORK/sa/namespace"
}

run_controller() {
  local pod image api port i
  write_kubelet_py
  pod=$(controller_pod)
  kubectl -n "$NS" get pod "$pod" -o json >"$WORK/pod.json"
  helm get manifest "$RELEASE" -n "$NS" |
    kubectl create --dry-run=client -o json -f - |
    python3 "$WORK/kubelet.py" deployment ringlb-controller >"$WORK/deploy.json"
  image=$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.spec.containers[0].image}')
  unpack_image "$image"
  service_account_files "$pod"
  api=$(sed -n 's#^ *server: https://\(.*\)#\1#p' "$WORK/cp/kubeconfig")
  python3 "$WORK/kubelet.py" pod "$WORK/pod.json" "$WORK/deploy.json" "$WORK/spec.json" \
    "$WORK/bundle/rootfs" "$WORK/sa" "${api%:*}" "${api##*:}" "$(cat "$WORK/entrypoint")"
  port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$WORK/spec.json")
  if ss -ltnH "sport = :$port" | grep -q .; then
    echo "first-install: port $port is taken on this host (the program uses the host's network)" >&2
    return 1
  fi
  unshare --mount --propagation private python3 "$WORK/kubelet.py" run "$WORK/spec.json" \
    >"$WORK/controller.log" 2>&1 &
  CTL_PID=$!
  local readyz
  readyz=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["readyz"])' "$WORK/spec.json")
  for ((i = 0; i < 600; i++)); do
    if curl -sf -o /dev/null "$readyz"; then
      grep -E '^(Uid|Gid|Groups|CapEff|CapBnd|NoNewPrivs)' "/proc/$CTL_PID/status" | tr '\n' ' ' | sed 's/\t/ /g; s/^/  process: /'
      echo
      echo "  $readyz: 200"
      return
    fi
    kill -0 "$CTL_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$WORK/controller.log" >&2
  echo "first-install: the controller did not become ready" >&2
  return 1
}

# --- phase 7 -----------------------------------------------------------------------

expose() {
  local i ip
  echo "\$ kubectl create deployment web --image=nginx --port=80"
  kubectl create deployment web --image=nginx --port=80
  echo "\$ kubectl expose deployment web --type=LoadBalancer --port=80"
  kubectl expose deployment web --type=LoadBalancer --port=80
  for ((i = 0; i < 1200; i++)); do
    ip=$(kubectl get service web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')
    if [ -n "$ip" ]; then
      echo "$ip" >"$WORK/vip"
      kubectl get service web
      return
    fi
    sleep 0.1
  done
  tail -n 20 "$WORK/controller.log" >&2
  echo "first-install: no VIP in the Service's status after 120 s" >&2
  return 1
}

# --- main --------------------------------------------------------------------------

say "checkout $ROOT, values ${VALUES#"$ROOT"/}, work $WORK"
if [ "${FIRST_INSTALL_SKIP_BUILD:-0}" = 1 ]; then
  nice -n 10 bash scripts/build-k8s.sh 2>/dev/null | tail -n 1 >"$WORK/assets"
else
  phase "1 images (make images)" build_images
  phase "2 Go build (make k8s)" build_k8s
  phase "3 harness build (ringlb-controlplane)" build_harness
fi
ASSETS=$(cat "$WORK/assets")
phase "4 control plane up" start_cluster
phase "5 helm install" helm_install
phase "6 controller pod run from its image" run_controller
phase "7 expose -> VIP in status" expose
TOTAL=$(elapsed "$T0")
VIP=$(cat "$WORK/vip")
kubectl -n "$NS" get lease ringlb-controller -o jsonpath='  Lease ringlb-controller held by {.spec.holderIdentity}{"\n"}'
sed 's/\x1b\[[0-9;]*m//g' "$WORK/controller.log" | grep -m 2 'default/web' | cut -c 1-160 |
  sed 's/^/  controller log: /' || true

echo
echo "first-install: VIP $VIP"
printf '| %s ' "${TIMES[@]%%|*}" total
echo '|'
printf '|---%.0s' "${TIMES[@]}" x
echo '|'
printf '| %s s ' "${TIMES[@]##*|}" "$TOTAL"
echo '|'
