// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * node.bpf.c - the ringlb node datapath: two tc (clsact / tcx) programs on a
 * worker node's uplink(s).
 *
 * ringlb_node_ingress (uplink ingress):
 *   eth -> outer IPv4 proto 4/41 or IPv6 next header 41/4
 *     -> local_pods[outer dst]?            no: pass untouched (NOT_LOCAL)
 *     -> edges[outer src]? (only with RINGLB_NODE_CFG_CHECK_SOURCE)
 *                                          no: drop (DROP_SOURCE)
 *     -> inner TCP/UDP, not a fragment     no: pass untouched (INNER_UNSUP)
 *     -> services[(outer dst, VIP, port, proto)] -> pod:targetPort
 *                                          no: pass untouched (NO_SERVICE)
 *     -> flows[(client, pod, ports)] = VIP:port (only when missing/changed)
 *     -> remove the outer header (bpf_skb_adjust_room, BPF_ADJ_ROOM_MAC,
 *        FIXED_GSO; DECAP_L3_* and a new EtherType when the family changes)
 *     -> rewrite the inner destination VIP:port -> pod:targetPort
 *     -> TC_ACT_OK: the node routes the packet to the pod's veth.
 *   A plain (not tunnelled) TCP SYN deletes the flow entry of its 4-tuple
 *   first: that pod connection is not a VIP connection (any more).
 *
 * ringlb_node_egress (uplink egress, the reply path):
 *   TCP/UDP with flows[(dst, src, dport, sport)] -> source pod:targetPort
 *     becomes VIP:port; a SYN-ACK also gets its MSS option clamped.
 *   ICMP/ICMPv6 errors about a flow: see node_icmp.h.
 *   Anything else: untouched. Pod-to-pod, ClusterIP and pod-originated
 *   traffic has no flow entry, so it is never touched.
 *
 * Build flag (benchmark-only variant, never attached):
 *   -DRINGLB_BENCH_RESTORE   give the frame back as it came in after each
 *                            run, so that BPF_PROG_TEST_RUN with repeat > 1
 *                            times the decap / reply path every time
 *                            (node_bench.h)
 *
 * Why deliver with TC_ACT_OK (not bpf_redirect to the pod's veth) and reply at
 * the uplink egress (not the pod veth's ingress): the host stack then sees a
 * normal connection client:port <-> pod:targetPort in both directions, so its
 * conntrack state is consistent (no INVALID SYN-ACK from a VIP that
 * `--ctstate INVALID -j DROP` rules would kill), the CNI's routing, policy
 * and masquerade rules apply as for any external client, strict rp_filter on
 * the pod's veth sees the pod's own source, and the rewrite happens after
 * routing and netfilter, where nothing looks at the packet again. See
 * docs/node.md.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "node_abi.h"
#include "node_parse.h"
#include "node_nat.h"
#include "node_maps.h"
#include "node_mss.h"
#include "node_icmp.h"
#include "node_bench.h"

/* uapi flags newer than the build host's headers (Linux 6.3) */
#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

#define NODE_TCP_SYN 0x02
#define NODE_TCP_ACK 0x10

/* A plain TCP SYN to a pod: forget a flow entry left by an earlier VIP
 * connection with the same 4-tuple, so its replies are not translated. */
static __always_inline void node_forget(void *data, void *data_end, const struct node_l3 *l)
{
	__u8 *tcp = data + l->l4_off;
	if ((void *)(tcp + 14) > data_end || (tcp[13] & (NODE_TCP_SYN | NODE_TCP_ACK)) != NODE_TCP_SYN)
		return;
	struct ringlb_node_flow_key fk = {
		.client_port = *(__u16 *)tcp,
		.pod_port = *(__u16 *)(tcp + 2),
		.proto = IPPROTO_TCP,
		.family = l->family,
	};
	node_addr_copy(fk.client, l->saddr);
	node_addr_copy(fk.pod, l->daddr);
	if (bpf_map_delete_elem(&flows, &fk) == 0)
		node_count(RINGLB_NODE_ST_FLOW_FORGET);
}

/* Records client:port -> VIP:port for the reply path (writes only when the
 * entry is missing or names another VIP:port). */
static __always_inline void node_record(const struct node_l3 *in, __u16 sport, __u16 dport,
					const struct ringlb_node_svc_value *svc)
{
	struct ringlb_node_flow_key fk = {
		.client_port = sport,
		.pod_port = svc->target_port,
		.proto = in->proto,
		.family = in->family,
	};
	node_addr_copy(fk.client, in->saddr);
	node_addr_copy(fk.pod, svc->pod);
	struct ringlb_node_flow_value fv = { .vip_port = dport };
	node_addr_copy(fv.vip, in->daddr);
	struct ringlb_node_flow_value *cur = bpf_map_lookup_elem(&flows, &fk);
	if (cur && cur->vip_port == dport && node_addr_eq(cur->vip, fv.vip))
		return;
	if (bpf_map_update_elem(&flows, &fk, &fv, BPF_ANY))
		node_count(RINGLB_NODE_ST_FLOW_ERR);
	else
		node_count(RINGLB_NODE_ST_FLOW_NEW);
}

/* A tunnel to a local pod whose outer source is no edge of this cluster, while
 * the source check is on: nobody else may hand a pod a packet "from" a client. */
static __always_inline int node_source_refused(const struct node_l3 *outer)
{
	__u32 zero = 0;
	struct ringlb_node_config *cfg = bpf_map_lookup_elem(&node_config, &zero);
	if (!cfg || !(cfg->flags & RINGLB_NODE_CFG_CHECK_SOURCE))
		return 0;
	struct ringlb_node_addr ek = { .family = outer->family };
	node_addr_copy(ek.addr, outer->saddr);
	return !bpf_map_lookup_elem(&edges, &ek);
}

/* Removes the outer header (`outer` bytes) behind the Ethernet header. */
static __always_inline int node_decap(struct __sk_buff *skb, __u32 outer, __u8 out_fam, __u8 in_fam)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	if (out_fam != in_fam)
		flags |= in_fam == RINGLB_NODE_AF_INET ? BPF_F_ADJ_ROOM_DECAP_L3_IPV4
						       : BPF_F_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -(__s32)outer, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	if (out_fam != in_fam) {
		__u16 proto = in_fam == RINGLB_NODE_AF_INET ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
		if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2, 0))
			return -1;
	}
	return 0;
}

/* The tunnelled packet: returns the TC verdict. `outer` is the outer header. */
static __always_inline int node_tunnel(struct __sk_buff *skb, const struct node_l3 *outer)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct node_l3 in = {};

	struct ringlb_node_addr pk = { .family = outer->family };
	node_addr_copy(pk.addr, outer->daddr);
	if (!bpf_map_lookup_elem(&local_pods, &pk)) {
		node_count(RINGLB_NODE_ST_NOT_LOCAL);
		return TC_ACT_OK;
	}
	if (node_source_refused(outer)) {
		node_count(RINGLB_NODE_ST_DROP_SOURCE);
		return TC_ACT_SHOT;
	}
	__u16 in_eth = outer->proto == IPPROTO_IPIP ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	if (node_parse_l3(data, data_end, outer->l4_off, in_eth, &in) || in.frag ||
	    !node_is_tcp_udp(&in)) {
		node_count(RINGLB_NODE_ST_INNER_UNSUP);
		return TC_ACT_OK;
	}
	__u16 *ports = data + in.l4_off;
	__u32 l4_min = in.proto == IPPROTO_TCP ? 20 : 8;
	if (data + in.l4_off + l4_min > data_end || in.l4_off + l4_min > in.end) {
		node_count(RINGLB_NODE_ST_INNER_UNSUP);
		return TC_ACT_OK;
	}
	__u16 sport = ports[0], dport = ports[1];
	struct ringlb_node_svc_key sk = {
		.vip_port = dport,
		.proto = in.proto,
		.family = in.family,
		.tunnel_family = outer->family,
	};
	node_addr_copy(sk.tunnel_dst, outer->daddr);
	node_addr_copy(sk.vip, in.daddr);
	struct ringlb_node_svc_value *hit = bpf_map_lookup_elem(&services, &sk);
	if (!hit) {
		node_count(RINGLB_NODE_ST_NO_SERVICE);
		return TC_ACT_OK;
	}
	struct ringlb_node_svc_value svc = *hit;
	node_record(&in, sport, dport, &svc);

	__u32 outer_len = in.off - outer->off;
	if (node_decap(skb, outer_len, outer->family, in.family)) {
		node_count(RINGLB_NODE_ST_DROP_ADJUST);
		return TC_ACT_SHOT;
	}
	node_count(outer->family == RINGLB_NODE_AF_INET ? RINGLB_NODE_ST_DECAP4 : RINGLB_NODE_ST_DECAP6);

	/* the inner header now sits right behind Ethernet */
	in.off -= outer_len;
	in.l4_off -= outer_len;
	__u32 l4c = in.l4_off + node_l4_csum_off(in.proto);
	__u64 l4flags = node_l4_flags(in.proto);
	if (node_rewrite_addr(skb, &in, 0, l4c, in.daddr, svc.pod, l4flags, 0) ||
	    node_rewrite_port(skb, in.l4_off + 2, l4c, dport, svc.target_port, l4flags)) {
		node_count(RINGLB_NODE_ST_DROP_ADJUST);
		return TC_ACT_SHOT;
	}
	node_count(RINGLB_NODE_ST_DNAT);
	return TC_ACT_OK;
}

static __always_inline int node_ingress(struct __sk_buff *skb)
{
	node_pull(skb);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct node_l3 outer = {};

	if ((void *)(eth + 1) > data_end ||
	    node_parse_l3(data, data_end, sizeof(*eth), eth->h_proto, &outer) || outer.frag)
		goto pass;
	if (outer.proto == IPPROTO_IPIP || outer.proto == IPPROTO_IPV6) {
		/* our edges never send IPv4 options on the outer header */
		if (outer.family == RINGLB_NODE_AF_INET && outer.l4_off != sizeof(*eth) + 20)
			goto pass;
		return node_tunnel(skb, &outer);
	}
	if (outer.proto == IPPROTO_TCP)
		node_forget(data, data_end, &outer);
pass:
	node_count(RINGLB_NODE_ST_INGRESS_PASS);
	return TC_ACT_OK;
}

/* A TCP/UDP packet leaving the node: a reply of a translated flow? */
static __always_inline int node_reply(struct __sk_buff *skb, const struct node_l3 *l)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *l4 = data + l->l4_off;
	__u32 l4_min = l->proto == IPPROTO_TCP ? 20 : 8;

	if (data + l->l4_off + l4_min > data_end)
		return RINGLB_NODE_ST_EGRESS_PASS;
	__u16 sport = *(__u16 *)l4, dport = *(__u16 *)(l4 + 2);
	struct ringlb_node_flow_key fk = {
		.client_port = dport,
		.pod_port = sport,
		.proto = l->proto,
		.family = l->family,
	};
	node_addr_copy(fk.client, l->daddr);
	node_addr_copy(fk.pod, l->saddr);
	struct ringlb_node_flow_value *hit = bpf_map_lookup_elem(&flows, &fk);
	if (!hit)
		return RINGLB_NODE_ST_EGRESS_PASS;
	struct ringlb_node_flow_value fv = *hit;
	int syn_ack = 0;
	__u32 hlen = 0;
	if (l->proto == IPPROTO_TCP) {
		syn_ack = (l4[13] & (NODE_TCP_SYN | NODE_TCP_ACK)) == (NODE_TCP_SYN | NODE_TCP_ACK);
		hlen = (l4[12] >> 4) * 4;
	}
	__u32 l4c = l->l4_off + node_l4_csum_off(l->proto);
	__u64 l4flags = node_l4_flags(l->proto);
	if (node_rewrite_addr(skb, l, 1, l4c, fk.pod, fv.vip, l4flags, 1) ||
	    node_rewrite_port(skb, l->l4_off, l4c, sport, fv.vip_port, l4flags))
		return RINGLB_NODE_ST_DROP_REWRITE;
	node_count(RINGLB_NODE_ST_REPLY_SNAT);
	if (syn_ack) {
		__u32 zero = 0;
		struct ringlb_node_config *cfg = bpf_map_lookup_elem(&node_config, &zero);
		if (cfg) {
			__u16 mss = l->family == RINGLB_NODE_AF_INET ? cfg->mss4 : cfg->mss6;
			int r = node_clamp_mss(skb, l->l4_off, hlen, mss);
			if (r < 0)
				return RINGLB_NODE_ST_DROP_REWRITE;
			if (r > 0)
				node_count(RINGLB_NODE_ST_MSS_CLAMPED);
		}
	}
	return RINGLB_NODE_ST_REPLY_SNAT;
}

static __always_inline int node_egress(struct __sk_buff *skb)
{
	node_pull(skb);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct node_l3 l = {};
	__u32 st = RINGLB_NODE_ST_EGRESS_PASS;

	if ((void *)(eth + 1) > data_end ||
	    node_parse_l3(data, data_end, sizeof(*eth), eth->h_proto, &l) || l.frag)
		goto out;
	if (node_is_tcp_udp(&l))
		st = node_reply(skb, &l);
	else if ((l.family == RINGLB_NODE_AF_INET && l.proto == IPPROTO_ICMP) ||
		 (l.family == RINGLB_NODE_AF_INET6 && l.proto == NODE_IPPROTO_ICMPV6))
		st = node_icmp_reply(skb, &l);
out:
	/* REPLY_SNAT (and MSS_CLAMPED) were counted where they happened */
	if (st != RINGLB_NODE_ST_REPLY_SNAT)
		node_count(st);
	return st == RINGLB_NODE_ST_DROP_REWRITE ? TC_ACT_SHOT : TC_ACT_OK;
}

#ifndef RINGLB_BENCH_RESTORE
SEC("classifier")
int ringlb_node_ingress(struct __sk_buff *skb)
{
	return node_ingress(skb);
}

SEC("classifier")
int ringlb_node_egress(struct __sk_buff *skb)
{
	return node_egress(skb);
}
#else
/* benchmark builds: every repetition of a test run gets the original frame
 * back (see node_bench.h) */
SEC("classifier")
int ringlb_node_ingress(struct __sk_buff *skb)
{
	struct node_bench_save s;
	node_bench_save(skb, &s);
	int verdict = node_ingress(skb);
	return node_bench_restore(skb, &s) ? TC_ACT_SHOT : verdict;
}

SEC("classifier")
int ringlb_node_egress(struct __sk_buff *skb)
{
	struct node_bench_save s;
	node_bench_save(skb, &s);
	int verdict = node_egress(skb);
	return node_bench_restore(skb, &s) ? TC_ACT_SHOT : verdict;
}
#endif

char _license[] SEC("license") = "GPL";
