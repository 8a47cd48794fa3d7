/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_bench.h - benchmark builds only (-DRINGLB_BENCH_RESTORE; never attached).
 *
 * BPF_PROG_TEST_RUN with repeat > 1 runs a program over and over on ONE skb:
 * after the first run, the decap program would see its own output (a plain,
 * already translated packet: the pass-through path), and the reply program a
 * packet whose source is already the VIP (no flow: pass-through again). The
 * benchmark build therefore saves the first bytes of the frame (every byte
 * either program can change: Ethernet, outer and inner IP headers, the TCP
 * header with options) before the program runs, and afterwards puts the
 * removed outer header's room back (bpf_skb_adjust_room) and the saved bytes
 * over it (bpf_skb_store_bytes). Every repetition then takes the same path as
 * the first. The figures of these builds include that save and restore, so
 * they slightly over-state the cost of the production program (node-bench
 * reports the save + store part alone on a packet that is not ours).
 */
#ifndef RINGLB_NODE_BENCH_H
#define RINGLB_NODE_BENCH_H

#ifdef RINGLB_BENCH_RESTORE

/* Ethernet + outer IPv6 + inner IPv6 + TCP with 40 bytes of options is 154:
 * frames longer than this are saved in part, and the tail never changes. */
#define NODE_BENCH_SAVE 160

struct node_bench_save {
	__u8 bytes[NODE_BENCH_SAVE];
	__u32 len; /* skb->len before the program ran */
	__u32 n;   /* bytes saved */
};

/* hides a value from clang's range analysis so the bounds below stay */
#define node_bench_opaque(v) asm volatile("" : "+r"(v))

static __always_inline void node_bench_save(struct __sk_buff *skb, struct node_bench_save *s)
{
	/* 64-bit, so that clang compares the register it passes (a 32-bit
	 * value gets a zero-extended copy, and the bound lands on the copy) */
	__u64 n = skb->len;

	s->len = n;
	s->n = 0;
	node_bench_opaque(n);
	if (n > NODE_BENCH_SAVE)
		n = NODE_BENCH_SAVE;
	if (n < 1)
		return;
	if (bpf_skb_load_bytes(skb, 0, s->bytes, n) == 0)
		s->n = n;
}

/* Returns 0, or -1 when the frame could not be put back. */
static __always_inline int node_bench_restore(struct __sk_buff *skb, struct node_bench_save *s)
{
	__u64 n = s->n;

	if (skb->len < s->len &&
	    bpf_skb_adjust_room(skb, (__s32)(s->len - skb->len), BPF_ADJ_ROOM_MAC, 0))
		return -1;
	node_bench_opaque(n);
	if (n > NODE_BENCH_SAVE)
		n = NODE_BENCH_SAVE;
	if (n < 1)
		return -1;
	return bpf_skb_store_bytes(skb, 0, s->bytes, n, 0) ? -1 : 0;
}

#endif /* RINGLB_BENCH_RESTORE */
#endif /* RINGLB_NODE_BENCH_H */
