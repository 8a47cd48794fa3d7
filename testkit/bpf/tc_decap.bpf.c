// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * tc_decap.bpf.c - tc clsact ingress on a backend: strip the outer header the
 * edge pushed (IPv4 proto 4 = IPv4-in-IPv4, IPv6 nexthdr 41 = IPv6-in-IPv6),
 * so the local stack sees the client's packet to the VIP (the VIP sits on lo;
 * replies go straight to the client: DSR). This kernel has no ipip/ip6tnl
 * device, so BPF does the decapsulation. Used by the real-traffic tests; the
 * worker-node agent has its own program. Mixed families (4in6/6in4) are
 * counted as ST_DECAP_UNSUPPORTED and passed unchanged. Section "classifier"
 * (what aya calls a SchedClassifier); by hand:
 *   tc filter add dev eth0 ingress bpf da obj tc_decap.o sec classifier
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef IPPROTO_IPV6
#define IPPROTO_IPV6 41
#endif

enum { ST_DECAP4 = 0, ST_DECAP6, ST_DECAP_ERR, ST_DECAP_UNSUPPORTED, ST_OTHER, ST_MAX };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} decap_stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&decap_stats, &idx);
	if (v)
		*v += 1;
}

SEC("classifier")
int ringlb_decap(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		goto other;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *o = (void *)(eth + 1);
		if ((void *)(o + 1) > data_end)
			goto other;
		if (o->protocol == IPPROTO_IPV6) {
			count(ST_DECAP_UNSUPPORTED);
			return TC_ACT_OK;
		}
		if (o->protocol != IPPROTO_IPIP)
			goto other;
		if (o->ihl != 5) {
			count(ST_DECAP_ERR);
			return TC_ACT_SHOT;
		}
		if (bpf_skb_adjust_room(skb, -(__s32)sizeof(struct iphdr), BPF_ADJ_ROOM_MAC, 0)) {
			count(ST_DECAP_ERR);
			return TC_ACT_SHOT;
		}
		count(ST_DECAP4);
		return TC_ACT_OK;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *o = (void *)(eth + 1);
		if ((void *)(o + 1) > data_end)
			goto other;
		if (o->nexthdr == IPPROTO_IPIP) {
			count(ST_DECAP_UNSUPPORTED);
			return TC_ACT_OK;
		}
		if (o->nexthdr != IPPROTO_IPV6)
			goto other;
		if (bpf_skb_adjust_room(skb, -(__s32)sizeof(struct ipv6hdr), BPF_ADJ_ROOM_MAC, 0)) {
			count(ST_DECAP_ERR);
			return TC_ACT_SHOT;
		}
		count(ST_DECAP6);
		return TC_ACT_OK;
	}
other:
	count(ST_OTHER);
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
