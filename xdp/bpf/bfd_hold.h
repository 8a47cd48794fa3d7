/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * bfd_hold.h - BFD held by the datapath across a hitless agent restart.
 *
 * BFD runs in the agent. A hitless restart (`--on-sigterm restart`) leaves the
 * ToR's BGP routes to graceful restart, but a ToR whose BFD client is not
 * graceful (BIRD `bfd on`) takes a BFD session that goes down, AdminDown or
 * timeout, as a failure and drops the edge. So the exiting agent writes each
 * IPv4 session that is Up into bfd_hold (abi.h), and until the entry's
 * deadline this program answers the peer's Control packets itself: one
 * answer per received packet, in place (XDP_TX), state Up, our stored
 * discriminators and intervals, Final if the packet had Poll. The ToR's BFD
 * sees a live session; the next agent resumes it (same discriminator) and
 * deletes the entry. After the deadline nothing is answered, so an agent that
 * never comes back is a BFD timeout at the ToR, as a dead edge is.
 *
 * Answered only (else XDP_PASS, counted in the entry's `refused` when the
 * peer has an entry): IPv4 without options, UDP to 3784, TTL 255 (GTSM, RFC
 * 5881 §5), to the entry's local address from its peer, a 24-byte Control
 * packet (version 1, no auth, no demand, no multipoint) whose state is Up,
 * whose My Discriminator is the stored peer's and whose Your Discriminator
 * is ours. IPv6 BFD is not held (the agent writes no entry).
 *
 * Cost for other packets: the caller's one compare of the UDP destination
 * port, before the VIP filter; a hash lookup for BFD packets only.
 */
#ifndef RINGLB_BFD_HOLD_H
#define RINGLB_BFD_HOLD_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "abi.h"
#include "parse.h"

#define RINGLB_BFD_LEN 24          /* a Control packet without authentication */
#define RINGLB_BFD_STATE_UP 3
#define RINGLB_BFD_F_POLL  0x20    /* byte 1: Sta(2) P F C A D M */
#define RINGLB_BFD_F_FINAL 0x10
#define RINGLB_BFD_F_AUTH_DEMAND_MP 0x07

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_BFD_HOLD_MAX);
	__type(key, struct ringlb_bfd_hold_key);
	__type(value, struct ringlb_bfd_hold);
} bfd_hold SEC(".maps");

/* The BFD part of a frame: IPv4 header (20 bytes, no options), UDP, Control. */
struct ringlb_bfd_frame {
	struct iphdr ip;
	struct udphdr udp;
	__u8 vers_diag;
	__u8 flags;        /* Sta(2) P F C A D M */
	__u8 detect_mult;
	__u8 length;
	__u32 my_disc;
	__u32 your_disc;
	__u32 min_tx;
	__u32 min_rx;
	__u32 min_echo_rx;
};
_Static_assert(sizeof(struct ringlb_bfd_frame) == 52, "IPv4 20 + UDP 8 + BFD 24");

static __always_inline __u16 ringlb_bfd_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Whether the packet (at l3) is one the entry answers. */
static __always_inline int ringlb_bfd_acceptable(const struct ringlb_bfd_frame *f,
						 const struct ringlb_bfd_hold *h)
{
	return f->ip.ihl == 5 && f->ip.ttl == 255 &&
	       f->ip.tot_len == bpf_htons(sizeof(*f)) &&
	       f->udp.len == bpf_htons(sizeof(*f) - sizeof(f->ip)) &&
	       (f->vers_diag >> 5) == 1 && f->length == RINGLB_BFD_LEN &&
	       (f->flags >> 6) == RINGLB_BFD_STATE_UP &&
	       !(f->flags & RINGLB_BFD_F_AUTH_DEMAND_MP) && f->detect_mult != 0 &&
	       f->my_disc == h->your_disc && f->your_disc == h->my_disc;
}

/* Turns the packet into our answer, in place (the caller returns XDP_TX). */
static __always_inline void ringlb_bfd_answer(struct ethhdr *eth, struct ringlb_bfd_frame *f,
					      const struct ringlb_bfd_hold *h)
{
	__u8 mac[ETH_ALEN];
	__u32 a = f->ip.saddr, sum = 0;
	__u16 *w;

	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	f->ip.saddr = f->ip.daddr;
	f->ip.daddr = a;
	f->ip.ttl = 255;
	f->ip.check = 0;
	w = (__u16 *)&f->ip;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	f->ip.check = ringlb_bfd_fold(sum);

	f->udp.source = h->src_port;
	f->udp.dest = bpf_htons(RINGLB_BFD_PORT);
	f->udp.check = 0;
	f->vers_diag = 1 << 5; /* version 1, diagnostic 0 */
	f->flags = (RINGLB_BFD_STATE_UP << 6) | ((f->flags & RINGLB_BFD_F_POLL) ? RINGLB_BFD_F_FINAL : 0);
	f->detect_mult = h->detect_mult;
	f->length = RINGLB_BFD_LEN;
	f->your_disc = f->my_disc;
	f->my_disc = h->my_disc;
	f->min_tx = h->min_tx_us;
	f->min_rx = h->min_rx_us;
	f->min_echo_rx = 0;

	/* UDP checksum: pseudo header (addresses, protocol, length) + UDP
	 * header + the 24 bytes, all at constant offsets */
	sum = (f->ip.saddr & 0xffff) + (f->ip.saddr >> 16) + (f->ip.daddr & 0xffff) +
	      (f->ip.daddr >> 16) + bpf_htons(IPPROTO_UDP) + f->udp.len;
	w = (__u16 *)&f->udp;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*f) - sizeof(f->ip)) / 2; i++)
		sum += w[i];
	__u16 c = ringlb_bfd_fold(sum);
	f->udp.check = c ? c : 0xffff;
}

/* For an IPv4 UDP packet to port 3784 (the caller checked the port): 1 when
 * it was answered (return XDP_TX), 0 when it goes on. */
static __always_inline int ringlb_bfd_hold_answer(void *data, void *data_end,
						  const struct ringlb_pkt *pkt)
{
	struct ringlb_bfd_hold_key k;
	struct ringlb_bfd_hold *h;
	struct ringlb_bfd_frame *f;

	if (pkt->flow.family != RINGLB_AF_INET || pkt->flow.proto != IPPROTO_UDP)
		return 0;
	k.local = pkt->flow.daddr[0];
	k.peer = pkt->flow.saddr[0];
	h = bpf_map_lookup_elem(&bfd_hold, &k);
	if (!h)
		return 0;
	if (bpf_ktime_get_ns() >= h->deadline_ns)
		return 0; /* over: the next agent deletes it; the peer times out */
	/* constant offsets (14 or 18: an untagged or once-tagged frame) */
	f = pkt->l2_len == 18 ? data + 18 : data + 14;
	if ((void *)(f + 1) > data_end || !ringlb_bfd_acceptable(f, h)) {
		__sync_fetch_and_add(&h->refused, 1);
		return 0;
	}
	ringlb_bfd_answer(data, f, h);
	__sync_fetch_and_add(&h->answered, 1);
	h->last_ns = bpf_ktime_get_ns();
	return 1;
}

#endif /* RINGLB_BFD_HOLD_H */
