/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * affinity.h - sessionAffinity: ClientIP with its timeout. A new flow of a
 * VIP with affinity (RINGLB_VIP_F_CLIENT_AFFINITY and a timeout in the flags)
 * takes the pod its client's last new flow took, when that was within the
 * timeout and the pod is still the VIP's (same backend id, same generation,
 * owned by the VIP) and in its ring (a terminating pod kept only for its
 * established flows is not, RINGLB_OWNER_F_DRAINING); otherwise the ring chooses (by the client's address, so
 * every edge chooses the same pod while the rings agree) and the choice is
 * recorded. A change of the backend set therefore moves no client whose pod
 * stays, and a removed pod's clients move on their next new flow (its id is
 * tombstoned or given to another pod: generation or owner differ).
 *
 * The timeout runs from the client's last new flow, as kube-proxy's: packets
 * of established flows follow conntrack and do not refresh it.
 *
 * Cost: a VIP without affinity pays nothing (the flag is tested on the ring
 * path, which loads it anyway); a new flow of a VIP with affinity one clock
 * read and one LRU hash lookup, and an update when the ring chose.
 */
#ifndef RINGLB_AFFINITY_H
#define RINGLB_AFFINITY_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RINGLB_AFFINITY_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct ringlb_affinity_key);
	__type(value, struct ringlb_affinity_value);
} affinity SEC(".maps");

/* The affinity timeout of a VIP entry in ns; 0: no table (hashing only). */
static __always_inline __u64 ringlb_affinity_timeout_ns(const struct ringlb_vip_info *vip)
{
	if (!(vip->flags & RINGLB_VIP_F_CLIENT_AFFINITY))
		return 0;
	return (__u64)(vip->flags >> RINGLB_VIP_AFFINITY_SHIFT) * 1000000000ULL;
}

/* The clock of the entries' times, CLOCK_MONOTONIC ns: the coarse one (a
 * tick's resolution is plenty for timeouts in seconds, and it measured about
 * 14 ns cheaper than bpf_ktime_get_ns on the SYN path here: medians of +54
 * and +68 ns over six and three runs of xdp-bench --only ranges). The coarse
 * helper needs 5.11; kernels before 5.12 get the build without the flow
 * filter (-DRINGLB_NO_FLOW_FILTER, no atomic OR), which reads the precise
 * clock. */
static __always_inline __u64 ringlb_affinity_now(void)
{
#ifdef RINGLB_NO_FLOW_FILTER
	return bpf_ktime_get_ns();
#else
	return bpf_ktime_get_coarse_ns();
#endif
}

static __always_inline void ringlb_affinity_key_of(struct ringlb_affinity_key *k,
						   const struct ringlb_flow *flow,
						   __u32 vip_id)
{
	__builtin_memcpy(k->saddr, flow->saddr, 16);
	k->vip_id = vip_id;
	k->family = flow->family;
}
#endif /* RINGLB_AFFINITY_H */
