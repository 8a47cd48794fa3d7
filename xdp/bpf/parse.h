/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * parse.h - verifier-proof header parsing for the ringlb XDP program:
 * Ethernet (+ one 802.1Q/802.1ad tag), IPv4 (with options), IPv6 (no
 * extension headers), TCP/UDP ports; IPv4 in IPv4 is reported
 * (RINGLB_PARSE_IPIP) for the failover decapsulation (failover.h). Every read is preceded by a bounds check
 * against data_end; on failure the caller gets a RINGLB_ST_* reason.
 */
#ifndef RINGLB_PARSE_H
#define RINGLB_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include "abi.h"

#define RINGLB_ETH_P_8021Q  0x8100
#define RINGLB_ETH_P_8021AD 0x88A8
#define RINGLB_IP_MF        0x2000
#define RINGLB_IP_OFFSET    0x1fff
#define RINGLB_IP_DF        0x4000
#define RINGLB_NEXTHDR_FRAGMENT 44
#define RINGLB_NEXTHDR_HOP      0
#define RINGLB_NEXTHDR_ROUTING  43
#define RINGLB_NEXTHDR_DEST     60
#define RINGLB_NEXTHDR_AUTH     51
#define RINGLB_IPPROTO_ICMPV6   58

/* A 16-bit length from the wire, with bounds every verifier can see. Verifiers
 * before 6.13 forget all bounds of a register on a byte swap (`be16`), and then
 * refuse `pointer + length`; clang drops a plain `& 0xffff` after the swap
 * (it knows the bits are clear), so the mask is an instruction it cannot see
 * through. docs/kernels.md has the trace. */
static __always_inline __u32 ringlb_wire_len(__u16 be)
{
	__u32 v = bpf_ntohs(be);
	asm volatile("%0 &= 0xffff" : "+r"(v));
	return v;
}

struct ringlb_vlan_hdr {
	__u16 tci;
	__u16 proto;
};

/* What the parser learned about one packet. */
struct ringlb_pkt {
	struct ringlb_flow flow;  /* the 5-tuple, network order (flags: RINGLB_FLOW_F_DECAP) */
	__u32 l2_len;             /* bytes before the inner L3 header: 14 or 18, and
				   * + 20 (the outer IPv4 header) for a decapsulated packet */
	__u32 l3_len;             /* inner L3 length: IPv4 tot_len, IPv6 40 + payload */
	__u16 frag_df;            /* be, IPv4 DF bit of the inner header (0 for IPv6) */
	__u8 tos;                 /* inner DSCP/ECN (IPv4 tos, IPv6 traffic class) */
	__u8 syn;                 /* 1 = TCP SYN without ACK: a connection's first packet */
};

/* ringlb_parse's answer for an IPv4 packet carrying IPv4 (IPIP): not a
 * counter. pkt holds the outer header's addresses and lengths; the caller
 * checks the outer destination and calls ringlb_parse_decap (failover.h). */
#define RINGLB_PARSE_IPIP (RINGLB_ST_MAX + 1)

/* The IPv4 header at l3: pkt gets its addresses, protocol, tos, DF and
 * length; *hlen its header length. Returns 0 (TCP/UDP), RINGLB_PARSE_IPIP, or
 * a RINGLB_ST_PASS_* reason. */
static __always_inline int ringlb_parse_ip4(void *l3, void *data_end, struct ringlb_pkt *pkt,
					    __u32 *hlen)
{
	struct iphdr *iph = l3;
	__u32 ihl;

	if ((void *)(iph + 1) > data_end)
		return RINGLB_ST_PASS_MALFORMED;
	ihl = iph->ihl;
	if (iph->version != 4 || ihl < 5)
		return RINGLB_ST_PASS_MALFORMED;
	pkt->l3_len = ringlb_wire_len(iph->tot_len);
	if (pkt->l3_len < ihl * 4 || l3 + pkt->l3_len > data_end)
		return RINGLB_ST_PASS_MALFORMED;
	pkt->flow.family = RINGLB_AF_INET;
	pkt->flow.proto = iph->protocol;
	pkt->flow.saddr[0] = iph->saddr;
	pkt->flow.daddr[0] = iph->daddr;
	pkt->tos = iph->tos;
	pkt->frag_df = iph->frag_off & bpf_htons(RINGLB_IP_DF);
	if (iph->frag_off & bpf_htons(RINGLB_IP_MF | RINGLB_IP_OFFSET))
		return RINGLB_ST_PASS_FRAGMENT;
	if (iph->protocol == IPPROTO_ICMP)
		return RINGLB_ST_PASS_ICMP;
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP) {
		if (iph->protocol == IPPROTO_IPIP)
			return RINGLB_PARSE_IPIP;
		return RINGLB_ST_PASS_OTHER_L4;
	}
	*hlen = (ihl & 0xf) * 4;
	return 0;
}

/* The TCP/UDP ports (and the SYN flag) at l4, inside the L3 packet at l3. */
static __always_inline int ringlb_parse_ports(void *l3, void *l4, void *data_end,
					      struct ringlb_pkt *pkt)
{
	/* sport and dport are the first 4 bytes of both TCP and UDP */
	__u16 *ports = l4;
	if ((void *)(ports + 2) > data_end)
		return RINGLB_ST_PASS_MALFORMED;
	/* The ports must lie inside the IP packet, not in Ethernet padding. */
	if ((__u32)((void *)(ports + 2) - l3) > pkt->l3_len)
		return RINGLB_ST_PASS_MALFORMED;
	pkt->flow.sport = ports[0];
	pkt->flow.dport = ports[1];
	if (pkt->flow.proto == IPPROTO_TCP) {
		/* byte 13 of the TCP header: CWR ECE URG ACK PSH RST SYN FIN */
		__u8 *tcp = l4;
		if ((void *)(tcp + 14) <= data_end &&
		    (__u32)((void *)(tcp + 14) - l3) <= pkt->l3_len)
			pkt->syn = (tcp[13] & 0x12) == 0x02;
	}
	return 0;
}

/* Returns 0 when pkt is a TCP/UDP packet worth a VIP lookup, RINGLB_PARSE_IPIP
 * for IPv4 in IPv4, else a RINGLB_ST_PASS_* reason. */
static __always_inline int ringlb_parse(void *data, void *data_end, struct ringlb_pkt *pkt)
{
	struct ethhdr *eth = data;
	__u16 proto;
	void *l3, *l4;

	if ((void *)(eth + 1) > data_end)
		return RINGLB_ST_PASS_MALFORMED;
	proto = eth->h_proto;
	l3 = eth + 1;
	pkt->l2_len = sizeof(*eth);
	if (proto == bpf_htons(RINGLB_ETH_P_8021Q) || proto == bpf_htons(RINGLB_ETH_P_8021AD)) {
		struct ringlb_vlan_hdr *vh = l3;
		if ((void *)(vh + 1) > data_end)
			return RINGLB_ST_PASS_MALFORMED;
		proto = vh->proto;
		l3 = vh + 1;
		pkt->l2_len += sizeof(*vh);
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		__u32 hlen = 0;
		int r = ringlb_parse_ip4(l3, data_end, pkt, &hlen);
		if (r)
			return r;
		l4 = l3 + hlen;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		__u8 nh;
		if ((void *)(ip6 + 1) > data_end)
			return RINGLB_ST_PASS_MALFORMED;
		if (ip6->version != 6)
			return RINGLB_ST_PASS_MALFORMED;
		pkt->l3_len = sizeof(*ip6) + ringlb_wire_len(ip6->payload_len);
		if (l3 + pkt->l3_len > data_end)
			return RINGLB_ST_PASS_MALFORMED;
		nh = ip6->nexthdr;
		pkt->flow.family = RINGLB_AF_INET6;
		pkt->flow.proto = nh;
		__builtin_memcpy(pkt->flow.saddr, &ip6->saddr, 16);
		__builtin_memcpy(pkt->flow.daddr, &ip6->daddr, 16);
		pkt->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		pkt->frag_df = 0;
		if (nh == RINGLB_NEXTHDR_FRAGMENT)
			return RINGLB_ST_PASS_FRAGMENT;
		if (nh == RINGLB_IPPROTO_ICMPV6)
			return RINGLB_ST_PASS_ICMP;
		if (nh == RINGLB_NEXTHDR_HOP || nh == RINGLB_NEXTHDR_ROUTING ||
		    nh == RINGLB_NEXTHDR_DEST || nh == RINGLB_NEXTHDR_AUTH)
			return RINGLB_ST_PASS_IPV6_EXT;
		/* IPv6 outer headers (IPv6/IPv4 in IPv6 to a VIP) are not
		 * decapsulated: other_l4 like any other protocol */
		if (nh != IPPROTO_TCP && nh != IPPROTO_UDP)
			return RINGLB_ST_PASS_OTHER_L4;
		l4 = l3 + sizeof(*ip6);
	} else {
		return RINGLB_ST_PASS_NOT_IP;
	}
	return ringlb_parse_ports(l3, l4, data_end, pkt);
}

#endif /* RINGLB_PARSE_H */
