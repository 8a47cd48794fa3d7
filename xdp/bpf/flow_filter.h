/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * flow_filter.h - a presence filter of the conntrack keys, so that a new
 * flow's SYN skips its conntrack lookup (a miss: a cold bucket in the LRU's
 * 4 MiB bucket array, ~200 ns by method S; docs/bench-xdp.md).
 *
 * One bit per slot; a flow's slot is the top RINGLB_FLOW_FILTER_BITS bits of
 * its flow hash (flow_hash.h: the hash the SYN computes for the ring anyway;
 * the ring uses hash % M, a prime, so the filter's slots and the ring's are
 * unrelated). A clear bit proves that no conntrack entry of the flow exists;
 * a set one (the flow's entry, or another flow's in the same slot) means the
 * SYN looks up as before. Bits, not bytes: the filter's read is itself a
 * cache (and TLB) miss, cheaper the smaller the filter, and 2^18 slots in
 * bits are 64 KiB where bytes were 512 KiB (SYN 232-240 ns against 328-331,
 * docs/bench-xdp.md). A bit is set with one atomic OR (BPF_ATOMIC_OR, kernel
 * 5.12+), so concurrent setters on other CPUs lose nothing; the edge probes
 * for it and loads the build without the filter (-DRINGLB_NO_FLOW_FILTER,
 * every SYN looks up) on a kernel without it (xdp/src/xdp.rs).
 *
 * Two halves, interleaved (slot s of half h is bit 2*s + h of the words: a
 * set ORs both with one instruction, in one word), and `active`, the half
 * SYNs read. The program sets a key's slot in BOTH halves right AFTER its
 * conntrack insert returns (ringlb_ct_record). Bits never clear otherwise,
 * so the loader (xdp/src/flow_filter.rs) rebuilds periodically:
 *   1. clear the inactive half I (an atomic AND per word through the mmap,
 *      which leaves the active half's bits and concurrent sets alone),
 *   2. walk the conntrack keys (BPF_MAP_LOOKUP_BATCH) and set each key's slot
 *      in I, while the program keeps setting both halves,
 *   3. flip `active` to I.
 * Why no live key K is missing from the active half after step 3: take K's
 * last insert (its element is in the map from then on, unmoved: a later
 * insert or delete of K would be a later event), and its slot set S, which
 * follows the insert (S is the OR, or the read that found both bits set).
 *   - S came after step 1's clear of that bit: the bit stays 1 in I.
 *   - S came before it: then the insert completed before step 1 ended, so
 *     K's element sat, unmoved, in its bucket for the whole walk of step 2,
 *     which copies every bucket whole under its lock: step 2 set the bit.
 * Either way I holds K's slot at the flip, and I is not cleared again before
 * the next rebuild makes it the inactive half, an interval (30 s) later; a
 * SYN reads `active` and then a bit of that half within microseconds. The
 * word's address depends on `active`, which orders the two loads even on
 * weakly ordered CPUs. Keys inserted after the flip set both halves.
 * Until its first rebuild a loader that may share pinned maps with a running
 * program (which may not set this filter) sets every bit: every SYN looks up,
 * as without the filter.
 *
 * Size: 2 x 2^18 bits (64 KiB + 64 bytes). False positives, i.e. SYNs that
 * still look up: the filled share of the active half, 1 - e^(-n / 2^18) for
 * n entries after a rebuild: 0.4 % at 1,000 flows, 39 % at 131,072, 63 % at
 * a full LRU (262,144), plus the slots of entries evicted since.
 *
 * Build flags (benchmark-only variants, and the build for kernels without
 * BPF_ATOMIC_OR): -DRINGLB_NO_FLOW_FILTER: a SYN always looks up, inserts set
 * nothing (the program before the filter); -DRINGLB_FLOW_FILTER_BITS=n: 2^n
 * slots per half (the loader reads the size from the map).
 */
#ifndef RINGLB_FLOW_FILTER_H
#define RINGLB_FLOW_FILTER_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"
#include "flow_hash.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ringlb_flow_filter);
} flow_filter SEC(".maps");

#ifdef RINGLB_NO_FLOW_FILTER
#define RINGLB_FLOW_FILTER 0
#else
#define RINGLB_FLOW_FILTER 1
#endif

static __always_inline __u32 ringlb_flow_hash_of(const struct ringlb_flow *f)
{
	return ringlb_flow_hash(f->saddr, f->daddr, f->sport, f->dport, f->proto);
}

static __always_inline __u32 ringlb_flow_filter_slot(__u32 hash)
{
	return hash >> (32 - RINGLB_FLOW_FILTER_BITS);
}

/* 0 = no conntrack entry of the flow with this hash can exist. */
static __always_inline int ringlb_flow_maybe(__u32 hash)
{
	__u32 zero = 0;
	struct ringlb_flow_filter *f = bpf_map_lookup_elem(&flow_filter, &zero);

	if (!f)
		return 1;
	__u32 i = (ringlb_flow_filter_slot(hash) << 1) | (f->active & 1);
	/* verifiers before 6.12 lose the bounds of an OR of two bounded
	 * scalars (5.10 and 6.1 refused the load): mask again after a barrier
	 * the compiler cannot see through, so the mask stays in the object */
	asm volatile("" : "+r"(i));
	i &= (2u << RINGLB_FLOW_FILTER_BITS) - 1;
	return (f->word[i >> 6] >> (i & 63)) & 1;
}

/* Sets the flow's slot in both halves (after its conntrack insert). */
static __always_inline void ringlb_flow_filter_set(__u32 hash)
{
	__u32 zero = 0;
	struct ringlb_flow_filter *f = bpf_map_lookup_elem(&flow_filter, &zero);

	if (!f)
		return;
	__u32 s = ringlb_flow_filter_slot(hash);
	__u64 *w = &f->word[s >> 5];
	__u64 both = 3ULL << ((s & 31) << 1);
	/* already set (the common case once a slot is in use): no locked
	 * instruction, no cache line taken from the other CPUs */
	if ((*w & both) != both)
		__sync_fetch_and_or(w, both);
}

#endif /* RINGLB_FLOW_FILTER_H */
