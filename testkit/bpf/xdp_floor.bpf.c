// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * xdp_floor.bpf.c - benchmark floor: swap the Ethernet addresses and XDP_TX.
 * The least any XDP_TX load balancer can do per packet; xdp-bench measures
 * ringlb_xdp against it by the same method.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int ringlb_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 tmp[ETH_ALEN];

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
	return XDP_TX;
}

SEC("xdp")
int ringlb_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* xdp-bench's veth section: the sender's end drops what comes back */
SEC("xdp")
int ringlb_drop(struct xdp_md *ctx)
{
	return XDP_DROP;
}

char _license[] SEC("license") = "GPL";
