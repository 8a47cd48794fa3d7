/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * node_abi.h - THE definition of the ringlb node datapath ABI (the tc
 * programs on worker nodes): map names, sizes, key/value layouts and counter
 * indices. node.bpf.c includes it; node/src/abi.rs mirrors it with #[repr(C)]
 * structs and compile-time size checks, and the test `abi_matches_object`
 * checks the compiled object's maps against the Rust side.
 *
 * Rules: fixed-width types only, explicit padding, no bool, every struct a
 * multiple of 4 bytes. Fields marked "be" are network byte order. Addresses
 * are 4 words: IPv4 in word 0 (words 1..3 zero), always next to a family byte.
 */
#ifndef RINGLB_NODE_ABI_H
#define RINGLB_NODE_ABI_H

#include <linux/types.h>

/* ---- sizes ---------------------------------------------------------------- */
#define RINGLB_NODE_MAX_PODS     16384   /* local pod addresses (both families) */
#define RINGLB_NODE_MAX_SERVICES 65536   /* (tunnel dst, VIP, port, proto) entries */
#define RINGLB_NODE_FLOWS        131072  /* translated flows (LRU) */
#define RINGLB_NODE_MAX_EDGES    4096    /* allowed outer sources (both families) */

/* ---- families (same values as AF_INET / AF_INET6) ------------------------- */
#define RINGLB_NODE_AF_INET  2
#define RINGLB_NODE_AF_INET6 10

/* ---- local_pods: HASH addr -> pod ----------------------------------------- */
/* Every address of every pod on this node that a Service can send traffic
 * to. Only IPIP/IP6IP6 whose OUTER destination is one of these is decapsulated. */
struct ringlb_node_addr {
	__u32 addr[4];   /* be */
	__u8 family;     /* RINGLB_NODE_AF_* */
	__u8 pad[3];
};                       /* 20 bytes */

struct ringlb_node_pod {
	__u32 flags;     /* reserved, 0 */
};                       /* 4 bytes */

/* ---- edges: HASH addr -> edge --------------------------------------------- */
/* The outer sources a tunnel to a local pod may come from: the node addresses
 * of this cluster's edges. With RINGLB_NODE_CFG_CHECK_SOURCE set, a tunnel to a
 * local pod from any other source is dropped (RINGLB_NODE_ST_DROP_SOURCE). Keyed
 * by struct ringlb_node_addr. */
struct ringlb_node_edge {
	__u32 flags;     /* reserved, 0 */
};                       /* 4 bytes */

/* ---- services: HASH svc_key -> svc_value ---------------------------------- */
/* Per pod, not global: Kubernetes resolves a named targetPort per pod, so two
 * pods of one Service may listen on different ports. The key starts with the
 * outer destination the edge tunnelled to; the value names the inner
 * destination to rewrite to (the pod's address of the VIP's family, which is
 * the tunnel destination itself unless the pod is dual-stack and the edge
 * tunnels across families). */
struct ringlb_node_svc_key {
	__u32 tunnel_dst[4]; /* be, the outer destination (a local pod address) */
	__u32 vip[4];        /* be, the inner destination before translation */
	__u16 vip_port;      /* be */
	__u8 proto;          /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 family;         /* RINGLB_NODE_AF_* of the VIP (inner header) */
	__u8 tunnel_family;  /* RINGLB_NODE_AF_* of the outer header */
	__u8 pad[3];
};                           /* 40 bytes */

struct ringlb_node_svc_value {
	__u32 pod[4];        /* be, the inner destination after translation */
	__u16 target_port;   /* be */
	__u16 pad;
};                           /* 20 bytes */

/* ---- flows: LRU_HASH flow_key -> flow_value ------------------------------- */
/* Written by the ingress program for every translated packet (only when
 * missing or changed); read by the reply program. Keyed as the REPLY sees it
 * after the pod answered: pod:target_port -> client:port. */
struct ringlb_node_flow_key {
	__u32 client[4];     /* be */
	__u32 pod[4];        /* be */
	__u16 client_port;   /* be */
	__u16 pod_port;      /* be, the target port */
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};                           /* 40 bytes */

struct ringlb_node_flow_value {
	__u32 vip[4];        /* be */
	__u16 vip_port;      /* be */
	__u16 pad;
};                           /* 20 bytes */

/* ---- config: ARRAY[1] ----------------------------------------------------- */
struct ringlb_node_config {
	__u16 mss4;          /* host order; clamp the MSS of IPv4 SYN-ACKs to this; 0 = off */
	__u16 mss6;          /* host order; the same for IPv6 */
	__u32 flags;         /* RINGLB_NODE_CFG_* */
};                           /* 8 bytes */

/* decapsulate only tunnels whose outer source is in `edges` */
#define RINGLB_NODE_CFG_CHECK_SOURCE 1

/* ---- counters: PERCPU_ARRAY index -> __u64 -------------------------------- */
enum ringlb_node_stat {
	/* ingress (uplink) */
	RINGLB_NODE_ST_DECAP4 = 0,     /* outer IPv4 removed */
	RINGLB_NODE_ST_DECAP6,         /* outer IPv6 removed */
	RINGLB_NODE_ST_DNAT,           /* inner VIP:port rewritten to pod:targetPort */
	RINGLB_NODE_ST_FLOW_NEW,       /* flow entry written (new or changed) */
	RINGLB_NODE_ST_FLOW_ERR,       /* flow entry could not be written (packet still delivered) */
	RINGLB_NODE_ST_NO_SERVICE,     /* tunnel to a local pod, no (VIP, port, proto) entry: passed */
	RINGLB_NODE_ST_NOT_LOCAL,      /* tunnel to an address that is no local pod: passed */
	RINGLB_NODE_ST_INNER_UNSUP,    /* inner fragment / not TCP-UDP / IPv6 ext headers: passed */
	RINGLB_NODE_ST_DROP_ADJUST,    /* bpf_skb_adjust_room or a rewrite failed: dropped */
	RINGLB_NODE_ST_FLOW_FORGET,    /* plain SYN to a local pod removed a stale flow */
	RINGLB_NODE_ST_INGRESS_PASS,   /* anything else on ingress: untouched */
	/* reply (uplink egress) */
	RINGLB_NODE_ST_REPLY_SNAT,     /* pod:targetPort rewritten to VIP:port */
	RINGLB_NODE_ST_MSS_CLAMPED,    /* MSS option of a SYN-ACK lowered */
	RINGLB_NODE_ST_ICMP_XLATE,     /* ICMP error about a translated flow rewritten */
	RINGLB_NODE_ST_ICMP_NO_FLOW,   /* ICMP error about an untranslated flow: untouched */
	RINGLB_NODE_ST_DROP_REWRITE,   /* a reply rewrite failed half-way: dropped */
	RINGLB_NODE_ST_EGRESS_PASS,    /* anything else on egress: untouched */
	/* ingress, added later (indices above are kept) */
	RINGLB_NODE_ST_DROP_SOURCE,    /* tunnel to a local pod from a source that is no edge: dropped */
	RINGLB_NODE_ST_MAX,
};

/* ---- program and map names (the loader finds them by these) -------------- */
/* programs: ringlb_node_ingress, ringlb_node_egress
 * maps: local_pods, edges, services, flows, node_config, node_stats */

#endif /* RINGLB_NODE_ABI_H */
