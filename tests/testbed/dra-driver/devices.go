package main

import (
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

// fakeUUID is stable per (node, index) and shaped like nvidia-smi's GPU UUIDs.
func fakeUUID(node string, index int) string {
	var h uint64 = 14695981039346656037 // FNV-1a 64
	for _, b := range []byte(fmt.Sprintf("%s/%d", node, index)) {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x", uint32(h>>32), uint16(h>>16), uint16(h), index, h&0xffffffffffff)
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
