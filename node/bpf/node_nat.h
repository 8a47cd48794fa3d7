/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_nat.h - rewriting one address or port with its checksums, through the
 * kernel's csum helpers so the skb's checksum state stays right:
 *
 *  - IPv4 address: bpf_l3_csum_replace on the header checksum, and
 *    bpf_l4_csum_replace with BPF_F_PSEUDO_HDR on the TCP/UDP checksum
 *    (correct for CHECKSUM_NONE/UNNECESSARY, COMPLETE and PARTIAL).
 *  - IPv6 address: bpf_csum_diff of the 16 bytes, then bpf_l4_csum_replace
 *    with the diff. BPF_F_PSEUDO_HDR is right for PARTIAL (GSO/TSO replies
 *    leaving a pod: the field holds only the pseudo-header sum) but, before
 *    Linux 6.16's BPF_F_IPV6, it also moves skb->csum for COMPLETE, which is
 *    wrong for IPv6 (no header checksum absorbs the change). So the reply path
 *    (egress: PARTIAL, never COMPLETE) passes the flag, and the ingress path
 *    (NIC receive: COMPLETE, never PARTIAL) does not.
 *  - Port: a 2-byte replace, never a pseudo-header field.
 *  - UDP: BPF_F_MARK_MANGLED_0 keeps a zero (absent, IPv4) checksum zero and
 *    turns a computed zero into 0xffff.
 */
#ifndef RINGLB_NODE_NAT_H
#define RINGLB_NODE_NAT_H

#include "node_parse.h"

static __always_inline __u64 node_l4_flags(__u8 proto)
{
	return proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Rewrites the source (is_src) or destination address of the IP header `l`
 * from `old` to `new`, fixing the IPv4 header checksum and the L4 checksum at
 * frame offset `l4_csum`. Returns 0 or a negative error. */
static __always_inline int node_rewrite_addr(struct __sk_buff *skb, const struct node_l3 *l,
					     int is_src, __u32 l4_csum, __u32 *old, __u32 *new,
					     __u64 l4flags, int v6_pseudo)
{
	if (l->family == RINGLB_NODE_AF_INET) {
		__u32 off = l->off + (is_src ? offsetof(struct iphdr, saddr)
					     : offsetof(struct iphdr, daddr));
		if (bpf_l4_csum_replace(skb, l4_csum, old[0], new[0], BPF_F_PSEUDO_HDR | 4 | l4flags))
			return -1;
		if (bpf_l3_csum_replace(skb, l->off + offsetof(struct iphdr, check), old[0], new[0], 4))
			return -1;
		return bpf_skb_store_bytes(skb, off, &new[0], 4, 0);
	}
	__u32 off = l->off + (is_src ? offsetof(struct ipv6hdr, saddr)
				     : offsetof(struct ipv6hdr, daddr));
	__s64 diff = bpf_csum_diff(old, 16, new, 16, 0);
	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, l4_csum, 0, diff, (v6_pseudo ? BPF_F_PSEUDO_HDR : 0) | l4flags))
		return -1;
	return bpf_skb_store_bytes(skb, off, new, 16, 0);
}

/* Rewrites the port at frame offset `port_off` and the L4 checksum. */
static __always_inline int node_rewrite_port(struct __sk_buff *skb, __u32 port_off, __u32 l4_csum,
					     __u16 old, __u16 new, __u64 l4flags)
{
	if (bpf_l4_csum_replace(skb, l4_csum, old, new, 2 | l4flags))
		return -1;
	return bpf_skb_store_bytes(skb, port_off, &new, 2, 0);
}

/* Reads the 16-bit value at `off` (0 if it cannot be read). */
static __always_inline __u16 node_load16(struct __sk_buff *skb, __u32 off)
{
	__u16 v = 0;
	bpf_skb_load_bytes(skb, off, &v, 2);
	return v;
}

#endif /* RINGLB_NODE_NAT_H */
