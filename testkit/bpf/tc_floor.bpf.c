// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * tc_floor.bpf.c - benchmark floors of the node datapath (tc programs).
 *
 * ringlb_tc_floor: parse Ethernet, the IPv4 or IPv6 header and the L4 ports
 *   (bounds-checked reads the verifier accepts, the values folded into the
 *   verdict's path so clang cannot drop them), then TC_ACT_OK. That is the
 *   least any tc program must do to decide whether a packet is its own: the
 *   node programs do exactly this before their first map lookup. It touches
 *   no map and no helper.
 * ringlb_tc_ok: return TC_ACT_OK and nothing else: the cost of the test-run
 *   loop itself.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

SEC("classifier")
int ringlb_tc_floor(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u16 *ports;
	__u8 proto;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(eth + 1);
		if ((void *)(iph + 1) > data_end || iph->version != 4 || iph->ihl < 5)
			return TC_ACT_OK;
		proto = iph->protocol;
		ports = (void *)iph + (iph->ihl & 0xf) * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
			return TC_ACT_OK;
		proto = ip6->nexthdr;
		ports = (void *)(ip6 + 1);
	} else {
		return TC_ACT_OK;
	}
	if ((void *)(ports + 2) > data_end)
		return TC_ACT_OK;
	/* never true for real traffic: keeps the reads in the program */
	if (proto == 0xff && ports[0] == ports[1])
		return TC_ACT_UNSPEC;
	return TC_ACT_OK;
}

SEC("classifier")
int ringlb_tc_ok(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
