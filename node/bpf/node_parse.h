/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_parse.h - verifier-proof parsing of the headers the node programs look
 * at: one IPv4 or IPv6 header (no IPv6 extension headers) at a given offset,
 * and where its L4 header starts. The same parser reads the outer header, the
 * tunnelled inner header and the header an ICMP error embeds.
 */
#ifndef RINGLB_NODE_PARSE_H
#define RINGLB_NODE_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "node_abi.h"

#ifndef IPPROTO_IPV6
#define IPPROTO_IPV6 41
#endif
#define NODE_IPPROTO_ICMPV6 58
#define NODE_IP_MF 0x2000
#define NODE_IP_OFFSET 0x1fff
#define NODE_NEXTHDR_FRAGMENT 44

/* Headers we may read must be in the linear part of the skb: this many bytes
 * (Ethernet + outer IPv6 + inner IPv4 with options + TCP) are pulled in when a
 * frame's linear part is shorter. Pulling never changes a byte. */
#define NODE_PULL_LEN 160

/* One IP header. */
struct node_l3 {
	__u32 saddr[4];   /* be */
	__u32 daddr[4];   /* be */
	__u32 off;        /* offset of the IP header in the frame */
	__u32 l4_off;     /* offset of the L4 header */
	__u32 end;        /* offset just past the IP packet (by its length fields) */
	__u8 family;      /* RINGLB_NODE_AF_* */
	__u8 proto;       /* IPv4 protocol / IPv6 next header */
	__u8 frag;        /* 1 = a fragment (IPv4 MF/offset, IPv6 fragment header) */
	__u8 pad;
};

/* Parses the IP header at `off`, of the type `eth_proto` (be) says. Returns 0,
 * or -1 when it is not IP or does not fit in [data, data_end). */
static __always_inline int node_parse_l3(void *data, void *data_end, __u32 off,
					 __u16 eth_proto, struct node_l3 *l)
{
	l->off = off;
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = data + off;
		__u32 ihl;
		if ((void *)(iph + 1) > data_end)
			return -1;
		ihl = iph->ihl;
		if (iph->version != 4 || ihl < 5)
			return -1;
		l->family = RINGLB_NODE_AF_INET;
		l->proto = iph->protocol;
		l->saddr[0] = iph->saddr;
		l->daddr[0] = iph->daddr;
		l->frag = (iph->frag_off & bpf_htons(NODE_IP_MF | NODE_IP_OFFSET)) != 0;
		l->l4_off = off + (ihl & 0xf) * 4;
		l->end = off + bpf_ntohs(iph->tot_len);
		return 0;
	}
	if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + off;
		if ((void *)(ip6 + 1) > data_end)
			return -1;
		if (ip6->version != 6)
			return -1;
		l->family = RINGLB_NODE_AF_INET6;
		l->proto = ip6->nexthdr;
		__builtin_memcpy(l->saddr, &ip6->saddr, 16);
		__builtin_memcpy(l->daddr, &ip6->daddr, 16);
		l->frag = ip6->nexthdr == NODE_NEXTHDR_FRAGMENT;
		l->l4_off = off + sizeof(*ip6);
		l->end = l->l4_off + bpf_ntohs(ip6->payload_len);
		return 0;
	}
	return -1;
}

/* TCP or UDP? (IPv6 extension headers are not walked: such packets are not
 * TCP/UDP here and pass untouched.) */
static __always_inline int node_is_tcp_udp(const struct node_l3 *l)
{
	return l->proto == IPPROTO_TCP || l->proto == IPPROTO_UDP;
}

/* The L4 checksum's offset inside the TCP or UDP header. */
static __always_inline __u32 node_l4_csum_off(__u8 proto)
{
	return proto == IPPROTO_TCP ? 16 : 6;
}

/* Makes sure the first NODE_PULL_LEN bytes (or the whole frame) are linear. */
static __always_inline void node_pull(struct __sk_buff *skb)
{
	__u32 have = skb->data_end - skb->data;
	__u32 want = skb->len < NODE_PULL_LEN ? skb->len : NODE_PULL_LEN;
	if (have < want)
		bpf_skb_pull_data(skb, want);
}

static __always_inline int node_addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline void node_addr_copy(__u32 *dst, const __u32 *src)
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

#endif /* RINGLB_NODE_PARSE_H */
