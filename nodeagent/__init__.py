"""gpuwarden node agent: one process per GPU node (``gpuwarden node-agent``, a DaemonSet).

Why it exists: the extender's GPU choice ends at the API server. The agent carries it onto the node: it
publishes the GPU topology it reads from the hardware (NVML, sysfs, or a file for simulated nodes), reads the
kubelet's PodResources API to learn which GPUs each container actually holds and writes that on the pod where
the extender reads it (observe and reconcile, always on), and optionally serves the kubelet device-plugin API
itself so the recorded set is the set handed out (enforce). It touches only its own Node and the pods bound
to it, and shares only the kernel (config, kube access, self-metrics) with the adapter and the controller.
"""
