/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * src_ranges.h - spec.loadBalancerSourceRanges: a VIP whose Service lists
 * source ranges forwards only packets from inside them. The check runs on
 * every packet of such a VIP, before the ring and before any conntrack
 * insert, and on a conntrack hit too (before the entry is used), so that
 * narrowing the ranges cuts established flows at their next packet.
 *
 * Cost: a VIP without ranges pays one branch on a flag it has loaded anyway
 * (vip_info.flags on the ring path, the owners value on a conntrack hit); a
 * VIP with ranges pays one LPM trie lookup of (vip_id, saddr).

 */
#ifndef RINGLB_SRC_RANGES_H
#define RINGLB_SRC_RANGES_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RINGLB_MAX_SRC_RANGES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ringlb_src_key);
	__type(value, __u32);
} src_ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__type(value, __u64);
} src_drops SEC(".maps");

/* 1 when the flow's source is inside one of vip_id's ranges, else 0 (and the
 * packet is counted as the VIP's source-range drop). */
static __always_inline int ringlb_src_allowed(__u32 vip_id, const struct ringlb_flow *flow)
{
	struct ringlb_src_key k = {
		.prefixlen = 32 + 128,
		.vip_id = vip_id,
	};

	__builtin_memcpy(k.addr, flow->saddr, 16);
	if (bpf_map_lookup_elem(&src_ranges, &k))
		return 1;
	__u64 *d = bpf_map_lookup_elem(&src_drops, &vip_id);
	if (d)
		*d += 1;
	return 0;
}

#endif /* RINGLB_SRC_RANGES_H */
