// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * xdp_lb.bpf.c - the ringlb edge datapath (XDP).
 *
 *   parse (eth [+vlan], ipv4|ipv6, tcp|udp; TCP SYN flag)
 *     -> vip_filter[daddr] clear?      not a VIP address: XDP_PASS (vip_filter.h)
 *        (not TCP/UDP, to one of our VIP addresses: an echo request is
 *        answered, XDP_TX, anything else dropped: vip_addr.h)
 *        (IPv4 in IPv4: the outer daddr; to one of our VIPs, the inner packet
 *        goes on, and only a failover alias forwards it: failover.h)
 *     -> conntrack[5-tuple]           (not for a SYN) hit, and the backend id
 *                                     still has the entry's generation? done
 *        (a VIP with source ranges: the source must be in them, or
 *        XDP_DROP; src_ranges.h)
 *     -> else vips[(daddr, dport, proto)]  (then the port-0 wildcard;
 *        neither, to one of our VIP addresses: XDP_DROP, vip_addr.h)
 *        -> source outside the VIP's ranges? XDP_DROP (src_ranges.h)
 *        -> client affinity with a timeout: affinity[(client, vip_id)], the
 *           client's pod while it lives (affinity.h)
 *        -> else rings[vip_id][flow_hash % M]   (Maglev, flow_hash.h; with
 *           client affinity the hash of the client's address alone)
 *        -> conntrack insert {backend id, generation} (not by a SYN, and
 *           within the VIP's insert budget: conntrack.h)
 *     -> backends[id]: pod IP + next-hop MACs resolved by the loader
 *     -> push outer IPv4 (proto 4/41) or IPv6 (nexthdr 41/4) header
 *     -> L2 header of the next hop: its MACs, and its VLAN tag (pushed,
 *        rewritten or stripped: the ingress tag does not matter)
 *     -> XDP_TX when the next hop is on the ingress port, bpf_redirect to
 *        its (parent) port otherwise; XDP_PASS with the frame's own L2
 *        header for a pod on this node (the node agent decapsulates it)
 *
 * Why conntrack comes first: most packets belong to established flows, and
 * their conntrack entry already names the backend, so the vips hash lookup is
 * skipped for them. This is only safe because backend ids are allocated per
 * (VIP, pod) pair: when a pod leaves a VIP, or the VIP is deleted, the loader
 * retires that pair's id (family 0, or a new generation on reuse), and every
 * conntrack entry of that VIP to that pod turns stale. A SYN does not use its
 * entry: it opens a new connection, which the ring decides; it inserts none
 * either (the flow's next packet does), and rewrites an entry the 5-tuple
 * still had from an earlier connection if it names another backend.
 * A packet that would not fit config.mtu once encapsulated is answered with
 * ICMP Fragmentation Needed (IPv4 with DF) or ICMPv6 Packet Too Big from the
 * VIP, by XDP_TX (ringlb_too_big); IPv4 without DF is passed.
 * Failover (failover.h): a decapsulated packet's conntrack key carries
 * RINGLB_FLOW_F_DECAP, only a RINGLB_VIP_F_FAILOVER_ALIAS entry forwards it (a
 * plain packet to one is passed; IPIP to one of our VIPs that no alias takes
 * is dropped), and a backend flagged RINGLB_BE_F_REMOTE_VIP
 * never gets it (the loop guard: dropped). Its outer header is rewritten in
 * place by the encap step, which pkt.l2_len (L2 + outer) makes of it.
 * BFD held across a hitless agent restart (bfd_hold.h): a UDP packet to
 * port 3784 from a peer with a live bfd_hold entry is answered in place
 * (XDP_TX) before the VIP filter; any other packet pays one port compare.
 * Anything else -> XDP_PASS, counted by reason (see enum ringlb_stat in abi.h).
 *
 * Build flags (benchmark-only variants, never attached):
 *   -DRINGLB_BENCH_RESTORE   undo the encapsulation before returning, so that
 *                            BPF_PROG_TEST_RUN with repeat > 1 times the encap
 *                            path every time (it reuses one buffer)
 *   -DRINGLB_BENCH_NO_CT_INSERT  never insert into conntrack: every repeat is
 *                            a conntrack miss + Maglev ring lookup
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "abi.h"
#include "parse.h"
#include "flow_hash.h"
#include "conntrack.h"
#include "vip_filter.h"
#include "failover.h"
#include "bfd_hold.h"
#include "src_ranges.h"
#include "vip_addr.h"
#include "affinity.h"

#ifndef IPPROTO_IPV6
#define IPPROTO_IPV6 41
#endif
#define RINGLB_OUTER_TTL 64
#define RINGLB_AF_INET_FIB 2
#define RINGLB_AF_INET6_FIB 10

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, struct ringlb_vip_key);
	__type(value, struct ringlb_vip_info);
} vips SEC(".maps");

struct ring_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_MAX_RING_SIZE);
	/* inner maps may have any size <= M; mmapable so that the loader writes
	 * changed slots straight into the array (no syscall per slot) */
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__array(values, struct ring_inner);
} rings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct ringlb_backend);
} backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_MAX_BACKENDS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32);
} owners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ringlb_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, __u32);
	__type(value, struct ringlb_vip_stats);
} vip_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_ST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += 1;
}

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

static __always_inline __u16 ipv4_csum(const struct iphdr *iph)
{
	const __u16 *p = (const __u16 *)iph;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*iph) / 2); i++)
		sum += p[i];
	return csum_fold(sum);
}

/* ---- too big for the tunnel: ICMP Fragmentation Needed / Packet Too Big ---- */

/* Bytes of the offending packet the answer quotes: IPv4 20 + 8 + 512 = 540
 * stays under RFC 1812's 576, IPv6 40 + 8 + 512 under 1280 (RFC 4443), and
 * 512 is the most bpf_csum_diff sums in one call. */
#define RINGLB_ICMP_QUOTE 512
#define RINGLB_ICMP_TTL 64
#define RINGLB_ICMP_TOS 0xc0 /* internetwork control, as Linux sends its errors */

struct ringlb_icmp6_pseudo {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 len;   /* be */
	__u8 zero[3];
	__u8 nexthdr;
};

/* Turns the frame into an ICMP "Fragmentation Needed" (IPv4, type 3 code 4,
 * next-hop MTU `room`) or ICMPv6 "Packet Too Big" (type 2, MTU `room`) from
 * the VIP to the client, quoting the first RINGLB_ICMP_QUOTE bytes of the
 * (inner, for a decapsulated one) packet, with the frame's L2 header (VLAN tag kept) and its MACs swapped:
 * the caller returns XDP_TX. The source is the VIP so the client's PMTU
 * cache entry is the one for the VIP. Returns 0, or -1 (the frame may be
 * changed: drop it). */
static __always_inline int ringlb_too_big(struct xdp_md *ctx, const struct ringlb_pkt *pkt,
					  __u32 room)
{
	int v6 = pkt->flow.family == RINGLB_AF_INET6;
	__u32 hdrs = v6 ? sizeof(struct ipv6hdr) + 8 : sizeof(struct iphdr) + 8;
	/* a decapsulated packet (IPv4 inside): the answer replaces its outer
	 * header too, and quotes the inner packet */
	__u32 skip = (pkt->flow.flags & RINGLB_FLOW_F_DECAP) ? sizeof(struct iphdr) : 0;
	__u32 grow = hdrs - skip;
	__u32 l2 = pkt->l2_len - skip == 18 ? 18 : 14;
	__u8 hdr[18];

	/* the old L2 header (its first 18 bytes: enough for a tag) moves to the
	 * new front, MACs swapped; bytes past its end are overwritten below.
	 * Read before the move, at a constant offset (5.10's verifier keeps no
	 * range for data + a variable grow) */
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (data + 18 > data_end)
		return -1;
	__builtin_memcpy(hdr, data, 18);
	if (bpf_xdp_adjust_head(ctx, -(int)grow))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + 18 > data_end)
		return -1;
	__builtin_memcpy(data, hdr + 6, 6);
	__builtin_memcpy(data + 6, hdr, 6);
	__builtin_memcpy(data + 12, hdr + 12, 6);
	/* keep L2 + the new headers + the quote */
	int tail = (int)(l2 + hdrs + RINGLB_ICMP_QUOTE) - (int)(data_end - data);
	if (tail < 0 && bpf_xdp_adjust_tail(ctx, tail))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;

	__u8 icmp[8] = {};
	if (v6) {
		icmp[0] = 2; /* ICMPv6 Packet Too Big, code 0, 32-bit MTU */
		*(__u32 *)(icmp + 4) = bpf_htonl(room);
	} else {
		icmp[0] = 3; /* Destination Unreachable */
		icmp[1] = 4; /* Fragmentation Needed and DF set; 16-bit next-hop MTU */
		*(__u16 *)(icmp + 6) = bpf_htons(room);
	}
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)icmp, sizeof(icmp), 0);
	void *l3 = l2 == 18 ? data + 18 : data + 14;
	if (v6) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) + 8 + RINGLB_ICMP_QUOTE > data_end)
			return -1;
		struct ringlb_icmp6_pseudo ph = {
			.len = bpf_htonl(8 + RINGLB_ICMP_QUOTE),
			.nexthdr = RINGLB_IPPROTO_ICMPV6,
		};
		__builtin_memcpy(ph.saddr, pkt->flow.daddr, 16);
		__builtin_memcpy(ph.daddr, pkt->flow.saddr, 16);
		sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), sum);
		sum = bpf_csum_diff(0, 0, (void *)(ip6 + 1) + 8, RINGLB_ICMP_QUOTE, sum);
		*(__u32 *)ip6 = bpf_htonl(0x60000000 | (RINGLB_ICMP_TOS << 20));
		ip6->payload_len = bpf_htons(8 + RINGLB_ICMP_QUOTE);
		ip6->nexthdr = RINGLB_IPPROTO_ICMPV6;
		ip6->hop_limit = RINGLB_ICMP_TTL;
		__builtin_memcpy(&ip6->saddr, ph.saddr, 16);
		__builtin_memcpy(&ip6->daddr, ph.daddr, 16);
		*(__u16 *)(icmp + 2) = csum_fold((__u32)sum);
		__builtin_memcpy(ip6 + 1, icmp, 8);
	} else {
		struct iphdr *p4 = l3;
		if ((void *)(p4 + 1) + 8 + RINGLB_ICMP_QUOTE > data_end)
			return -1;
		sum = bpf_csum_diff(0, 0, (void *)(p4 + 1) + 8, RINGLB_ICMP_QUOTE, sum);
		struct iphdr o4 = {
			.version = 4,
			.ihl = 5,
			.tos = RINGLB_ICMP_TOS,
			.tot_len = bpf_htons(sizeof(o4) + 8 + RINGLB_ICMP_QUOTE),
			.ttl = RINGLB_ICMP_TTL,
			.protocol = IPPROTO_ICMP,
			.saddr = pkt->flow.daddr[0],
			.daddr = pkt->flow.saddr[0],
		};
		o4.check = ipv4_csum(&o4);
		__builtin_memcpy(p4, &o4, sizeof(o4));
		*(__u16 *)(icmp + 2) = csum_fold((__u32)sum);
		__builtin_memcpy(p4 + 1, icmp, 8);
	}
	return 0;
}

/* Resolve the next hop with the kernel FIB (fallback only: ~125 ns). */
static __always_inline int fib_fallback(struct xdp_md *ctx, struct ringlb_backend *be,
					const struct ringlb_config *cfg, __u32 tot_len,
					__u8 *dmac, __u8 *smac, __u32 *ifindex)
{
	struct bpf_fib_lookup fib = {};

	fib.ifindex = ctx->ingress_ifindex;
	fib.tot_len = tot_len;
	if (be->family == RINGLB_AF_INET) {
		fib.family = RINGLB_AF_INET_FIB;
		fib.ipv4_src = cfg->src4;
		fib.ipv4_dst = be->addr[0];
	} else {
		fib.family = RINGLB_AF_INET6_FIB;
		__builtin_memcpy(fib.ipv6_src, cfg->src6, 16);
		__builtin_memcpy(fib.ipv6_dst, be->addr, 16);
	}
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
	__builtin_memcpy(dmac, fib.dmac, ETH_ALEN);
	__builtin_memcpy(smac, fib.smac, ETH_ALEN);
	*ifindex = fib.ifindex;
	return 0;
}

SEC("xdp")
int ringlb_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ringlb_pkt pkt = {};
	struct ringlb_vip_key vk = {};
	struct ringlb_vip_info *vip;
	struct ringlb_backend *be;
	struct ringlb_ct_value *ct;
	__u32 zero = 0, bid = 0, frame_len;
	int reason, decap = 0;

	reason = ringlb_parse(data, data_end, &pkt);
	if (reason) {
		if (reason != RINGLB_PARSE_IPIP) {
			/* to one of our VIP addresses the kernel would route it
			 * back to the ToR: answered or dropped (vip_addr.h) */
			if (ringlb_vip_addr_reason(reason) && ringlb_maybe_vip(pkt.flow.daddr) &&
			    ringlb_own_vip_addr(&pkt.flow)) {
				int verdict;
				count(ringlb_vip_addr_verdict(data, data_end, &pkt, reason,
							      &verdict));
				return verdict;
			}
			count(reason);
			return XDP_PASS;
		}
		/* IPIP: to one of our VIPs, failed-over traffic (failover.h);
		 * any other address pays only the filter */
		if (!ringlb_maybe_vip(pkt.flow.daddr)) {
			count(RINGLB_ST_PASS_NOT_VIP);
			return XDP_PASS;
		}
		reason = ringlb_parse_decap(data, data_end, &pkt);
		if (reason) {
			count(reason);
			return reason == RINGLB_ST_PASS_DECAP_NOT_OURS ? XDP_PASS : XDP_DROP;
		}
		decap = 1;
	} else if (pkt.flow.dport == bpf_htons(RINGLB_BFD_PORT) &&
		   ringlb_bfd_hold_answer(data, data_end, &pkt)) {
		/* BFD held for a restarting agent (bfd_hold.h): counted in
		 * its bfd_hold entry */
		return XDP_TX;
	} else if (!ringlb_maybe_vip(pkt.flow.daddr)) {
		/* the node's own traffic: no conntrack, no vips lookups */
		count(RINGLB_ST_PASS_NOT_VIP);
		return XDP_PASS;
	}
	frame_len = data_end - data;

	const struct ringlb_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg) /* cannot happen for an ARRAY; keeps the verifier happy */
		return XDP_PASS;

	/* 1. conntrack first: an established flow needs neither the vips lookup
	 * nor the ring. The entry names the backend id of one (VIP, pod) pair
	 * and its generation; the loader retires the id (new generation, or
	 * family 0) when the pod leaves that VIP or the VIP goes away, so a hit
	 * on a current id is proof that the VIP still has this backend. */
	__u32 vip_id = 0;
	int stale = 0;
	be = 0;
	/* a SYN's entry is never used, only rewritten once the ring chose
	 * (syn_ct.old); its flow filter may skip the lookup (conntrack.h) */
	struct ringlb_ct_syn syn_ct = {};
	ct = ringlb_ct_lookup(&pkt.flow, pkt.syn, &syn_ct);
	if (ct) {
		bid = ct->backend_id;
		be = bpf_map_lookup_elem(&backends, &bid);
		if (be && be->family && be->gen == ct->gen) {
			if (decap && (be->nh_valid & RINGLB_BE_F_REMOTE_VIP)) {
				count(RINGLB_ST_FAILOVER_LOOP);
				return XDP_DROP;
			}
			/* the VIP this id belongs to now (owners is kept current by
			 * the loader, also across a ring-size change) */
			__u32 *own = bpf_map_lookup_elem(&owners, &bid);
			__u32 ov = own ? *own : 0;
			vip_id = ov & RINGLB_OWNER_VIP_MASK ? (ov & RINGLB_OWNER_VIP_MASK) - 1
							    : RINGLB_MAX_VIPS;
			/* source ranges hold for established flows too: a
			 * narrowed range cuts them at their next packet */
			if ((ov & RINGLB_OWNER_F_SRC_RANGES) &&
			    !ringlb_src_allowed(vip_id, &pkt.flow)) {
				count(RINGLB_ST_DROP_SOURCE_RANGE);
				return XDP_DROP;
			}
			count(RINGLB_ST_CT_HIT);
		} else {
			count(RINGLB_ST_CT_STALE);
			stale = 1;
			be = 0;
		}
	}

	/* 2. a new (or stale) flow: the VIP, then its Maglev ring */
	if (!be) {
		__builtin_memcpy(vk.addr, pkt.flow.daddr, 16);
		vk.port = pkt.flow.dport;
		vk.proto = pkt.flow.proto;
		vk.family = pkt.flow.family;
		vip = bpf_map_lookup_elem(&vips, &vk);
		if (!vip) {
			vk.port = 0;
			vip = bpf_map_lookup_elem(&vips, &vk);
			if (!vip) {
				/* the VIP is gone: its entries would cost every later
				 * packet this detour until LRU eviction */
				if (stale)
					bpf_map_delete_elem(&conntrack, &pkt.flow);
				/* IPIP to one of our VIP addresses, or no Service
				 * on this port of one: passed, it would loop
				 * (vip_addr.h) */
				if (decap) {
					count(RINGLB_ST_DROP_DECAP_NO_ALIAS);
					return XDP_DROP;
				}
				if (ringlb_own_vip_addr(&pkt.flow)) {
					count(RINGLB_ST_DROP_NO_SERVICE);
					return XDP_DROP;
				}
				count(RINGLB_ST_PASS_NOT_VIP);
				return XDP_PASS;
			}
		}
		/* a failover alias serves decapsulated packets only, and they
		 * nothing else */
		if (!(vip->flags & RINGLB_VIP_F_FAILOVER_ALIAS) != !decap) {
			if (decap) {
				count(RINGLB_ST_DROP_DECAP_NO_ALIAS);
				return XDP_DROP;
			}
			count(RINGLB_ST_PASS_ALIAS_PLAIN);
			return XDP_PASS;
		}
		vip_id = vip->vip_id;
		/* a source outside the VIP's ranges: before the ring, and
		 * nothing inserted */
		if ((vip->flags & RINGLB_VIP_F_SRC_RANGES) &&
		    !ringlb_src_allowed(vip_id, &pkt.flow)) {
			count(RINGLB_ST_DROP_SOURCE_RANGE);
			return XDP_DROP;
		}
		int use_ct = !(vip->flags & RINGLB_VIP_F_NO_CT);
		if (use_ct && !stale && !pkt.syn)
			count(RINGLB_ST_CT_MISS);

		__u32 fh = ringlb_ct_flow_hash(&pkt.flow, &syn_ct);
		/* client affinity with a timeout: the pod the client's last new
		 * flow took, while it lives (affinity.h) */
		__u64 aff_ns = ringlb_affinity_timeout_ns(vip);
		struct ringlb_affinity_key ak = {};
		__u64 now = 0;
		if (aff_ns) {
			ringlb_affinity_key_of(&ak, &pkt.flow, vip_id);
			now = ringlb_affinity_now();
			struct ringlb_affinity_value *av = bpf_map_lookup_elem(&affinity, &ak);
			if (av && now - av->last_ns <= aff_ns) {
				__u32 abid = av->backend_id;
				struct ringlb_backend *abe = bpf_map_lookup_elem(&backends, &abid);
				__u32 *own = bpf_map_lookup_elem(&owners, &abid);
				/* still this VIP's, and in its ring (not
				 * draining) */
				if (abe && abe->family && abe->gen == av->gen && own &&
				    (*own & (RINGLB_OWNER_VIP_MASK | RINGLB_OWNER_F_DRAINING)) ==
					    vip_id + 1) {
					bid = abid;
					be = abe;
					av->last_ns = now;
					count(RINGLB_ST_AFFINITY_HIT);
				}
			}
		}
		if (!be) {
			void *ring = bpf_map_lookup_elem(&rings, &vip_id);
			__u32 m = vip->ring_size;
			if (!ring || m == 0) {
				count(RINGLB_ST_DROP_NO_BACKEND);
				return XDP_DROP;
			}
			/* client affinity: the client's address picks the slot
			 * (the 5-tuple hash still keys conntrack's flow filter) */
			__u32 slot = (vip->flags & RINGLB_VIP_F_CLIENT_AFFINITY
					      ? ringlb_client_hash(pkt.flow.saddr)
					      : fh) %
				     m;
			__u32 *idp = bpf_map_lookup_elem(ring, &slot);
			if (!idp || *idp == 0) {
				count(RINGLB_ST_DROP_NO_BACKEND);
				return XDP_DROP;
			}
			bid = *idp;
			be = bpf_map_lookup_elem(&backends, &bid);
			if (!be || !be->family) {
				count(RINGLB_ST_DROP_NO_BACKEND);
				return XDP_DROP;
			}
			if (aff_ns) {
				struct ringlb_affinity_value nv = {
					.backend_id = bid,
					.gen = be->gen,
					.last_ns = now,
				};
				bpf_map_update_elem(&affinity, &ak, &nv, BPF_ANY);
				count(RINGLB_ST_AFFINITY_NEW);
			}
		}
		/* the loop guard (the loader never gives an alias a remote
		 * backend): failed-over traffic does not travel on */
		if (decap && (be->nh_valid & RINGLB_BE_F_REMOTE_VIP)) {
			count(RINGLB_ST_FAILOVER_LOOP);
			return XDP_DROP;
		}
#ifndef RINGLB_BENCH_NO_CT_INSERT
		if (use_ct) {
			__u32 st = ringlb_ct_record(&pkt.flow, pkt.syn, &syn_ct, fh, bid, be->gen,
						    vip_id, stale);
			if (st)
				count(st);
		} else if (stale) {
			bpf_map_delete_elem(&conntrack, &pkt.flow);
		}
#endif
	}

	/* (vip_id RINGLB_MAX_VIPS = an id without owner: counted nowhere) */
	struct ringlb_vip_stats *vs = bpf_map_lookup_elem(&vip_stats, &vip_id);
	if (vs) {
		vs->packets += 1;
		vs->bytes += frame_len;
	}
	if (be->nh_valid & RINGLB_BE_F_REMOTE_VIP)
		count(RINGLB_ST_FAILOVER_OUT);
	else if (decap)
		count(RINGLB_ST_FAILOVER_IN);

	/* 3. outer header for the backend's family */
	int outer_v6 = be->family == RINGLB_AF_INET6;
	__u32 olen = outer_v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	if (outer_v6 ? !(cfg->src6[0] | cfg->src6[1] | cfg->src6[2] | cfg->src6[3])
		     : !cfg->src4) {
		count(RINGLB_ST_PASS_NO_SRC);
		return XDP_PASS;
	}
	__u32 outer_len = pkt.l3_len + olen;
	if (outer_len > cfg->mtu) {
		/* Tell the client the size that fits, as a router would: IPv4
		 * with DF and every IPv6 packet (IPv6 is never fragmented on
		 * the way). An IPv4 packet without DF (or too short to quote,
		 * with a tiny configured MTU) is passed, as before. */
		if ((pkt.frag_df || pkt.flow.family == RINGLB_AF_INET6) &&
		    pkt.l3_len >= RINGLB_ICMP_QUOTE && cfg->mtu > olen) {
			if (ringlb_too_big(ctx, &pkt, cfg->mtu - olen)) {
				count(RINGLB_ST_DROP_ADJUST);
				return XDP_DROP;
			}
			count(RINGLB_ST_ICMP_TOO_BIG);
			return XDP_TX;
		}
		count(RINGLB_ST_PASS_MTU);
		return XDP_PASS;
	}

	/* 4. next hop: loader-resolved, bpf_fib_lookup only as the fallback */
	__u8 dmac[ETH_ALEN], smac[ETH_ALEN];
	__u32 ifindex;
	__u16 out_tci = 0, out_tpid = bpf_htons(RINGLB_ETH_P_8021Q);
	int local = 0;
	if (be->nh_valid & RINGLB_BE_F_LOCAL) {
		/* a pod on this node: up this port's stack with the frame's own
		 * L2 header (our MAC, its tag), to the node agent's tc program */
		struct ethhdr *in = data;
		if (data + 18 > data_end)
			return XDP_DROP;
		__builtin_memcpy(dmac, in->h_dest, ETH_ALEN);
		__builtin_memcpy(smac, in->h_source, ETH_ALEN);
		if (in->h_proto == bpf_htons(RINGLB_ETH_P_8021Q) ||
		    in->h_proto == bpf_htons(RINGLB_ETH_P_8021AD)) {
			out_tpid = in->h_proto;
			out_tci = ((struct ringlb_vlan_hdr *)(data + 14))->tci;
		}
		ifindex = 0;
		local = 1;
	} else if (be->nh_valid & RINGLB_NH_VALID) {
		__builtin_memcpy(dmac, be->dmac, ETH_ALEN);
		__builtin_memcpy(smac, be->smac, ETH_ALEN);
		ifindex = be->ifindex;
		/* a next hop behind a VLAN device: ifindex is its parent (the
		 * port XDP runs on), the tag is the VLAN device's */
		out_tci = be->vlan_tci;
		if (be->nh_valid & RINGLB_NH_VLAN_8021AD)
			out_tpid = bpf_htons(RINGLB_ETH_P_8021AD);
	} else if ((cfg->flags & RINGLB_CFG_F_FIB_FALLBACK) &&
		   fib_fallback(ctx, be, cfg, outer_len, dmac, smac, &ifindex) == 0) {
		/* bpf_fib_lookup reports no VLAN: the frame leaves untagged, and
		 * behind a VLAN device fib ifindex is that device, which a native
		 * redirect cannot use (docs/datapath.md, Limits) */
		count(RINGLB_ST_FIB_FALLBACK);
	} else {
		count(RINGLB_ST_DROP_FIB);
		return XDP_DROP; /* XDP_PASS would route the VIP packet back to the ToR: a loop */
	}

	/* 5. push the outer header between L2 and the inner L3 header. The L2
	 * header is the next hop's: tagged with its VLAN (a tag is pushed on an
	 * untagged frame, an ingress tag rewritten) or untagged (an ingress tag
	 * is stripped), so delta also covers adding or removing 4 tag bytes. */
	__u32 l2_len = pkt.l2_len;
	struct ethhdr *eth;
#ifdef RINGLB_BENCH_RESTORE
	/* L2 (14/18), or for a decapsulated packet the first 38 bytes: L2 and
	 * the outer header (20), which the encap rewrites (past l2_len they
	 * are inner bytes the encap leaves alone) */
	__u8 l2[38];
	if (l2_len == 18) {
		if (data + 18 > data_end)
			return XDP_PASS;
		__builtin_memcpy(l2, data, 18);
	} else if (l2_len == 14) {
		if (data + 14 > data_end)
			return XDP_PASS;
		__builtin_memcpy(l2, data, 14);
	} else {
		if (data + 38 > data_end)
			return XDP_PASS;
		__builtin_memcpy(l2, data, 38);
	}
#endif
	__u8 inner_proto = pkt.flow.family == RINGLB_AF_INET6 ? IPPROTO_IPV6 : IPPROTO_IPIP;
	__u16 outer_proto = outer_v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);

	int redirect = ifindex != 0 && ifindex != ctx->ingress_ifindex;
	__u32 out_l2 = out_tci ? 18 : 14;
	int delta = (int)(olen + out_l2) - (int)l2_len;

	if (bpf_xdp_adjust_head(ctx, -delta)) {
		count(RINGLB_ST_DROP_ADJUST);
		return XDP_DROP;
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	void *outer;
	if (out_l2 == 18) {
		if (data + 18 + sizeof(struct ipv6hdr) > data_end && outer_v6)
			return XDP_DROP;
		if (data + 18 + sizeof(struct iphdr) > data_end)
			return XDP_DROP;
		eth->h_proto = out_tpid;
		struct ringlb_vlan_hdr *vh = data + 14;
		vh->tci = out_tci;
		vh->proto = outer_proto;
		outer = data + 18;
	} else {
		if (data + 14 + sizeof(struct ipv6hdr) > data_end && outer_v6)
			return XDP_DROP;
		if (data + 14 + sizeof(struct iphdr) > data_end)
			return XDP_DROP;
		eth->h_proto = outer_proto;
		outer = data + 14;
	}
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);

	if (outer_v6) {
		struct ipv6hdr *o6 = outer;
		if ((void *)(o6 + 1) > data_end)
			return XDP_DROP;
		__u32 h = pkt.flow.sport ^ pkt.flow.dport ^ pkt.flow.saddr[0] ^ pkt.flow.saddr[3];
		o6->version = 6;
		o6->priority = pkt.tos >> 4;
		o6->flow_lbl[0] = ((pkt.tos & 0xf) << 4) | ((h >> 16) & 0xf);
		o6->flow_lbl[1] = (h >> 8) & 0xff;
		o6->flow_lbl[2] = h & 0xff;
		o6->payload_len = bpf_htons(pkt.l3_len);
		o6->nexthdr = inner_proto;
		o6->hop_limit = RINGLB_OUTER_TTL;
		__builtin_memcpy(&o6->saddr, cfg->src6, 16);
		__builtin_memcpy(&o6->daddr, be->addr, 16);
	} else {
		struct iphdr o4 = {};
		struct iphdr *p4 = outer;
		if ((void *)(p4 + 1) > data_end)
			return XDP_DROP;
		o4.version = 4;
		o4.ihl = 5;
		o4.tos = pkt.tos;
		o4.tot_len = bpf_htons(outer_len);
		o4.id = 0;
		/* RFC 2003 3.1: copy DF from the inner IPv4 header; IPv6 inside: set DF */
		o4.frag_off = pkt.flow.family == RINGLB_AF_INET ? pkt.frag_df
								: bpf_htons(RINGLB_IP_DF);
		o4.ttl = RINGLB_OUTER_TTL;
		o4.protocol = inner_proto;
		o4.saddr = cfg->src4;
		o4.daddr = be->addr[0];
		o4.check = ipv4_csum(&o4);
		__builtin_memcpy(p4, &o4, sizeof(o4));
	}

	int action;
	if (local) {
		count(RINGLB_ST_LOCAL);
		action = XDP_PASS;
	} else if (!redirect) {
		count(RINGLB_ST_TX);
		action = XDP_TX;
	} else {
		count(RINGLB_ST_REDIRECT);
		action = bpf_redirect(ifindex, 0);
	}

#ifdef RINGLB_BENCH_RESTORE
	/* benchmark only: give the next repetition the original packet back */
	if (bpf_xdp_adjust_head(ctx, delta))
		return XDP_ABORTED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (l2_len == 18) {
		if (data + 18 > data_end)
			return XDP_ABORTED;
		__builtin_memcpy(data, l2, 18);
	} else if (l2_len == 14) {
		if (data + 14 > data_end)
			return XDP_ABORTED;
		__builtin_memcpy(data, l2, 14);
	} else {
		if (data + 38 > data_end)
			return XDP_ABORTED;
		__builtin_memcpy(data, l2, 38);
	}
#endif
	return action;
}

char _license[] SEC("license") = "GPL";
