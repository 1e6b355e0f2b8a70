"""A real Kubernetes node for the testbed: kubelet on containerd 2 + runc + CNI, inside a
network namespace of its own (see docs/testbed.md, "The real node")."""
