"""The bare Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager built
from Go modules) that the chart tests start one per test (``controlplane.py``), and the
upstream CRDs the tests validate against (``external-crds/``). Pods run only on the
real single-node cluster (:mod:`e2e.cluster`).
"""
