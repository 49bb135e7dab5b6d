// Command gpu-dra-driver is the test bed's DRA kubelet plugin: it registers with a real kubelet as a DRA
// driver, publishes a ResourceSlice of GPU-like devices (uuid, index, resource.kubernetes.io/pcieRoot,
// resource.kubernetes.io/numaNode) for its node, and answers NodePrepareResources /
// NodeUnprepareResources without CDI devices. No real GPU DRA driver is available to the test bed; this is
// the smallest driver that exercises the real scheduler's DRA allocation and the kubelet's DRA manager.
//
// It runs as a plain process beside the kubelet (harness/testbed/dra.py) with the node's own credentials.
// The version of k8s.io/dynamic-resource-allocation in go.mod follows the test bed's Kubernetes version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// sourceHash is set by build.sh (-X main.sourceHash=...): a hash of this module's .go files, which makes
// build.sh's stamp change with the sources.
var sourceHash = "unknown"

// version is the driver's source hash and the k8s.io/dynamic-resource-allocation version it was built with.
func version() string {
	dra := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/dynamic-resource-allocation" {
				dra = dep.Version
			}
		}
	}
	return fmt.Sprintf("gpu-dra-driver source %s, k8s.io/dynamic-resource-allocation %s", sourceHash, dra)
}

// rejectHealthStreams answers the DRAResourceHealth service (advertised by default from v0.37) with
// Unimplemented: this driver reports no device health (see driver.DRAPlugin).
func rejectHealthStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.Contains(info.FullMethod, "DRAResourceHealth") {
		return status.Error(codes.Unimplemented, "gpu-dra-driver reports no device health")
	}
	return handler(srv, ss)
}

func main() {
	klog.InitFlags(nil)
	var (
		driverName = flag.String("driver-name", "gpu.gpuwarden.test", "DRA driver name (the DeviceClass selects on it)")
		nodeName   = flag.String("node-name", "", "name of the Node this plugin runs on (required)")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig (the node's credentials); empty = in-cluster")
		devices    = flag.Int("devices", 8, "number of GPUs to publish")
		numaNodes  = flag.Int("numa-nodes", 2, "NUMA nodes the GPUs are spread over (evenly)")
		rootsPer   = flag.Int("pcie-roots-per-numa", 2, "PCIe root complexes per NUMA node (evenly)")
		memoryGiB  = flag.Int64("memory-gib", 80, "memory capacity published per GPU")
		registrar  = flag.String("registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugins_registry directory (<kubelet root-dir>/plugins_registry)")
		pluginDir  = flag.String("plugin-dir", "", "directory for dra.sock and the state file (default <kubelet plugins dir>/<driver-name>)")
		stateFile  = flag.String("state-file", "", "prepared-claims checkpoint (default <plugin-dir>/prepared.json)")
		showVer    = flag.Bool("version", false, "print the version and exit")
	)
	flag.Parse()
	if *showVer {
		fmt.Println(version())
		return
	}
	klog.InfoS("starting", "version", version())
	if err := run(*driverName, *nodeName, *kubeconfig, Topology{
		Node: *nodeName, Devices: *devices, NUMANodes: *numaNodes, PCIeRootsPerNUMA: *rootsPer, MemoryGiB: *memoryGiB,
	}, *registrar, *pluginDir, *stateFile); err != nil {
		klog.ErrorS(err, "gpu-dra-driver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(driverName, nodeName, kubeconfig string, topo Topology, registrarDir, pluginDir, stateFile string) error {
	if nodeName == "" {
		return errors.New("--node-name is required")
	}
	if err := topo.Validate(); err != nil {
		return err
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driverName)
	}
	if stateFile == "" {
		stateFile = filepath.Join(pluginDir, "prepared.json")
	}
	for _, dir := range []string{registrarDir, pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		cancel(fmt.Errorf("signal %v", sig))
	}()
	logger := klog.Background().WithName("gpu-dra-driver")
	ctx = klog.NewContext(ctx, logger)

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The Node's UID makes it the owner of the ResourceSlice, so the slice goes when the Node goes.
	var nodeUID types.UID
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			logger.Info("waiting for the Node", "node", nodeName, "err", err)
			return false, nil
		}
		nodeUID = node.UID
		return true, nil
	}); err != nil {
		return fmt.Errorf("get Node %s: %w", nodeName, err)
	}

	drv, err := newDriver(driverName, stateFile, cancel)
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, drv,
		kubeletplugin.KubeClient(client),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.NodeUID(nodeUID),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.GRPCStreamInterceptor(rejectHealthStreams),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	devs := topo.ResourceDevices()
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	}); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	logger.Info("serving", "driver", driverName, "node", nodeName, "devices", len(devs),
		"numaNodes", topo.NUMANodes, "pcieRootsPerNUMA", topo.PCIeRootsPerNUMA,
		"registrarDir", registrarDir, "pluginDir", pluginDir, "stateFile", stateFile)

	// One line when the kubelet has confirmed the registration (harness/testbed/dra.py waits for it).
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
			st := helper.RegistrationStatus()
			if st == nil {
				return false, nil
			}
			if st.PluginRegistered {
				logger.Info("registered with the kubelet")
			} else {
				logger.Info("kubelet rejected the registration", "error", st.Error)
			}
			return true, nil
		})
	}()

	<-ctx.Done()
	cause := context.Cause(ctx)
	logger.Info("stopping", "cause", cause)
	if cause != nil && !strings.HasPrefix(cause.Error(), "signal ") {
		return cause
	}
	return nil
}
