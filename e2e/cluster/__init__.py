"""A genuine single-node Kubernetes cluster for the e2e tests and for developers.

Real kube-apiserver, etcd and kube-controller-manager (scripts/tools/k8s-control-plane.sh),
kubelet, kube-scheduler, kube-proxy (iptables), CoreDNS, a hostPath volume provisioner
and kube-router as the NetworkPolicy firewall (scripts/tools/k8s-node.sh), with Debian's
containerd, runc and CNI bridge plugin. Pods and Services get addresses in 198.18.0.0/15
(reserved for benchmark testing) on a local bridge; nothing leaves the machine.

``python -m e2e.cluster up|down|status`` (``scripts/cluster``) for developers; the
``real_cluster`` fixture of :mod:`e2e.cluster.fixtures` for tests. Every process is
recorded by pid and stopped by it, and every change to the host (bridge, route,
iptables chains, ipsets, mounts, network namespaces, cgroups, sysctls) is undone by
``down``. See docs/operator.md, "A real single-node cluster".
"""
