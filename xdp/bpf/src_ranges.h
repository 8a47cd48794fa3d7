/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * src_ranges.h - spec.loadBalancerSourceRanges: a VIP whose Service lists
 * source ranges forwards only packets from inside them. The check runs on
 * every packet of such a VIP, before the ring and before any conntrack
 * insert, and on a conntrack hit too (before the entry is used), so that
 * narrowing the ranges cuts established flows at their next packet.
 *
 * Where the ranges are (abi.h): a VIP with 1..RINGLB_SRC_SET_NETS of them
 * has a set (src_set_of[vip_id] -> src_sets[set]), scanned in place; a VIP
 * with more, or with none of its family (closed), has them in the LPM trie
 * src_ranges, keyed by (vip_id, prefix).
 *
 * Cost: a VIP without ranges pays one branch on a flag it has loaded anyway
 * (vip_info.flags on the ring path, the owners value on a conntrack hit); a
 * VIP with a set pays two inlined array reads and up to 8 masked compares; a
 * VIP with more ranges one LPM trie lookup (a helper call and a trie walk).
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
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_MAX_SRC_SETS);
	__type(key, __u32);
	__type(value, struct ringlb_src_set);
} src_sets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__type(value, __u32);
} src_set_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__type(value, __u64);
} src_drops SEC(".maps");

/* 1 when the flow's source is inside one of the set's nets. An IPv4 net
 * has words 1..3 of its address and mask zero, and an IPv4 source too:
 * word 0 decides, and the IPv4 loop compares it alone. */
static __always_inline int ringlb_src_in_set(const struct ringlb_src_set *set,
					     const struct ringlb_flow *flow)
{
	const __u32 *s = flow->saddr;
	__u32 n = set->n;

	/* bounded loops (Linux 5.3+); clang may unroll them */
	if (flow->family == RINGLB_AF_INET) {
		for (__u32 i = 0; i < RINGLB_SRC_SET_NETS; i++) {
			if (i >= n)
				break;
			if ((s[0] & set->net[i].mask[0]) == set->net[i].addr[0])
				return 1;
		}
		return 0;
	}
	for (__u32 i = 0; i < RINGLB_SRC_SET_NETS; i++) {
		if (i >= n)
			break;
		const struct ringlb_src_net *net = &set->net[i];
		if ((((s[0] & net->mask[0]) ^ net->addr[0]) |
		     ((s[1] & net->mask[1]) ^ net->addr[1]) |
		     ((s[2] & net->mask[2]) ^ net->addr[2]) |
		     ((s[3] & net->mask[3]) ^ net->addr[3])) == 0)
			return 1;
	}
	return 0;
}

/* 1 when the flow's source is inside one of vip_id's ranges, else 0 (and the
 * packet is counted as the VIP's source-range drop). */
static __always_inline int ringlb_src_allowed(__u32 vip_id, const struct ringlb_flow *flow)
{
	__u32 *set_id = bpf_map_lookup_elem(&src_set_of, &vip_id);

	if (set_id && *set_id) {
		struct ringlb_src_set *set = bpf_map_lookup_elem(&src_sets, set_id);
		if (set && ringlb_src_in_set(set, flow))
			return 1;
	} else {
		struct ringlb_src_key k = {
			.prefixlen = 32 + 128,
			.vip_id = vip_id,
		};

		__builtin_memcpy(k.addr, flow->saddr, 16);
		if (bpf_map_lookup_elem(&src_ranges, &k))
			return 1;
	}
	__u64 *d = bpf_map_lookup_elem(&src_drops, &vip_id);
	if (d)
		*d += 1;
	return 0;
}

#endif /* RINGLB_SRC_RANGES_H */
