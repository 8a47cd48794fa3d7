/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * failover.h - the receiving half of a failover VIP (docs/datapath.md,
 * Failover VIPs). Region A's edges send a VIP's traffic to region B's VIP,
 * IPIP-encapsulated like to a pod (outer destination = B's VIP). B's edge
 * takes an IPIP packet apart when its outer destination is one of its own
 * VIP addresses (vip_addrs in vip_filter.h, not the Bloom filter: exact) and
 * the outer header is a plain 20 bytes, and looks the inner packet up like any other: its
 * conntrack key carries RINGLB_FLOW_F_DECAP, and it is forwarded only by a
 * VIP entry flagged RINGLB_VIP_F_FAILOVER_ALIAS (the main program checks).
 * Nothing is moved here: the inner packet is parsed in place, and the encap
 * step rewrites the outer header (pkt.l2_len covers it), so a packet that
 * turns out not to be ours is passed untouched.
 *
 * Only from a sender in decap_senders (the other region's edges): anyone
 * else's IPIP to a VIP is dropped before its inner packet is looked at, so
 * a host that can reach the VIP cannot use the alias to reach the pods with
 * an inner source of its choosing.
 *
 * IPv4 outer headers only: an IPv6 outer header (4in6, 6in6) to a VIP is
 * not decapsulated (other_l4, like before).
 */
#ifndef RINGLB_FAILOVER_H
#define RINGLB_FAILOVER_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"
#include "parse.h"
#include "vip_filter.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RINGLB_MAX_DECAP_SENDERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ringlb_decap_sender_key);
	__type(value, __u8);
} decap_senders SEC(".maps");

/* After ringlb_parse returned RINGLB_PARSE_IPIP (pkt: the outer header):
 * 0 with pkt describing the inner IPv4 TCP/UDP packet, l2_len covering the
 * outer header and flow.flags = RINGLB_FLOW_F_DECAP; else the counter:
 * RINGLB_ST_PASS_DECAP_NOT_OURS (not to one of our VIP addresses: pass it),
 * RINGLB_ST_DROP_DECAP_SENDER (to one, from a sender not in decap_senders)
 * or RINGLB_ST_DROP_VIP_OTHER (to one, but not a packet the failover path
 * takes); both dropped: passed, they would loop (vip_addr.h). The caller
 * checked vip_filter. */
static __always_inline int ringlb_parse_decap(void *data, void *data_end, struct ringlb_pkt *pkt)
{
	__u32 l2 = pkt->l2_len == 18 ? 18 : 14;
	__u32 outer_len = pkt->l3_len, hlen = 0;
	struct iphdr *outer = data + l2;

	if (!ringlb_own_vip_addr(&pkt->flow))
		return RINGLB_ST_PASS_DECAP_NOT_OURS;
	if ((void *)(outer + 1) > data_end || outer->ihl != 5)
		return RINGLB_ST_DROP_VIP_OTHER;
	struct ringlb_decap_sender_key sender = { .prefixlen = 32, .addr = outer->saddr };
	if (!bpf_map_lookup_elem(&decap_senders, &sender))
		return RINGLB_ST_DROP_DECAP_SENDER;
	void *l3 = outer + 1;
	if (ringlb_parse_ip4(l3, data_end, pkt, &hlen))
		return RINGLB_ST_DROP_VIP_OTHER;
	/* the inner packet inside the outer one's length (not in padding) */
	if (pkt->l3_len + sizeof(*outer) > outer_len)
		return RINGLB_ST_DROP_VIP_OTHER;
	if (ringlb_parse_ports(l3, l3 + hlen, data_end, pkt))
		return RINGLB_ST_DROP_VIP_OTHER;
	pkt->l2_len = l2 + sizeof(*outer);
	pkt->flow.flags = RINGLB_FLOW_F_DECAP;
	return 0;
}

#endif /* RINGLB_FAILOVER_H */
