/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * conntrack.h - the conntrack map and when the program writes it.
 *
 * A flow's entry is inserted by its first packet that is not a SYN (the
 * handshake's ACK, or a UDP flow's first datagram), not by the SYN. The SYN
 * follows the ring, which is what the ACK's insert will find unless the ring
 * changed within the round trip. Why:
 *   - cost: a new flow's SYN pays no LRU insert (the insert, with its
 *     free-list pop and cold element, was ~3/4 of a SYN's cost; docs/bench-xdp.md)
 *   - SYN floods: spoofed SYNs, which never send the ACK, insert nothing, so
 *     they cannot evict established flows of any VIP from the LRU
 * A SYN still looks its 5-tuple up: an entry left by an earlier connection on
 * the same ports that names another backend than the ring (the ring changed
 * since) is rewritten in place, so the new connection's ACK follows its SYN.
 *
 * Build flags (benchmark-only variants):
 *   -DRINGLB_CT_INSERT_ON_SYN restores the SYN insert (and the SYN skipping
 *   the lookup): the program before this change;
 *   -DRINGLB_BENCH_SYN_NO_LOOKUP: a SYN does not look its 5-tuple up (so it
 *   cannot rewrite a reused 5-tuple's old entry). It shows what that lookup
 *   costs: a conntrack miss is a cold bucket in a 4 MiB array, ~200 ns by S.
 */
#ifndef RINGLB_CONNTRACK_H
#define RINGLB_CONNTRACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RINGLB_CT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU); /* per-CPU LRU lists, shared entries */
	__type(key, struct ringlb_flow);
	__type(value, struct ringlb_ct_value);
} conntrack SEC(".maps");

#ifdef RINGLB_CT_INSERT_ON_SYN
#define RINGLB_SYN_INSERTS 1
#else
#define RINGLB_SYN_INSERTS 0
#endif

/* The 5-tuple's entry, also for a SYN (NULL when the old build skips it). */
static __always_inline struct ringlb_ct_value *ringlb_ct_lookup(const struct ringlb_flow *flow,
								int syn)
{
	if (syn && RINGLB_SYN_INSERTS)
		return 0;
#ifdef RINGLB_BENCH_SYN_NO_LOOKUP
	if (syn)
		return 0;
#endif
	return bpf_map_lookup_elem(&conntrack, flow);
}

/* Records the ring's choice (bid, gen) for a flow conntrack did not answer.
 * `old` is a SYN's entry (its lookup above), unused otherwise. Returns the
 * RINGLB_ST_* counter of what it did, 0 for a plain insert. */
static __always_inline __u32 ringlb_ct_record(const struct ringlb_flow *flow, int syn,
					      struct ringlb_ct_value *old, __u32 bid, __u32 gen)
{
	if (syn && !RINGLB_SYN_INSERTS) {
		if (old && (old->backend_id != bid || old->gen != gen)) {
			/* one 8-byte store: a reader on another CPU sees the old
			 * pair or the new one, never half of each */
			*(__u64 *)old = ((__u64)gen << 32) | bid;
			return RINGLB_ST_CT_SYN_REWRITE;
		}
		return RINGLB_ST_CT_SYN_RING;
	}
	struct ringlb_ct_value nv = { .backend_id = bid, .gen = gen };
	bpf_map_update_elem(&conntrack, flow, &nv, BPF_ANY);
	return 0;
}

#endif /* RINGLB_CONNTRACK_H */
