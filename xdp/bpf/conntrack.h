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
 * But first it asks the flow filter (flow_filter.h), a superset of the
 * conntrack keys that every insert here adds to: when the flow's slot is
 * clear no entry can exist, and the SYN skips the lookup (the lookup of a new
 * 5-tuple is a miss in a cold bucket, ~200 ns; the filter is one bit in
 * 64 KiB). A set slot means the lookup and rewrite as before.
 *
 * Floods of other packets: a spoofed flood of ACKs or UDP datagrams from new
 * 5-tuples would insert one entry each and evict established flows of every
 * VIP. So each VIP may insert at most ringlb_ct_insert_budget new entries per
 * CPU per window of at least a second (ct_budget, ringlb_ct_budget_take); a
 * new flow's packet over the budget is forwarded by the ring and inserts
 * nothing (counted ct_over_budget): the flow is kept by the ring alone, and
 * its next packet tries again. A stale entry's rewrite is not budgeted (it replaces an entry,
 * and only a backend change makes one). The budget is a .rodata constant the
 * loader sets (0 = no limit: the verifier then drops the check).
 *
 * Build flag: -DRINGLB_NO_FLOW_FILTER, no flow filter (flow_filter.h): the
 * build for kernels without BPF atomic OR (before 5.12), where every SYN
 * looks its 5-tuple up.
 */
#ifndef RINGLB_CONNTRACK_H
#define RINGLB_CONNTRACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"
#include "flow_filter.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RINGLB_CT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU); /* per-CPU LRU lists, shared entries */
	__type(key, struct ringlb_flow);
	__type(value, struct ringlb_ct_value);
} conntrack SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__type(value, struct ringlb_ct_budget);
} ct_budget SEC(".maps");

/* New conntrack entries a VIP may insert per CPU per window; 0 = no limit.
 * Set by the loader before the program is verified (XdpOptions). */
volatile const __u32 ringlb_ct_insert_budget = 0;

#define RINGLB_CT_BUDGET_WINDOW_NS 1000000000ULL

/* Takes one insert from VIP vip_id's budget on this CPU: 1 if there was
 * room (or no limit), 0 if the window's budget is spent. A window opens at
 * an insert, admits `budget` inserts, and lasts at least a second: the next
 * one opens at the first insert after both. So the clock is read only to
 * open a window (and by the packets a spent window turns away), not by every
 * insert. A VIP inserts at most `budget` entries per CPU per second on
 * average, and twice that in any one second (a window's last inserts and the
 * next one's first). Per-CPU state, and XDP runs with migration off: no
 * atomics. */
static __always_inline int ringlb_ct_budget_take(__u32 vip_id)
{
	__u32 budget = ringlb_ct_insert_budget;

	if (!budget)
		return 1;
	struct ringlb_ct_budget *b = bpf_map_lookup_elem(&ct_budget, &vip_id);
	if (!b)
		return 1;
	if (b->used == 0 || b->used >= budget) {
		__u64 now = bpf_ktime_get_ns();

		if (b->used && now - b->start < RINGLB_CT_BUDGET_WINDOW_NS)
			return 0;
		b->start = now;
		b->used = 0;
	}
	b->used += 1;
	return 1;
}

/* What step 1 found out about a SYN, for ringlb_ct_record. */
struct ringlb_ct_syn {
	struct ringlb_ct_value *old; /* the 5-tuple's entry; NULL: none, or not looked up */
	__u32 hash;                  /* the flow hash; valid when `hashed` */
	__u32 hashed;
	__u32 filtered;              /* the flow filter proved no entry exists: no lookup */
};

/* The 5-tuple's entry (NULL for a SYN, whose entry goes to syn->old). */
static __always_inline struct ringlb_ct_value *ringlb_ct_lookup(const struct ringlb_flow *flow,
								int syn, struct ringlb_ct_syn *s)
{
	if (!syn)
		return bpf_map_lookup_elem(&conntrack, flow);
	if (RINGLB_FLOW_FILTER) {
		s->hash = ringlb_flow_hash_of(flow);
		s->hashed = 1;
		if (!ringlb_flow_maybe(s->hash)) {
			s->filtered = 1;
			return 0;
		}
	}
	s->old = bpf_map_lookup_elem(&conntrack, flow);
	return 0;
}

/* The flow hash the ring needs: a SYN's from step 1, else computed now. */
static __always_inline __u32 ringlb_ct_flow_hash(const struct ringlb_flow *flow,
						 const struct ringlb_ct_syn *s)
{
	return s->hashed ? s->hash : ringlb_flow_hash_of(flow);
}

/* Records the ring's choice (bid, gen) for a flow conntrack did not answer
 * (`stale`: it had an entry naming a retired backend); `hash` is the flow's
 * hash, vip_id its VIP's. Returns the RINGLB_ST_* counter of what it did, 0
 * for a plain insert. */
static __always_inline __u32 ringlb_ct_record(const struct ringlb_flow *flow, int syn,
					      const struct ringlb_ct_syn *s, __u32 hash,
					      __u32 bid, __u32 gen, __u32 vip_id, int stale)
{
	if (syn) {
		struct ringlb_ct_value *old = s->old;

		if (old && (old->backend_id != bid || old->gen != gen)) {
			/* one 8-byte store: a reader on another CPU sees the old
			 * pair or the new one, never half of each */
			*(__u64 *)old = ((__u64)gen << 32) | bid;
			return RINGLB_ST_CT_SYN_REWRITE;
		}
		return s->filtered ? RINGLB_ST_CT_SYN_FILTERED : RINGLB_ST_CT_SYN_RING;
	}
	if (!stale && !ringlb_ct_budget_take(vip_id))
		return RINGLB_ST_CT_OVER_BUDGET;
	struct ringlb_ct_value nv = { .backend_id = bid, .gen = gen };
	bpf_map_update_elem(&conntrack, flow, &nv, BPF_ANY);
	/* after the insert: flow_filter.h says why this order */
	if (RINGLB_FLOW_FILTER)
		ringlb_flow_filter_set(hash);
	return 0;
}

#endif /* RINGLB_CONNTRACK_H */
