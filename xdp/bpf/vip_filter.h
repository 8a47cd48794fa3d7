/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * vip_filter.h - a one-hash Bloom filter of the VIP addresses, checked before
 * conntrack so that traffic for the node itself (BGP, SSH, kubelet) pays
 * neither a conntrack miss nor the two vips lookups: an array read and a bit
 * test. A clear bit proves the address is no VIP; a set bit (a VIP, or
 * another address hashing to the same bit) goes the usual way.
 *
 * The loader (xdp/src/vip_filter.rs, same hash) sets a VIP's bit before it
 * writes the vips entry, and rebuilds the whole filter from its view after a
 * full apply, which clears the bits of deleted VIPs. A bit set too many is
 * only a missed shortcut; a bit missing would pass a VIP's packets to the
 * kernel, so bits are never cleared ahead of the vips entry.
 *
 * vip_addrs is the exact answer behind a set bit: this edge's own VIP
 * addresses (every vips entry's address but a failover alias's), kept by the
 * loader after every apply. The program asks it only off the forwarding path:
 * for an IPIP packet (failover.h) and for a packet to a VIP address that no
 * vips entry forwards (vip_addr.h).
 */
#ifndef RINGLB_VIP_FILTER_H
#define RINGLB_VIP_FILTER_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RINGLB_VIP_FILTER_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} vip_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_MAX_VIPS);
	__type(key, struct ringlb_vip_key);
	__type(value, __u32);
} vip_addrs SEC(".maps");

/* The bit of an address: the XOR of its four words (as a little-endian CPU
 * loads them from the packet; IPv4 is word 0) times the 32-bit golden-ratio
 * constant, top RINGLB_VIP_FILTER_BITS bits. */
static __always_inline __u32 ringlb_vip_filter_bit(const __u32 addr[4])
{
	__u32 x = addr[0] ^ addr[1] ^ addr[2] ^ addr[3];
	return (x * 0x9e3779b1U) >> (32 - RINGLB_VIP_FILTER_BITS);
}

/* 0 = certainly not a VIP address. */
static __always_inline int ringlb_maybe_vip(const __u32 daddr[4])
{
	__u32 bit = ringlb_vip_filter_bit(daddr);
	__u32 word = bit >> 6;
	__u64 *w = bpf_map_lookup_elem(&vip_filter, &word);

	return w && ((*w >> (bit & 63)) & 1);
}

/* 1 = flow's destination is one of this edge's own VIP addresses (exact: one
 * hash lookup; flow->daddr words 1..3 are zero for IPv4). */
static __always_inline int ringlb_own_vip_addr(const struct ringlb_flow *flow)
{
	struct ringlb_vip_key ak = {};

	__builtin_memcpy(ak.addr, flow->daddr, 16);
	ak.family = flow->family;
	return bpf_map_lookup_elem(&vip_addrs, &ak) != 0;
}

#endif /* RINGLB_VIP_FILTER_H */
