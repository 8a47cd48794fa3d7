//go:build tools

// Package tools pins the upstream main packages that scripts/build-k8s.sh builds:
// upstream's own cmd/ mains, unchanged, at the versions go.mod pins. The control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl), the node
// programs of the real-cluster harness (kubelet, kube-proxy) and the test image
// program agnhost, and the e2e suite that `make conformance` runs (test/e2e, built
// with `go test -c`).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
