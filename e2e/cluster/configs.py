"""The cluster's configuration files: pure functions from paths and ports to text."""

from __future__ import annotations

import json
import pathlib

import yaml

from .layout import (
    BRIDGE,
    CLUSTER_DOMAIN,
    CNI_BIN,
    CONTAINERD_SOCKET,
    COREDNS_IMAGE,
    DNS_SERVICE_IP,
    EVICTION_DISK_FREE,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    PROVISIONER_NAME,
    RUN_DIR,
    STORAGE_CLASS,
)


def audit_policy() -> str:
    """Metadata-level audit events of service accounts' requests (who was refused what)."""
    return yaml.safe_dump(
        {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                {"level": "None"},
            ],
        }
    )


def cni_conflist(ipam_dir: pathlib.Path) -> str:
    """The bridge plugin: pods on the bridge, the node IP as their gateway; no masquerade
    (nothing leaves the machine) and no portmap (no hostPorts, so no CNI-* chains)."""
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "eventfleet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir),
                        "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        },
        indent=2,
    )


def containerd_toml(root: pathlib.Path, cni_conf_dir: pathlib.Path) -> str:
    """Debian's containerd 1.6 (config version 2) with its own root, state and socket."""
    return f"""version = 2
root = "{root}"
state = "{RUN_DIR / "containerd"}"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE in these VMs: runc cannot lower oom_score_adj (the kubelet asks
  # -998 for sandboxes) and every sandbox would fail to start.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = "{RUN_DIR / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1
"""


def kubelet_config(workdir: pathlib.Path, ports: dict[str, int]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports["kubelet-healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(workdir / "pki" / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "failSwapOn": False,
            "failCgroupV1": False,  # the CI machines have the hybrid (v1) hierarchy
            # The kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops;
            # with true it refuses to start instead. `down` restores them.
            "protectKernelDefaults": False,
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [DNS_SERVICE_IP],
            "podCIDR": POD_CIDR,
            "podLogsDir": str(workdir / "pod-logs"),
            "maxPods": 60,
            "serializeImagePulls": False,
            # Images are imported, never pulled: never garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Absolute, not percentages: 1% of a large shared disk is gigabytes, and under
            # that pressure the kubelet deletes every unused image — the pause image too,
            # which no registry can give back (a CI run lost all its later pods that way).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": EVICTION_DISK_FREE,
                "imagefs.available": EVICTION_DISK_FREE,
                "nodefs.inodesFree": "1%",
            },
            "evictionPressureTransitionPeriod": "10s",
            "nodeStatusReportFrequency": "10s",
            # How soon a changed Secret or ConfigMap reaches the pods' volumes (token
            # rotation, certificate renewal, peer lists): the tests wait for it each time.
            # The kubelet refreshes a pod's Secret volumes when it syncs the pod, every
            # syncFrequency (plus up to half of it in jitter): 2 s, not 5, saves ~2 s per
            # change (test_a_peer_token_rotation_... waits for eight); the kubelet used
            # 3.7 s of CPU in that 150 s run.
            "syncFrequency": "2s",
            "fileCheckFrequency": "10s",
        }
    )


def kube_proxy_config(kubeconfig: pathlib.Path, ports: dict[str, int]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": NODE_NAME,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{ports['proxy-metrics']}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            # Zeros: leave the host's conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"syncPeriod": "10s", "minSyncPeriod": "1s"},
        }
    )


def scheduler_config(kubeconfig: pathlib.Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
        }
    )


COREFILE = f"""{CLUSTER_DOMAIN}:1053 in-addr.arpa:1053 {{
    errors
    health 127.0.0.1:8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        pods insecure
    }}
    cache 5
    loadbalance
}}
.:1053 {{
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def addons() -> list[dict]:
    """CoreDNS (non-root, port 1053 behind the kube-dns Service) and the default
    StorageClass of the hostPath provisioner, which grows claims (its resizer: a
    hostPath volume's size is only the PV's and the claim's bookkeeping)."""
    labels = {"k8s-app": "kube-dns"}
    ns = "kube-system"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": ns},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "eventfleet:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "eventfleet:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "eventfleet:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": ns},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65535,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": COREDNS_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"containerPort": 1053, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 1053, "protocol": "TCP", "name": "dns-tcp"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "securityContext": {
                                    "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [
                                    {"name": "conf", "mountPath": "/etc/coredns", "readOnly": True}
                                ],
                            }
                        ],
                        "volumes": [{"name": "conf", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": ns, "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER_NAME,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": True,
        },
    ]
