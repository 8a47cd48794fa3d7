/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * abi.h - THE definition of the ringlb XDP datapath ABI: map names, sizes,
 * key/value layouts and counter indices. The BPF programs include it; the Rust
 * loader mirrors it in edge-lb/src/datapath/abi.rs with #[repr(C)] structs and
 * compile-time size checks, and a test (`abi_matches_object`) checks the map
 * definitions in the compiled object against the Rust side.
 *
 * Rules: fixed-width types only, explicit padding, no bool, every struct a
 * multiple of 4 bytes. Fields marked "be" are network byte order.
 * Addresses are always 4 words: IPv4 in word 0, words 1..3 zero, and a family
 * byte next to them so that "a.b.c.d" and "xxxx:xxxx::" never collide.
 */
#ifndef RINGLB_ABI_H
#define RINGLB_ABI_H

#include <linux/types.h>

/* ---- sizes ---------------------------------------------------------------- */
#define RINGLB_MAX_VIPS      65536    /* VIP:port:proto entries (incl. wildcards) */
#define RINGLB_MAX_BACKENDS  1048576  /* backend ids, one per (VIP, pod) pair; id 0 is "none" (40 MiB) */
#define RINGLB_MAX_RING_SIZE 65537    /* largest Maglev table M (prime) */
#define RINGLB_CT_SIZE       262144   /* conntrack entries (LRU, per-CPU lists) */
#define RINGLB_VIP_FILTER_BITS  16       /* vip_filter: 2^16 bits of VIP addresses */
#define RINGLB_VIP_FILTER_WORDS 1024     /* ... in 64-bit words (8 KiB) */
#ifndef RINGLB_FLOW_FILTER_BITS /* benchmark builds try other sizes */
#define RINGLB_FLOW_FILTER_BITS 18       /* flow_filter: 2^18 one-bit slots per half (2 x 32 KiB) */
#endif
#define RINGLB_FLOW_FILTER_SLOTS (1U << RINGLB_FLOW_FILTER_BITS)

/* ---- families (same values as AF_INET / AF_INET6) ------------------------- */
#define RINGLB_AF_INET  2
#define RINGLB_AF_INET6 10

/* ---- VIP map: hash, vip_key -> vip_info ----------------------------------- */
/* port 0 = wildcard for every port of (addr, proto): flag RINGLB_VIP_F_WILDCARD */
struct ringlb_vip_key {
	__u32 addr[4];   /* be */
	__u16 port;      /* be; 0 = any port */
	__u8 proto;      /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 family;     /* RINGLB_AF_* */
};                       /* 20 bytes */

struct ringlb_vip_info {
	__u32 vip_id;     /* index into the ring outer map and the per-VIP counters */
	__u32 ring_size;  /* Maglev M of this VIP's ring (<= RINGLB_MAX_RING_SIZE) */
	__u32 flags;      /* RINGLB_VIP_F_* */
};                        /* 12 bytes */

#define RINGLB_VIP_F_NO_CT 0x1 /* never use/insert conntrack (pure hashing) */
/* Restricted sources (spec.loadBalancerSourceRanges): a packet is forwarded
 * only when src_ranges holds a prefix of its source under this vip_id
 * (src_ranges.h); checked on every packet, conntrack hits included (the
 * owners entry carries the same bit: RINGLB_OWNER_F_SRC_RANGES). */
#define RINGLB_VIP_F_SRC_RANGES 0x4
/* sessionAffinity: ClientIP: a new flow's ring slot is the hash of the
 * client's address alone (flow_hash.h, ringlb_client_hash), so every
 * connection of one client, on every edge, takes the same slot; and with a
 * timeout (flags >> RINGLB_VIP_AFFINITY_SHIFT, seconds, non-zero) the pod a
 * client got is kept in the affinity map (affinity.h) and reused by its new
 * flows while it lives, whatever the ring says since. */
#define RINGLB_VIP_F_CLIENT_AFFINITY 0x8
/* Bits 8..31 of vip_info.flags: the affinity timeout in seconds
 * (sessionAffinityConfig.clientIP.timeoutSeconds, at most 86400). */
#define RINGLB_VIP_AFFINITY_SHIFT 8
/* Another region's VIP accepted here for failover (docs/datapath.md, Failover
 * VIPs): forwarded only for an IPIP packet whose outer destination is in
 * vip_addrs (one of this edge's own VIPs), decapsulated first; a plain packet
 * to it is passed. Its backends are never remote (the loop guard). */
#define RINGLB_VIP_F_FAILOVER_ALIAS 0x2

/* ---- rings: ARRAY_OF_MAPS vip_id -> inner ARRAY[ring_size] of backend id -- */
/* inner maps are created by the loader with BPF_F_INNER_MAP so M may vary */

/* ---- backends: ARRAY backend id -> backend -------------------------------- */
struct ringlb_backend {
	__u32 addr[4];    /* be, the pod IP the packet is tunnelled to */
	__u32 gen;        /* generation, bumped every time an id is (re)assigned */
	__u32 ifindex;    /* egress interface of the next hop; 0 = same as ingress */
	__u8 dmac[6];     /* next-hop MAC (the router, or the pod's node on-link) */
	__u8 smac[6];     /* our MAC on ifindex */
	__u8 family;      /* RINGLB_AF_*; 0 = slot unused */
	__u8 nh_valid;    /* RINGLB_NH_*: bit 0 = dmac/smac/ifindex/vlan_tci resolved by the loader;
			   * and RINGLB_BE_F_REMOTE_VIP */
	__u16 vlan_tci;   /* be; egress 802.1Q/802.1ad tag of the next hop (PCP 0, DEI 0, VID);
			   * 0 = the frame leaves untagged */
};                        /* 40 bytes */

/* nh_valid bits. The egress L2 header is decided by the next hop alone: tagged
 * with vlan_tci (TPID 0x8100, or 0x88a8 with RINGLB_NH_VLAN_8021AD) when it is
 * non-zero, untagged otherwise, whatever tag the frame came in with. */
#define RINGLB_NH_VALID       0x1
#define RINGLB_NH_VLAN_8021AD 0x2 /* vlan_tci goes under TPID 0x88a8 (802.1ad), not 0x8100 */
/* Not a next-hop bit (it shares the byte): addr is another region's VIP (a
 * failover target), encapsulated to like a pod. A decapsulated packet is never
 * sent to one (RINGLB_ST_FAILOVER_LOOP). */
#define RINGLB_BE_F_REMOTE_VIP 0x4
/* Not a next-hop bit either: addr is a pod on this node (docs/datapath.md,
 * Pods on edge nodes). The encapsulated frame keeps the L2 header it came in
 * with and is passed (XDP_PASS) to this port's stack, where the node agent's
 * tc ingress program decapsulates it; the other next-hop fields are unused. */
#define RINGLB_BE_F_LOCAL 0x8

/* ---- conntrack: LRU_HASH (BPF_F_NO_COMMON_LRU) flow -> ct_value ---------- */
struct ringlb_flow {
	__u32 saddr[4];   /* be */
	__u32 daddr[4];   /* be */
	__u16 sport;      /* be */
	__u16 dport;      /* be */
	__u8 proto;
	__u8 family;
	__u8 flags;       /* RINGLB_FLOW_F_* */
	__u8 pad;
};                        /* 40 bytes */

/* A decapsulated (failed-over) flow: its entries are apart from a plain
 * packet's of the same 5-tuple, so a plain packet never follows an alias's
 * entry and a failed-over one never follows a plain VIP's. */
#define RINGLB_FLOW_F_DECAP 0x1

struct ringlb_ct_value {
	__u32 backend_id;
	__u32 gen;        /* must equal backends[backend_id].gen, else stale */
};                        /* 8 bytes */

/* ---- affinity: LRU_HASH (BPF_F_NO_COMMON_LRU) client of a VIP -> its pod --- */
#define RINGLB_AFFINITY_SIZE 65536 /* clients with affinity (LRU, per-CPU lists) */
struct ringlb_affinity_key {
	__u32 saddr[4];   /* be, the client */
	__u32 vip_id;     /* the VIP:port:proto entry (its ring) */
	__u8 family;      /* RINGLB_AF_* */
	__u8 pad[3];
};                        /* 24 bytes */

struct ringlb_affinity_value {
	__u32 backend_id; /* the pod the client's last new flow took */
	__u32 gen;        /* must equal backends[backend_id].gen, else gone */
	__u64 last_ns;    /* CLOCK_MONOTONIC ns of that flow's first packet
			   * (affinity.h, ringlb_affinity_now) */
};                        /* 16 bytes */

/* ---- owners: ARRAY backend id -> 1 + vip_id of the VIP owning it; 0 = none -- */
/* Bit RINGLB_OWNER_F_SRC_RANGES of the value: that VIP has source ranges
 * (RINGLB_VIP_F_SRC_RANGES), so a conntrack hit checks its source too. Bit
 * RINGLB_OWNER_F_DRAINING: the VIP's ring does not name this backend (a
 * terminating pod kept for its established flows), so a client's affinity to
 * it does not hold for a new flow. The rest (RINGLB_OWNER_VIP_MASK) is
 * 1 + vip_id. */
#define RINGLB_OWNER_F_SRC_RANGES 0x80000000
#define RINGLB_OWNER_F_DRAINING   0x40000000
#define RINGLB_OWNER_VIP_MASK     0x3fffffff
/* Backend ids belong to one (VIP, pod) pair. The loader keeps this map current
 * (also when a VIP moves to a new ring, i.e. a new vip_id) and reads it back
 * after a restart; the program reads it on a conntrack hit, which skips the
 * vips lookup, to count the packet for the right VIP. BPF_F_MMAPABLE. */

/* ---- vip_addrs: HASH vip_key (port 0, proto 0) -> __u32 (1) ------------- */
/* The addresses of this edge's own VIPs (every VIP entry but failover
 * aliases): an IPIP packet is decapsulated only when its outer destination is
 * one of them, and any other packet to one that no VIP entry forwards is
 * answered (echo) or dropped, never passed (vip_addr.h). Kept by the loader
 * from its view after every apply. */

/* ---- src_ranges: LPM_TRIE src_key -> __u32 family, BPF_F_NO_PREALLOC ------ */
/* The source prefixes each restricted VIP accepts, keyed by its vip_id (one
 * VIP:port:proto entry, so two Services on one address have their own). The
 * lookup key is (160, vip_id, saddr); an entry's prefixlen is 32 + the
 * source prefix length (IPv4: 32 + 0..32 over address word 0). The value is
 * the prefix's RINGLB_AF_* (for the loader's read-back; the program only
 * asks whether an entry matches). */
#define RINGLB_MAX_SRC_RANGES 65536
struct ringlb_src_key {
	__u32 prefixlen;  /* LPM: bits of vip_id + addr that must match */
	__u32 vip_id;     /* host order (always matched whole) */
	__u32 addr[4];    /* be */
};                        /* 24 bytes */

/* ---- src_sets: ARRAY set -> src_set; src_set_of: ARRAY vip_id -> __u32 set ---- */
/* A VIP with 1..RINGLB_SRC_SET_NETS ranges has them in one set, scanned in
 * place (two inlined array reads and a few compares, against a trie walk):
 * src_set_of[vip_id] names it; 0 = none, the VIP's ranges are in src_ranges
 * (more of them, or none at all: closed). A set is written while no VIP
 * names it and never changed while one does: the loader writes a new set
 * and then points the VIP at it (one 4-byte store), and reuses the old set
 * only in a later update. Set 0 is never used. */
#define RINGLB_SRC_SET_NETS 8
#define RINGLB_MAX_SRC_SETS 16384
struct ringlb_src_net {
	__u32 addr[4];    /* be, host bits zero */
	__u32 mask[4];    /* be; IPv4: word 0 only, words 1..3 zero */
};                        /* 32 bytes */
struct ringlb_src_set {
	__u32 n;          /* nets in use, 1..RINGLB_SRC_SET_NETS */
	__u32 pad;
	struct ringlb_src_net net[RINGLB_SRC_SET_NETS];
};                        /* 264 bytes */

/* ---- decap_senders: LPM_TRIE decap_sender_key -> __u8 1, BPF_F_NO_PREALLOC - */
/* The outer IPv4 sources whose IPIP packets to one of this edge's VIPs are
 * decapsulated for failover (the other region's edges, from the edge's
 * --failover-senders); any other sender's are dropped and counted
 * (RINGLB_ST_DROP_DECAP_SENDER). Empty: no failover traffic is accepted. */
#define RINGLB_MAX_DECAP_SENDERS 1024
struct ringlb_decap_sender_key {
	__u32 prefixlen;  /* LPM: bits of addr that must match, 0..32 */
	__u32 addr;       /* be */
};                        /* 8 bytes */

/* ---- src_drops: PERCPU_ARRAY vip_id -> __u64 -------------------------------- */
/* packets to the VIP dropped for a source outside its ranges (zeroed when a
 * VIP gets the vip_id, as vip_stats) */

/* ---- vip_filter: ARRAY word -> __u64, a Bloom filter of VIP addresses ---- */
/* bit ringlb_vip_filter_bit(daddr) (vip_filter.h) set = maybe a VIP address */

/* ---- flow_filter: ARRAY[1] of one ringlb_flow_filter, BPF_F_MMAPABLE ------ */
/* A superset of the conntrack keys, by slot (flow_filter.h): a SYN whose slot
 * is clear in the active half skips its conntrack lookup. Two halves, so that
 * the loader can rebuild one while the program reads the other. */
struct ringlb_flow_filter {
	__u8 active;      /* the half SYNs read (0 or 1); only the loader writes it */
	__u8 pad[63];     /* the slots start on their own cache line */
	/* slot s of half h: bit (2*s + h) % 64 of word (2*s + h) / 64 */
	__u64 word[2 * RINGLB_FLOW_FILTER_SLOTS / 64];
};

/* ---- bfd_hold: HASH bfd_hold_key -> bfd_hold ------------------------------ */
/* BFD sessions held by the program across a hitless agent restart
 * (bfd_hold.h): the exiting agent writes one entry per IPv4 session that is Up
 * and whose peer is behind this interface; until deadline_ns the program
 * answers that peer's Control packets itself, Up, with the stored
 * discriminators and intervals; the next agent resumes the session and deletes
 * the entry. All BFD fields are in wire (network) order. */
#define RINGLB_BFD_HOLD_MAX 64          /* held sessions (one per BFD peer) */
#define RINGLB_BFD_PORT     3784        /* single-hop BFD Control (RFC 5881) */

struct ringlb_bfd_hold_key {
	__u32 local;      /* be, our IPv4 address (the packet's destination) */
	__u32 peer;       /* be, the peer's IPv4 address (the packet's source) */
};                        /* 8 bytes */

struct ringlb_bfd_hold {
	__u64 deadline_ns;    /* CLOCK_MONOTONIC (bpf_ktime_get_ns): answered before it only */
	__u64 answered;       /* packets answered with XDP_TX (the program adds) */
	__u64 last_ns;        /* when the last one was answered; 0 = none yet */
	__u32 my_disc;        /* be, our My Discriminator */
	__u32 your_disc;      /* be, the peer's (its packets must carry it as My Discriminator) */
	__u32 min_tx_us;      /* be, our Desired Min TX Interval, microseconds */
	__u32 min_rx_us;      /* be, our Required Min RX Interval, microseconds */
	__u32 peer_min_tx_us; /* be, the peer's last Desired Min TX (for the next agent) */
	__u32 peer_min_rx_us; /* be, the peer's last Required Min RX (for the next agent) */
	__u16 src_port;       /* be, the UDP source port the agent sent from */
	__u8 detect_mult;     /* our Detect Mult */
	__u8 peer_mult;       /* the peer's Detect Mult (for the next agent) */
	__u32 refused;        /* the peer's packets not answered (not Up, other
			       * discriminators, TTL, auth, demand, options, ...):
			       * passed to the kernel; the program adds */
};                            /* 56 bytes */

/* ---- config: ARRAY[1] ------------------------------------------------------ */
struct ringlb_config {
	__u32 src4;       /* be, outer source for IPv4 outer headers; 0 = no v4 encap */
	__u32 src6[4];    /* be, outer source for IPv6 outer headers; :: = no v6 encap */
	__u32 mtu;        /* max L3 size after encapsulation (the egress MTU) */
	__u32 flags;      /* RINGLB_CFG_F_* */
};                        /* 28 bytes */

#define RINGLB_CFG_F_FIB_FALLBACK 0x1 /* bpf_fib_lookup when nh_valid == 0 */

/* ---- counters --------------------------------------------------------------- */
/* per-VIP: PERCPU_ARRAY vip_id -> ringlb_vip_stats */
struct ringlb_vip_stats {
	__u64 packets;
	__u64 bytes;
};                        /* 16 bytes */

/* per-VIP: PERCPU_ARRAY vip_id -> ringlb_ct_budget, the conntrack inserts of
 * new flows this CPU made for the VIP in its current window (conntrack.h,
 * ringlb_ct_budget_take). Program state: the loader only zeroes an entry when
 * it gives the vip_id to a VIP, as it does vip_stats'. */
struct ringlb_ct_budget {
	__u64 start;      /* bpf_ktime_get_ns() when the window opened */
	__u32 used;       /* inserts in the window; 0 = no window yet */
	__u32 pad;
};                        /* 16 bytes */

/* global: PERCPU_ARRAY index -> __u64; verdicts and reasons */
enum ringlb_stat {
	RINGLB_ST_TX = 0,          /* encapsulated, XDP_TX */
	RINGLB_ST_REDIRECT,        /* encapsulated, bpf_redirect to another port */
	RINGLB_ST_PASS_NOT_IP,     /* not IPv4/IPv6 (ARP, LLDP, ...) */
	RINGLB_ST_PASS_NOT_VIP,    /* IP, but no VIP entry */
	RINGLB_ST_PASS_ICMP,       /* ICMP/ICMPv6 not to a VIP address: the kernel handles it */
	RINGLB_ST_PASS_FRAGMENT,   /* IPv4 fragment or IPv6 fragment header, not to a VIP address */
	RINGLB_ST_PASS_IPV6_EXT,   /* IPv6 extension headers we do not walk (not to a VIP address) */
	RINGLB_ST_PASS_OTHER_L4,   /* neither TCP nor UDP (not to a VIP address) */
	RINGLB_ST_PASS_MALFORMED,  /* truncated or inconsistent headers */
	RINGLB_ST_PASS_MTU,        /* would exceed config.mtu after encapsulation, IPv4
				    * without DF (or too short to quote): passed */
	RINGLB_ST_PASS_NO_SRC,     /* no outer source address for the backend's family */
	RINGLB_ST_DROP_NO_BACKEND, /* VIP with an empty ring / missing backend */
	RINGLB_ST_DROP_FIB,        /* no resolved next hop and bpf_fib_lookup failed */
	RINGLB_ST_DROP_ADJUST,     /* bpf_xdp_adjust_head failed */
	RINGLB_ST_CT_HIT,          /* conntrack hit (informational) */
	RINGLB_ST_CT_MISS,         /* conntrack miss -> Maglev ring (informational) */
	RINGLB_ST_CT_STALE,        /* conntrack entry pointed at a removed backend */
	RINGLB_ST_FIB_FALLBACK,    /* next hop came from bpf_fib_lookup */
	RINGLB_ST_ICMP_TOO_BIG,    /* too big for the tunnel: answered with ICMP Frag Needed
				    * (IPv4 with DF) or ICMPv6 Packet Too Big, XDP_TX */
	RINGLB_ST_CT_SYN_RING,     /* a SYN forwarded by the ring without a conntrack insert
				    * (the flow's next packet inserts): a SYN flood evicts
				    * no established flow */
	RINGLB_ST_CT_SYN_REWRITE,  /* a SYN found its 5-tuple's old entry naming another
				    * backend (port reuse after a ring change): rewritten */
	RINGLB_ST_FAILOVER_IN,     /* an IPIP packet to one of our VIPs, decapsulated and
				    * forwarded by a failover alias (informational) */
	RINGLB_ST_FAILOVER_OUT,    /* a packet sent to a remote-VIP backend (informational) */
	RINGLB_ST_PASS_DECAP_NOT_OURS, /* IPIP whose outer destination passed the VIP filter
				    * but is no VIP address of ours (IPIP to one that
				    * has IP options, or whose inner packet is no IPv4
				    * TCP/UDP packet: RINGLB_ST_DROP_VIP_OTHER) */
	RINGLB_ST_DROP_DECAP_NO_ALIAS, /* IPIP to one of our VIPs whose inner destination
				    * (addr, port, proto) is no failover alias: dropped
				    * (passed, the kernel would route it back to the ToR) */
	RINGLB_ST_PASS_ALIAS_PLAIN,/* a plain (not encapsulated) packet to a failover alias */
	RINGLB_ST_FAILOVER_LOOP,   /* a decapsulated packet whose backend is a remote VIP:
				    * dropped (the loader never programs one) */
	RINGLB_ST_CT_SYN_FILTERED, /* a SYN whose flow filter slot was clear: no conntrack
				    * entry can exist, so no lookup (forwarded by the ring,
				    * nothing inserted; ct_syn_ring counts the SYNs that
				    * looked up) */
	RINGLB_ST_CT_OVER_BUDGET,  /* a new flow's packet its VIP's conntrack insert budget
				    * (this CPU, this window) had no room for: forwarded by
				    * the ring, nothing inserted (a flood of new flows
				    * evicts no established flow) */
	RINGLB_ST_LOCAL,           /* encapsulated to a pod on this node (RINGLB_BE_F_LOCAL):
				    * XDP_PASS to the node agent's tc program on this port */
	RINGLB_ST_DROP_SOURCE_RANGE, /* a packet to a VIP with source ranges from a source
				    * outside them (src_ranges.h): dropped before the ring
				    * and any conntrack insert, also on a conntrack hit */
	RINGLB_ST_ICMP_ECHO,       /* an ICMP/ICMPv6 echo request to one of our VIP addresses:
				    * answered from the VIP, XDP_TX (vip_addr.h) */
	RINGLB_ST_DROP_NO_SERVICE, /* TCP/UDP to one of our VIP addresses on a port and
				    * protocol no VIP entry has: dropped (passed, the
				    * kernel would route it back to the ToR: a loop) */
	RINGLB_ST_DROP_VIP_ICMP,   /* ICMP/ICMPv6 to one of our VIP addresses other than an
				    * echo request we answer (errors, echo replies,
				    * IPv4 options): dropped */
	RINGLB_ST_DROP_VIP_OTHER,  /* a fragment, IPv6 extension headers or another
				    * protocol to one of our VIP addresses, or IPIP to
				    * one that the failover path cannot parse: dropped */
	RINGLB_ST_AFFINITY_HIT,    /* a new flow of a VIP with affinity sent to the pod
				    * its client had, from the affinity map (informational) */
	RINGLB_ST_AFFINITY_NEW,    /* a new flow of a VIP with affinity whose client had
				    * no live pod there: the ring chose, recorded
				    * (informational) */
	RINGLB_ST_DROP_DECAP_SENDER, /* IPIP to one of our VIPs from an outer source
				    * outside decap_senders (not the other region's
				    * edges): dropped, never decapsulated */
	RINGLB_ST_MAX,
};

/* ---- map names (the loader finds maps by these) ----------------------------- */
/* vips, rings, backends, conntrack, owners, config, vip_stats, stats, vip_filter,
 * vip_addrs, flow_filter, bfd_hold, ct_budget, src_ranges, src_drops, src_sets,
 * src_set_of, affinity, decap_senders */

#endif /* RINGLB_ABI_H */
