package main

import (
	"crypto/sha1"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// Standard attribute names (k8s.io/dynamic-resource-allocation/deviceattribute: pcieRoot since v0.34,
// numaNode since v0.37). Spelled out here so the driver builds against v0.35 too.
const (
	attrPCIeRoot = resourceapi.QualifiedName("resource.kubernetes.io/pcieRoot")
	attrNUMANode = resourceapi.QualifiedName("resource.kubernetes.io/numaNode")
	attrUUID     = resourceapi.QualifiedName("uuid")
	attrIndex    = resourceapi.QualifiedName("index")
	attrModel    = resourceapi.QualifiedName("productName")
)

// Topology is the fake machine: Devices GPUs spread evenly over NUMANodes NUMA nodes, each NUMA node's
// GPUs spread evenly over PCIeRootsPerNUMA root complexes.
type Topology struct {
	Node             string
	Devices          int
	NUMANodes        int
	PCIeRootsPerNUMA int
	MemoryGiB        int64
}

// Validate refuses a topology whose devices do not split evenly (an uneven split would make "4 GPUs of one
// NUMA node" depend on the numbers in a way no test expects).
func (t Topology) Validate() error {
	switch {
	case t.Node == "":
		return fmt.Errorf("node name is empty")
	case t.Devices < 1:
		return fmt.Errorf("devices must be >= 1, got %d", t.Devices)
	case t.NUMANodes < 1 || t.Devices%t.NUMANodes != 0:
		return fmt.Errorf("devices (%d) must split evenly over NUMA nodes (%d)", t.Devices, t.NUMANodes)
	case t.PCIeRootsPerNUMA < 1 || (t.Devices/t.NUMANodes)%t.PCIeRootsPerNUMA != 0:
		return fmt.Errorf("GPUs per NUMA node (%d) must split evenly over PCIe roots per NUMA node (%d)",
			t.Devices/t.NUMANodes, t.PCIeRootsPerNUMA)
	}
	return nil
}

// GPU is one published device and where it sits.
type GPU struct {
	Name     string
	Index    int
	UUID     string
	NUMANode int
	PCIeRoot string
}

// GPUs lays the devices out: index i sits on NUMA node i / perNUMA and PCIe root i / perRoot, so the
// lower half of the indices is NUMA node 0 (as nvidia-smi topo shows a two-socket 8-GPU machine).
func (t Topology) GPUs() []GPU {
	perNUMA := t.Devices / t.NUMANodes
	perRoot := perNUMA / t.PCIeRootsPerNUMA
	out := make([]GPU, 0, t.Devices)
	for i := 0; i < t.Devices; i++ {
		out = append(out, GPU{
			Name:     fmt.Sprintf("gpu-%d", i),
			Index:    i,
			UUID:     fakeUUID(t.Node, i),
			NUMANode: i / perNUMA,
			PCIeRoot: fmt.Sprintf("pci0000:%02x", (i/perRoot)*0x10),
		})
	}
	return out
}

// uuidNamespace is the fleet simulator's (harness/simulator/hardware.py): a GPU gets the same UUID here as
// in the DCGM metrics the simulator exports for the node, as a real GPU has in dcgm-exporter and in its DRA
// driver's ResourceSlice.
var uuidNamespace = [16]byte{0x6a, 0x1f, 0x0c, 0x1e, 0x4f, 0x5b, 0x4a, 0x43, 0x9d, 0x7e, 0x7f, 0x3b, 0x3c, 0x2a, 0x9e, 0x10}

// fakeUUID is stable per (node, index) and shaped like nvidia-smi's GPU UUIDs: "GPU-" and the RFC 4122
// version-5 UUID of "<node>/<index>" in uuidNamespace (Python's uuid.uuid5).
func fakeUUID(node string, index int) string {
	h := sha1.New()
	h.Write(uuidNamespace[:])
	h.Write([]byte(fmt.Sprintf("%s/%d", node, index)))
	u := h.Sum(nil)[:16]
	u[6] = (u[6] & 0x0f) | 0x50 // version 5
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Devices is the ResourceSlice content for the topology.
func (t Topology) ResourceDevices() []resourceapi.Device {
	gpus := t.GPUs()
	out := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, resourceapi.Device{
			Name: g.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				attrUUID:     {StringValue: ptr.To(g.UUID)},
				attrIndex:    {IntValue: ptr.To(int64(g.Index))},
				attrModel:    {StringValue: ptr.To("gpuwarden test GPU")},
				attrPCIeRoot: {StringValue: ptr.To(g.PCIeRoot)},
				attrNUMANode: {IntValue: ptr.To(int64(g.NUMANode))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(t.MemoryGiB<<30, resource.BinarySI)},
			},
		})
	}
	return out
}
