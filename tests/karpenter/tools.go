//go:build tools

// Package tools pins Karpenter's kwok provider binary (sigs.k8s.io/karpenter/kwok) in this module so that
// build.sh builds exactly the version go.mod names.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
