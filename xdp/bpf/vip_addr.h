/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * vip_addr.h - a packet to one of this edge's own VIP addresses (vip_addrs,
 * vip_filter.h) that no vips entry forwards. The edge's kernel does not hold
 * the VIP addresses (they are the edge's by BGP only), so such a packet passed
 * to it is routed back to the ToR, which routes it to an edge again: a loop
 * until its TTL runs out. The program answers or drops it instead:
 *
 *   ICMP echo request (type 8, code 0, no IP options) or ICMPv6 echo request
 *     (type 128, code 0): answered from the VIP in place, XDP_TX
 *     (ringlb_echo_reply)                               RINGLB_ST_ICMP_ECHO
 *   any other ICMP/ICMPv6 (errors quoting a flow, echo replies, an echo
 *     request with IP options): XDP_DROP                RINGLB_ST_DROP_VIP_ICMP
 *   TCP/UDP to a port and protocol no vips entry (nor a port-0 wildcard)
 *     has: XDP_DROP, decided by the main program once its lookups miss
 *                                                       RINGLB_ST_DROP_NO_SERVICE
 *   a fragment, IPv6 extension headers, any other protocol: XDP_DROP
 *                                                       RINGLB_ST_DROP_VIP_OTHER
 *   IPIP that the failover path (failover.h) cannot parse, or whose inner
 *     packet no failover alias takes: XDP_DROP, decided there and by the
 *     main program         RINGLB_ST_DROP_VIP_OTHER, RINGLB_ST_DROP_DECAP_NO_ALIAS
 *
 * The Bloom filter stays first: an address whose bit is clear is passed
 * without the vip_addrs lookup, and TCP/UDP to a served VIP:port never gets
 * here.
 */
#ifndef RINGLB_VIP_ADDR_H
#define RINGLB_VIP_ADDR_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include "abi.h"
#include "parse.h"

#define RINGLB_ECHO_TTL 64
#define RINGLB_ICMP_ECHO_REQUEST   8
#define RINGLB_ICMP_ECHO_REPLY     0
#define RINGLB_ICMPV6_ECHO_REQUEST 128
#define RINGLB_ICMPV6_ECHO_REPLY   129

/* Whether ringlb_parse's reason leaves pkt.flow's destination read and names
 * a packet that the kernel would route back out were it to a VIP address. */
static __always_inline int ringlb_vip_addr_reason(int reason)
{
	return reason == RINGLB_ST_PASS_ICMP || reason == RINGLB_ST_PASS_FRAGMENT ||
	       reason == RINGLB_ST_PASS_IPV6_EXT || reason == RINGLB_ST_PASS_OTHER_L4;
}

/* The one's-complement checksum at *sum after a 16-bit word of what it
 * covers changed from old to new (RFC 1624, eqn. 3; network order in and
 * out, which the sum does not mind). */
static __always_inline void ringlb_csum_replace(__u16 *sum, __u16 old, __u16 new)
{
	__u32 s = (__u16)~*sum;

	s += (__u16)~old;
	s += new;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	*sum = (__u16)~s;
}

/* Turns an echo request to the VIP into its echo reply, in place: MACs
 * swapped (a VLAN tag kept), addresses swapped, TTL / hop limit 64, the
 * type changed, the checksums updated for what changed (the rest of the IP
 * header, the identifier, sequence number and data stay the request's).
 * Returns 1 (the caller returns XDP_TX), or 0 with the frame unchanged when
 * it is no echo request the edge answers. */
static __always_inline int ringlb_echo_reply(void *data, void *data_end,
					     const struct ringlb_pkt *pkt)
{
	__u32 l2 = pkt->l2_len == 18 ? 18 : 14;
	void *l3 = data + l2;
	__u8 *icmp;

	if (pkt->flow.family == RINGLB_AF_INET) {
		struct iphdr *iph = l3;
		if ((void *)(iph + 1) + 8 > data_end)
			return 0;
		if (iph->ihl != 5 || pkt->l3_len < sizeof(*iph) + 8)
			return 0;
		icmp = (void *)(iph + 1);
		if (icmp[0] != RINGLB_ICMP_ECHO_REQUEST || icmp[1] != 0)
			return 0;
		icmp[0] = RINGLB_ICMP_ECHO_REPLY;
		ringlb_csum_replace((__u16 *)(icmp + 2), bpf_htons(RINGLB_ICMP_ECHO_REQUEST << 8),
				    bpf_htons(RINGLB_ICMP_ECHO_REPLY << 8));
		/* swapped addresses leave the header's sum as it was */
		__u16 *ttl_proto = (__u16 *)&iph->ttl;
		__u16 old = *ttl_proto;
		__u32 a = iph->saddr;
		iph->saddr = iph->daddr;
		iph->daddr = a;
		iph->ttl = RINGLB_ECHO_TTL;
		ringlb_csum_replace(&iph->check, old, *ttl_proto);
	} else {
		struct ipv6hdr *ip6 = l3;
		__u8 a[16];
		if ((void *)(ip6 + 1) + 8 > data_end)
			return 0;
		if (pkt->l3_len < sizeof(*ip6) + 8)
			return 0;
		icmp = (void *)(ip6 + 1);
		if (icmp[0] != RINGLB_ICMPV6_ECHO_REQUEST || icmp[1] != 0)
			return 0;
		icmp[0] = RINGLB_ICMPV6_ECHO_REPLY;
		/* the pseudo header's sum is the same with the addresses swapped */
		ringlb_csum_replace((__u16 *)(icmp + 2), bpf_htons(RINGLB_ICMPV6_ECHO_REQUEST << 8),
				    bpf_htons(RINGLB_ICMPV6_ECHO_REPLY << 8));
		__builtin_memcpy(a, &ip6->saddr, 16);
		__builtin_memcpy(&ip6->saddr, &ip6->daddr, 16);
		__builtin_memcpy(&ip6->daddr, a, 16);
		ip6->hop_limit = RINGLB_ECHO_TTL;
	}
	struct ethhdr *eth = data;
	__u8 mac[ETH_ALEN];
	if ((void *)(eth + 1) > data_end)
		return 0; /* cannot happen: the IP header was read past it */
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	return 1;
}

/* A packet to one of our VIP addresses that ringlb_parse did not take for
 * TCP/UDP (ringlb_vip_addr_reason(reason)): answers an echo request
 * (*verdict XDP_TX, the frame rewritten) or drops it (XDP_DROP, untouched).
 * Returns the counter to bump. */
static __always_inline __u32 ringlb_vip_addr_verdict(void *data, void *data_end,
						     const struct ringlb_pkt *pkt, int reason,
						     int *verdict)
{
	*verdict = XDP_DROP;
	if (reason != RINGLB_ST_PASS_ICMP)
		return RINGLB_ST_DROP_VIP_OTHER;
	if (!ringlb_echo_reply(data, data_end, pkt))
		return RINGLB_ST_DROP_VIP_ICMP;
	*verdict = XDP_TX;
	return RINGLB_ST_ICMP_ECHO;
}

#endif /* RINGLB_VIP_ADDR_H */
