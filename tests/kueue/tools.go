//go:build tools

// Package kueue pins the Kueue manager (sigs.k8s.io/kueue/cmd/kueue) that build-kueue.sh builds for the
// NVLink-domain e2e (Kueue Topology Aware Scheduling with a clique level). Nothing here is compiled.
package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
