"""The single-node test cluster (e2e/cluster) uses only 198.18.0.0/15 and loopback.

Traffic to the private ranges (10/8, 172.16/12, 192.168/16) is flagged on the CI machines
even when it stays on the machine, so no address the cluster configures may be in them:
every IPv4 address and range in its rendered configuration is checked here.
"""

from __future__ import annotations

import ipaddress
import json
import pathlib
import re

import yaml

from e2e.cluster import configs, layout

BENCHMARK = ipaddress.ip_network("198.18.0.0/15")
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
ANY = ipaddress.ip_network("0.0.0.0/0")
IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?\b")


def rendered(tmp_path: pathlib.Path) -> str:
    ports = dict.fromkeys(("kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics"), 10250)
    return "\n".join(
        [
            configs.cni_conflist(tmp_path / "ipam"),
            configs.containerd_toml(tmp_path / "containerd", tmp_path / "cni"),
            configs.kubelet_config(tmp_path, ports),
            configs.kube_proxy_config(tmp_path / "proxy.kubeconfig", ports),
            configs.audit_policy(),
            yaml.safe_dump_all(configs.addons()),
            json.dumps({k: v for k, v in vars(layout).items() if isinstance(v, str)}),
        ]
    )


def test_every_address_is_in_the_benchmark_range_or_loopback(tmp_path):
    found = {ipaddress.ip_network(m, strict=False) for m in IPV4.findall(rendered(tmp_path))}
    assert ipaddress.ip_network(layout.POD_CIDR) in found
    assert ipaddress.ip_network(layout.SERVICE_CIDR) in found
    outside = [
        str(n) for n in found if n != ANY and not (n.subnet_of(BENCHMARK) or n.subnet_of(LOOPBACK))
    ]
    assert outside == []


def test_the_service_range_holds_the_cluster_services():
    services = ipaddress.ip_network(layout.SERVICE_CIDR)
    for ip in (layout.API_SERVICE_IP, layout.DNS_SERVICE_IP):
        assert ipaddress.ip_address(ip) in services
    # The kubernetes Service takes the range's first address (the API server's SAN).
    assert ipaddress.ip_address(layout.API_SERVICE_IP) == services.network_address + 1
    assert ipaddress.ip_address(layout.NODE_IP) in ipaddress.ip_network(layout.POD_CIDR)
