//go:build tools

// Package tools records the one binary this wrapper module exists to build, so `go mod tidy` keeps
// sigs.k8s.io/prometheus-adapter and its dependencies pinned in go.mod/go.sum.
package tools

import _ "sigs.k8s.io/prometheus-adapter/cmd/adapter"
