/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_icmp.h - ICMP errors about translated flows, on the reply path.
 *
 * A pod (or this node, forwarding to it) that cannot deliver a packet of a
 * translated flow answers with an ICMP error that embeds the packet as the
 * pod saw it: client:port -> pod:targetPort. The client only knows
 * client:port -> VIP:port, so the embedded destination is rewritten back to
 * VIP:port, and when the pod itself sent the error (outer source == embedded
 * destination) the outer source becomes the VIP too. Checksums fixed: the
 * embedded IPv4 header's, the embedded TCP/UDP checksum when the error
 * carries it, and the ICMP checksum over all of that (ICMPv6: plus the outer
 * source in its pseudo header).
 *
 * Errors handled: ICMP dest unreachable (incl. frag needed), time exceeded,
 * parameter problem; ICMPv6 dest unreachable, packet too big, time
 * exceeded, parameter problem.
 */
#ifndef RINGLB_NODE_ICMP_H
#define RINGLB_NODE_ICMP_H

#include "node_nat.h"
#include "node_maps.h"

#define NODE_ICMP_DEST_UNREACH 3
#define NODE_ICMP_TIME_EXCEEDED 11
#define NODE_ICMP_PARAMETERPROB 12
#define NODE_ICMPV6_DEST_UNREACH 1
#define NODE_ICMPV6_PARAMPROB 4

static __always_inline int node_icmp_is_error(const struct node_l3 *l, __u8 type)
{
	if (l->family == RINGLB_NODE_AF_INET)
		return type == NODE_ICMP_DEST_UNREACH || type == NODE_ICMP_TIME_EXCEEDED ||
		       type == NODE_ICMP_PARAMETERPROB;
	return type >= NODE_ICMPV6_DEST_UNREACH && type <= NODE_ICMPV6_PARAMPROB;
}

/* Applies a change of a 16-bit field (from -> to, raw) to the ICMP checksum
 * at `csum` (the field is ICMP payload: no pseudo header involved). */
static __always_inline int node_icmp_fix16(struct __sk_buff *skb, __u32 csum, __u16 from, __u16 to)
{
	return bpf_l4_csum_replace(skb, csum, from, to, 2);
}

/* Rewrites the embedded header `e` (pod -> VIP, target port -> VIP port).
 * `icsum` is the ICMP checksum's frame offset. */
static __always_inline int node_icmp_inner(struct __sk_buff *skb, const struct node_l3 *e,
					   __u32 icsum, struct ringlb_node_flow_value *fv,
					   __u16 old_port, int has_l4_csum)
{
	__u32 l4c = e->l4_off + node_l4_csum_off(e->proto);
	__u64 l4flags = node_l4_flags(e->proto);
	__u32 old[4], new[4];
	node_addr_copy(old, e->daddr);
	node_addr_copy(new, fv->vip);
	__u16 c0 = has_l4_csum ? node_load16(skb, l4c) : 0;

	if (e->family == RINGLB_NODE_AF_INET) {
		__u32 ipc = e->off + offsetof(struct iphdr, check);
		__u16 h0 = node_load16(skb, ipc);
		if (bpf_l3_csum_replace(skb, ipc, old[0], new[0], 4))
			return -1;
		if (has_l4_csum &&
		    bpf_l4_csum_replace(skb, l4c, old[0], new[0], 4 | l4flags))
			return -1;
		if (bpf_l4_csum_replace(skb, icsum, old[0], new[0], 4))
			return -1;
		if (node_icmp_fix16(skb, icsum, h0, node_load16(skb, ipc)))
			return -1;
		if (bpf_skb_store_bytes(skb, e->off + offsetof(struct iphdr, daddr), &new[0], 4, 0))
			return -1;
	} else {
		__s64 diff = bpf_csum_diff(old, 16, new, 16, 0);
		if (diff < 0)
			return -1;
		if (has_l4_csum && bpf_l4_csum_replace(skb, l4c, 0, diff, l4flags))
			return -1;
		if (bpf_l4_csum_replace(skb, icsum, 0, diff, 0))
			return -1;
		if (bpf_skb_store_bytes(skb, e->off + offsetof(struct ipv6hdr, daddr), new, 16, 0))
			return -1;
	}
	/* the embedded destination port: its own checksum, then the ICMP one */
	if (has_l4_csum && bpf_l4_csum_replace(skb, l4c, old_port, fv->vip_port, 2 | l4flags))
		return -1;
	if (node_icmp_fix16(skb, icsum, old_port, fv->vip_port))
		return -1;
	if (bpf_skb_store_bytes(skb, e->l4_off + 2, &fv->vip_port, 2, 0))
		return -1;
	if (has_l4_csum && node_icmp_fix16(skb, icsum, c0, node_load16(skb, l4c)))
		return -1;
	return 0;
}

/* The ICMP error in `l` (outer header) at the reply hook. Returns a
 * RINGLB_NODE_ST_* outcome; the caller returns TC_ACT_OK unless it is
 * RINGLB_NODE_ST_DROP_REWRITE. */
static __always_inline __u32 node_icmp_reply(struct __sk_buff *skb, const struct node_l3 *l)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *icmp = data + l->l4_off;
	struct node_l3 e = {};

	if ((void *)(icmp + 8) > data_end || !node_icmp_is_error(l, icmp[0]))
		return RINGLB_NODE_ST_EGRESS_PASS;
	__u16 eproto = l->family == RINGLB_NODE_AF_INET ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	if (node_parse_l3(data, data_end, l->l4_off + 8, eproto, &e) || e.frag || !node_is_tcp_udp(&e))
		return RINGLB_NODE_ST_EGRESS_PASS;
	__u16 *ports = data + e.l4_off;
	if ((void *)(ports + 2) > data_end)
		return RINGLB_NODE_ST_EGRESS_PASS;
	/* the embedded packet went client -> pod */
	struct ringlb_node_flow_key fk = {
		.client_port = ports[0],
		.pod_port = ports[1],
		.proto = e.proto,
		.family = e.family,
	};
	node_addr_copy(fk.client, e.saddr);
	node_addr_copy(fk.pod, e.daddr);
	struct ringlb_node_flow_value *hit = bpf_map_lookup_elem(&flows, &fk);
	if (!hit)
		return RINGLB_NODE_ST_ICMP_NO_FLOW;
	struct ringlb_node_flow_value fv = *hit;
	/* the embedded L4 checksum is fixed only when the error carries it (and,
	 * for UDP, when it is not zero: BPF_F_MARK_MANGLED_0 keeps zero) */
	__u32 l4c_end = e.l4_off + node_l4_csum_off(e.proto) + 2;
	int has_l4_csum = data + l4c_end <= data_end;
	int from_pod = node_addr_eq(l->saddr, e.daddr);
	__u32 icsum = l->l4_off + 2;

	if (node_icmp_inner(skb, &e, icsum, &fv, fk.pod_port, has_l4_csum))
		return RINGLB_NODE_ST_DROP_REWRITE;
	if (from_pod) {
		/* ICMPv4: the outer header checksum only. ICMPv6: the checksum's
		 * pseudo header holds the source too. */
		__u32 old[4], new[4];
		node_addr_copy(old, e.daddr);
		node_addr_copy(new, fv.vip);
		if (l->family == RINGLB_NODE_AF_INET) {
			if (bpf_l3_csum_replace(skb, l->off + offsetof(struct iphdr, check),
						old[0], new[0], 4) ||
			    bpf_skb_store_bytes(skb, l->off + offsetof(struct iphdr, saddr),
						&new[0], 4, 0))
				return RINGLB_NODE_ST_DROP_REWRITE;
		} else if (node_rewrite_addr(skb, l, 1, icsum, old, new, 0, 1)) {
			return RINGLB_NODE_ST_DROP_REWRITE;
		}
	}
	return RINGLB_NODE_ST_ICMP_XLATE;
}

#endif /* RINGLB_NODE_ICMP_H */
