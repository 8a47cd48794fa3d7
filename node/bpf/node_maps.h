/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* node_maps.h - the node programs' maps (layouts in node_abi.h) and counting. */
#ifndef RINGLB_NODE_MAPS_H
#define RINGLB_NODE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "node_abi.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_NODE_MAX_PODS);
	__type(key, struct ringlb_node_addr);
	__type(value, struct ringlb_node_pod);
} local_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_NODE_MAX_EDGES);
	__type(key, struct ringlb_node_addr);
	__type(value, struct ringlb_node_edge);
} edges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RINGLB_NODE_MAX_SERVICES);
	__type(key, struct ringlb_node_svc_key);
	__type(value, struct ringlb_node_svc_value);
} services SEC(".maps");

/* One LRU shared by all CPUs: the ingress program writes on the CPU that
 * received the request, the reply program reads on the CPU the pod answered
 * from; a common LRU evicts by global recency, not per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RINGLB_NODE_FLOWS);
	__type(key, struct ringlb_node_flow_key);
	__type(value, struct ringlb_node_flow_value);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ringlb_node_config);
} node_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RINGLB_NODE_ST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} node_stats SEC(".maps");

static __always_inline void node_count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&node_stats, &idx);
	if (v)
		*v += 1;
}

#endif /* RINGLB_NODE_MAPS_H */
