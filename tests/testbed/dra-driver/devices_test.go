package main

import "testing"

func TestLayout(t *testing.T) {
	cases := []struct {
		name      string
		topo      Topology
		wantNUMA  []int
		wantRoots []string
		wantErr   bool
	}{
		{
			name:      "default 2 NUMA x 4, 2 roots per NUMA",
			topo:      Topology{Node: "n", Devices: 8, NUMANodes: 2, PCIeRootsPerNUMA: 2},
			wantNUMA:  []int{0, 0, 0, 0, 1, 1, 1, 1},
			wantRoots: []string{"pci0000:00", "pci0000:00", "pci0000:10", "pci0000:10", "pci0000:20", "pci0000:20", "pci0000:30", "pci0000:30"},
		},
		{
			name:      "one NUMA node, one root",
			topo:      Topology{Node: "n", Devices: 2, NUMANodes: 1, PCIeRootsPerNUMA: 1},
			wantNUMA:  []int{0, 0},
			wantRoots: []string{"pci0000:00", "pci0000:00"},
		},
		{name: "uneven NUMA split", topo: Topology{Node: "n", Devices: 6, NUMANodes: 4, PCIeRootsPerNUMA: 1}, wantErr: true},
		{name: "uneven root split", topo: Topology{Node: "n", Devices: 8, NUMANodes: 2, PCIeRootsPerNUMA: 3}, wantErr: true},
		{name: "no devices", topo: Topology{Node: "n", Devices: 0, NUMANodes: 1, PCIeRootsPerNUMA: 1}, wantErr: true},
		{name: "no node", topo: Topology{Devices: 8, NUMANodes: 2, PCIeRootsPerNUMA: 1}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.topo.Validate()
			if (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			gpus := tc.topo.GPUs()
			seen := map[string]bool{}
			for i, g := range gpus {
				if g.NUMANode != tc.wantNUMA[i] || g.PCIeRoot != tc.wantRoots[i] {
					t.Errorf("gpu %d: numa %d root %s, want %d %s", i, g.NUMANode, g.PCIeRoot, tc.wantNUMA[i], tc.wantRoots[i])
				}
				if seen[g.UUID] {
					t.Errorf("gpu %d: duplicate uuid %s", i, g.UUID)
				}
				seen[g.UUID] = true
			}
			if len(tc.topo.ResourceDevices()) != len(gpus) {
				t.Errorf("ResourceDevices() has %d devices, want %d", len(tc.topo.ResourceDevices()), len(gpus))
			}
		})
	}
}

// The fleet simulator exports this UUID for GPU 3 of real-node-0 (Python: "GPU-" + str(uuid.uuid5(
// uuid.UUID("6a1f0c1e-4f5b-4a43-9d7e-7f3b3c2a9e10"), "real-node-0/3"))): DCGM and the ResourceSlice agree.
func TestUUIDMatchesTheFleetSimulator(t *testing.T) {
	if got, want := fakeUUID("real-node-0", 3), "GPU-c02d1129-53f9-51bb-bed0-572fc6879332"; got != want {
		t.Errorf("fakeUUID = %s, want %s", got, want)
	}
}
