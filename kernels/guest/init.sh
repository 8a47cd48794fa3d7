#!/bin/sh
# PID 1 of a kernel-matrix guest (kernels/src/initramfs.rs puts it at /init).
# The console (ttyS0) gets everything; the results port (ttyS1) gets only the
# framed lines the runner parses (kernels/src/report.rs):
#   @@KERNEL <release>
#   @@MODULE <name> ok|FAILED
#   @@BEGIN <test executable> at <uptime>s
#   ...its libtest output...
#   @@END <test executable> <rc> at <uptime>s
#   @@DONE
# Settings arrive as kernel command-line variables: ringlb_timeout (seconds per
# test executable), ringlb_tests (which executables, comma-separated; default all).
# An executable with a /tests/<name>.args file (a benchmark) gets those arguments.
set -o pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
R=/dev/ttyS1
say() { echo "$@"; echo "$@" > $R; }

say "@@KERNEL $(uname -r)"
echo "init: up at $(cut -d' ' -f1 /proc/uptime)s"
while read -r m; do
  [ -n "$m" ] || continue
  if modprobe "$m" 2>/tmp/modprobe.err; then say "@@MODULE $m ok"; else
    say "@@MODULE $m FAILED $(head -c 200 /tmp/modprobe.err)"; fi
done < /etc/ringlb-modules
ip link set lo up
# aya raises RLIMIT_MEMLOCK itself where a kernel (< 5.11) charges maps to it
echo "init: RLIMIT_MEMLOCK $(ulimit -l)"

tests=$(echo "${ringlb_tests:-}" | tr , " ")
for t in ${tests:-$(ls /tests)}; do
  say "@@BEGIN $t at $(cut -d' ' -f1 /proc/uptime)s"
  # a test's panic message and skips go to stderr: keep them with its line
  # a benchmark (kernel-matrix --bench) brings its own arguments in /tests/<name>.args
  args="--test-threads 1 --nocapture"
  [ -f "/tests/$t.args" ] && args=$(cat "/tests/$t.args")
  timeout "${ringlb_timeout:-300}" "/tests/$t" $args 2>&1 | tee $R
  rc=$?
  say "@@END $t $rc at $(cut -d' ' -f1 /proc/uptime)s"
  # leftovers of a failed test must not break the next one
  for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1); do ip netns del "$ns"; done
done
say "@@DONE"
sync
poweroff -f
