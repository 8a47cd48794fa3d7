/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_mss.h - lowering the MSS option of a SYN-ACK (never raising it).
 *
 * The client's segments reach the pod inside the edge's outer header (20
 * bytes IPv4, 40 IPv6), so the MSS the pod announces must leave room for it.
 * The SYN-ACK is small and linear, and never GSO; its checksum is either
 * complete (fixed here) or CHECKSUM_PARTIAL (then the option bytes are plain
 * data the device sums later, and bpf_l4_csum_replace leaves the field alone).
 */
#ifndef RINGLB_NODE_MSS_H
#define RINGLB_NODE_MSS_H

#include "node_nat.h"
#include "node_maps.h"

#define NODE_TCPOPT_EOL 0
#define NODE_TCPOPT_NOP 1
#define NODE_TCPOPT_MSS 2
#define NODE_TCP_MAX_OPTS 40
/* the option buffer is a power of two so that `& NODE_OPT_MASK` proves every
 * variable index in bounds to the verifier */
#define NODE_OPT_BUF 64
#define NODE_OPT_MASK (NODE_OPT_BUF - 1)
/* hides a value from clang's range analysis so it keeps the mask above */
#define node_opaque(v) asm volatile("" : "+r"(v))

static __always_inline __u8 node_opt(const __u8 *opts, __u32 i)
{
	node_opaque(i);
	return opts[i & NODE_OPT_MASK];
}

/* The option walk runs under bpf_loop (Linux 5.17): the verifier checks the
 * callback once, where an open-coded loop over variable option lengths made
 * it walk past a million instructions. */
struct node_mss_walk {
	__u8 opts[NODE_OPT_BUF];
	__u32 i;     /* offset of the next option */
	__u32 olen;  /* bytes of options */
	__s32 at;    /* offset of the MSS option; -1 = none */
};

static long node_mss_step(__u32 n, void *arg)
{
	struct node_mss_walk *w = arg;
	__u32 i = w->i;

	if (i >= w->olen || i >= NODE_TCP_MAX_OPTS - 1)
		return 1;
	__u8 kind = node_opt(w->opts, i);
	if (kind == NODE_TCPOPT_EOL)
		return 1;
	if (kind == NODE_TCPOPT_NOP) {
		w->i = i + 1;
		return 0;
	}
	__u8 len = node_opt(w->opts, i + 1);
	if (len < 2 || i + len > w->olen)
		return 1;
	if (kind == NODE_TCPOPT_MSS && len == 4) {
		w->at = i;
		return 1;
	}
	w->i = i + len;
	return 0;
}

/* Clamps the MSS option of the TCP header at `l4` (header length `hlen`) to
 * `mss` (host order). Returns 1 when lowered, 0 when left alone, -1 on error. */
static __always_inline int node_clamp_mss(struct __sk_buff *skb, __u32 l4, __u32 hlen, __u16 mss)
{
	struct node_mss_walk w = { .at = -1 };

	/* Check hlen before deriving olen from it, and bound olen with an
	 * instruction clang keeps: verifiers before 6.13 lose the link between the
	 * two registers and refuse a possibly negative length (docs/kernels.md). */
	if (mss == 0 || hlen <= 20 || hlen > 20 + NODE_TCP_MAX_OPTS)
		return 0;
	__u32 olen = hlen - 21; /* hlen > 20: olen - 1 */
	asm volatile("%0 &= 0x3f" : "+r"(olen));
	olen += 1; /* 1..64 by arithmetic, which every verifier follows */
	if (olen > NODE_TCP_MAX_OPTS)
		return 0;
	w.olen = olen;
	if (bpf_skb_load_bytes(skb, l4 + 20, w.opts, olen))
		return 0;
	bpf_loop(NODE_TCP_MAX_OPTS, node_mss_step, &w, 0);
	if (w.at < 0)
		return 0;
	__u32 i = w.at;
	__u16 old_be = (__u16)node_opt(w.opts, i + 2) | ((__u16)node_opt(w.opts, i + 3) << 8);
	if (bpf_ntohs(old_be) <= mss)
		return 0;
	__u16 new_be = bpf_htons(mss);
	__u32 at = 20 + i + 2; /* offset of the value inside the TCP header */
	/* The checksum sums 16-bit words from the header's start: a value at an
	 * odd offset counts byte-swapped (RFC 1071 byte order independence), so
	 * swap both sides of the replace. */
	__u16 from = old_be, to = new_be;
	if (at & 1) {
		from = (__u16)((from >> 8) | (from << 8));
		to = (__u16)((to >> 8) | (to << 8));
	}
	if (bpf_l4_csum_replace(skb, l4 + 16, from, to, 2))
		return -1;
	if (bpf_skb_store_bytes(skb, l4 + at, &new_be, 2, 0))
		return -1;
	return 1;
}

#endif /* RINGLB_NODE_MSS_H */
