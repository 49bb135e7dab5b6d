package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// PreparedClaim is what the driver remembers about one prepared ResourceClaim (the kubelet passes only
// UID, namespace and name to NodeUnprepareResources).
type PreparedClaim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []string `json:"devices"`
}

// State is the driver's checkpoint: the claims prepared now, by UID. It is written atomically after every
// change, so a restarted driver unprepares what its predecessor prepared, and a test reads it to see
// NodePrepareResources / NodeUnprepareResources happen.
type State struct {
	Claims map[types.UID]PreparedClaim `json:"claims"`
}

// driver implements kubeletplugin.DRAPlugin for fake GPUs: preparing a claim checks that no device is
// already held by another claim and records it; no CDI devices are returned (the test node's containerd
// 1.6 has no CDI, and the kubelet starts the container with an empty device list).
type driver struct {
	// The embedded interface is nil. It makes this type a kubeletplugin.DRAPlugin in every
	// dynamic-resource-allocation version, including those whose interface has more methods than the three
	// below (v0.37 adds WatchHealthStatus). Those promoted methods must never be called:
	// rejectHealthStreams answers the only caller (the DRAResourceHealth gRPC service) with Unimplemented,
	// which tells the kubelet to stop watching.
	kubeletplugin.DRAPlugin

	name      string
	statePath string
	cancel    context.CancelCauseFunc

	mu    sync.Mutex
	state State
}

func newDriver(name, statePath string, cancel context.CancelCauseFunc) (*driver, error) {
	d := &driver{name: name, statePath: statePath, cancel: cancel, state: State{Claims: map[types.UID]PreparedClaim{}}}
	raw, err := os.ReadFile(statePath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read state %s: %w", statePath, err)
	default:
		if err := json.Unmarshal(raw, &d.state); err != nil {
			return nil, fmt.Errorf("parse state %s: %w", statePath, err)
		}
		if d.state.Claims == nil {
			d.state.Claims = map[types.UID]PreparedClaim{}
		}
	}
	return d, d.save()
}

func (d *driver) save() error {
	raw, err := json.MarshalIndent(d.state, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.statePath + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Clean(d.statePath))
}

// holders maps each prepared device to the claim holding it.
func (d *driver) holders() map[string]types.UID {
	out := map[string]types.UID{}
	for uid, c := range d.state.Claims {
		for _, dev := range c.Devices {
			out[dev] = uid
		}
	}
	return out
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		result[claim.UID] = d.prepare(claim)
		if err := result[claim.UID].Err; err != nil {
			logger.Error(err, "prepare failed", "claim", klog.KObj(claim))
			continue
		}
		logger.Info("prepared", "claim", klog.KObj(claim), "uid", claim.UID, "devices", d.state.Claims[claim.UID].Devices)
	}
	if err := d.save(); err != nil {
		return nil, fmt.Errorf("save state: %w", err)
	}
	return result, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	holders := d.holders()
	var devices []kubeletplugin.Device
	var names []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if holder, ok := holders[r.Device]; ok && holder != claim.UID {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s is already prepared for claim %s", r.Device, holder)}
		}
		devices = append(devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
		names = append(names, r.Device)
	}
	sort.Strings(names)
	d.state.Claims[claim.UID] = PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: names}
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		prev, ok := d.state.Claims[claim.UID]
		delete(d.state.Claims, claim.UID) // idempotent: unpreparing an unknown claim is not an error
		result[claim.UID] = nil
		logger.Info("unprepared", "claim", claim.NamespacedName, "uid", claim.UID, "devices", prev.Devices, "wasPrepared", ok)
	}
	if err := d.save(); err != nil {
		return nil, fmt.Errorf("save state: %w", err)
	}
	return result, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx)
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		logger.Error(err, msg, "recoverable", true)
		return
	}
	logger.Error(err, msg, "recoverable", false)
	d.cancel(fmt.Errorf("%s: %w", msg, err))
}
