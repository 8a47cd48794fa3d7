// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * probe_atomic_or.bpf.c - does this kernel's verifier take BPF_ATOMIC_OR
 * (Linux 5.12)? The flow filter sets its bits with one (flow_filter.h); the
 * loader (xdp/src/xdp.rs) loads this first and, if it is refused, the build
 * of xdp_lb.bpf.c without the flow filter. Never attached.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} probe_word SEC(".maps");

SEC("xdp")
int ringlb_probe_atomic_or(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *w = bpf_map_lookup_elem(&probe_word, &zero);

	if (w)
		__sync_fetch_and_or(w, 1);
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
