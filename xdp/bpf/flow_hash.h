/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * flow_hash.h - THE flow hash that indexes a Maglev table (slot = hash % M).
 *
 * Every edge must pick the same backend for a flow (the ToR moves flows
 * between edges with ECMP), so there is no per-edge seed. The Rust side is
 * ringlb_edge::maglev::flow_hash(); the test edge-lb/tests/maglev_flow_hash_c.rs
 * compiles this header with the host C compiler and checks both agree.
 *
 * Definition (see docs/maglev.md):
 *
 *   ringlb_flow_hash = MurmurHash3_x86_32(key, 40 bytes, seed 0)
 *
 *   key = saddr[16] || daddr[16] || sport[2] || dport[2] || proto[1] || 0 0 0
 *
 * where addresses are the 16 raw bytes as they sit in the packet (network
 * order; an IPv4 address fills bytes 0..3 and bytes 4..15 are zero) and the
 * ports are the 2 raw bytes from the L4 header (network order). The key is
 * exactly 10 little-endian 32-bit blocks, so there is no tail.
 *
 * The function takes the words as a little-endian CPU loads them straight
 * from the packet: saddr[i]/daddr[i] are the __u32 loads of the address
 * words, sport/dport the __u16 loads of the port fields (no bpf_ntohs). That
 * is why big-endian targets are refused below.
 *
 * Compiles with `clang -target bpf` and with the host cc (gcc/clang); no
 * loops, no helpers, no maps: ~80 ALU instructions.
 */
#ifndef RINGLB_FLOW_HASH_H
#define RINGLB_FLOW_HASH_H

#include <linux/types.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ringlb_flow_hash is defined on little-endian loads of packet bytes"
#endif

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define RINGLB_MURMUR_C1 0xcc9e2d51U
#define RINGLB_MURMUR_C2 0x1b873593U

static __always_inline __u32 ringlb_rotl32(__u32 x, __u32 r)
{
	return (x << r) | (x >> (32 - r));
}

/* One MurmurHash3_x86_32 body round: mix block k into state h. */
static __always_inline __u32 ringlb_murmur_round(__u32 h, __u32 k)
{
	k *= RINGLB_MURMUR_C1;
	k = ringlb_rotl32(k, 15);
	k *= RINGLB_MURMUR_C2;
	h ^= k;
	h = ringlb_rotl32(h, 13);
	return h * 5 + 0xe6546b64U;
}

/* MurmurHash3 fmix32 finalizer. */
static __always_inline __u32 ringlb_fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6bU;
	h ^= h >> 13;
	h *= 0xc2b2ae35U;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 ringlb_flow_hash(const __u32 saddr[4], const __u32 daddr[4],
					      __u16 sport, __u16 dport, __u8 proto)
{
	__u32 h = 0; /* seed 0: no per-edge seed, on purpose */

	h = ringlb_murmur_round(h, saddr[0]);
	h = ringlb_murmur_round(h, saddr[1]);
	h = ringlb_murmur_round(h, saddr[2]);
	h = ringlb_murmur_round(h, saddr[3]);
	h = ringlb_murmur_round(h, daddr[0]);
	h = ringlb_murmur_round(h, daddr[1]);
	h = ringlb_murmur_round(h, daddr[2]);
	h = ringlb_murmur_round(h, daddr[3]);
	h = ringlb_murmur_round(h, (__u32)sport | ((__u32)dport << 16));
	h = ringlb_murmur_round(h, (__u32)proto);
	h ^= 40; /* key length in bytes */
	return ringlb_fmix32(h);
}

/* The slot hash of a VIP with client affinity: ringlb_flow_hash of the
 * client's address, everything else zero (daddr, ports, protocol). Rust:
 * ringlb_xdp::lookup::client_hash. */
static __always_inline __u32 ringlb_client_hash(const __u32 saddr[4])
{
	const __u32 zero[4] = {0, 0, 0, 0};

	return ringlb_flow_hash(saddr, zero, 0, 0, 0);
}

#endif /* RINGLB_FLOW_HASH_H */
