"""Certificates and identities of the cluster: a CA, the API server's serving
certificate, the API server's client certificate towards the kubelet, the service-account
signing key, and one static bearer token (with a kubeconfig) per component.
"""

from __future__ import annotations

import base64
import pathlib
import secrets
import subprocess

import yaml

from .layout import API_SERVICE_IP, NODE_IP, NODE_NAME

# name -> (user, groups). The kubelet is a node (Node authorizer, NodeRestriction);
# the provisioner and kube-router are test infrastructure and get cluster-admin.
IDENTITIES = {
    "admin": ("eventfleet-admin", ("system:masters",)),
    "kubelet": (f"system:node:{NODE_NAME}", ("system:nodes",)),
    "scheduler": ("system:kube-scheduler", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
    "proxy": ("system:kube-proxy", ()),
    "provisioner": ("eventfleet-provisioner", ("system:masters",)),
    "kube-router": ("eventfleet-kube-router", ("system:masters",)),
}


def _openssl(cwd: pathlib.Path, *args: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {proc.stderr.strip()}")


def _signed(d: pathlib.Path, name: str, subject: str, extensions: str) -> None:
    _openssl(d, "genrsa", "-out", f"{name}.key", "2048")
    _openssl(d, "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
    (d / f"{name}.ext").write_text(extensions)
    _openssl(
        d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "7", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
    )  # fmt: skip


def make(d: pathlib.Path) -> None:
    """ca.{crt,key}, apiserver.{crt,key}, apiserver-kubelet-client.{crt,key}, sa.{key,pub}."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(d, "genrsa", "-out", "ca.key", "2048")
    _openssl(
        d, "req", "-x509", "-new", "-key", "ca.key", "-days", "7",
        "-subj", "/CN=eventfleet-cluster-ca", "-out", "ca.crt",
    )  # fmt: skip
    names = ",".join(
        [f"IP:{ip}" for ip in ("127.0.0.1", NODE_IP, API_SERVICE_IP)]
        + [f"DNS:{n}" for n in ("localhost", "kubernetes", "kubernetes.default")]
        + ["DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
    )
    _signed(
        d, "apiserver", "/CN=kube-apiserver",
        f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n",
    )  # fmt: skip
    # exec, logs and port-forward: the API server calls the kubelet as a cluster admin.
    _signed(
        d, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
        "extendedKeyUsage=clientAuth\n",
    )  # fmt: skip
    _openssl(d, "genrsa", "-out", "sa.key", "2048")
    _openssl(d, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def kubeconfig(server: str, ca: pathlib.Path, token: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "eventfleet",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "eventfleet", "user": {"token": token}}],
            "contexts": [
                {"name": "eventfleet", "context": {"cluster": "eventfleet", "user": "eventfleet"}}
            ],
            "current-context": "eventfleet",
        }
    )


def identities(workdir: pathlib.Path, server: str) -> pathlib.Path:
    """The API server's token file, and ``<name>.kubeconfig`` for each identity."""
    lines = []
    for name, (user, groups) in IDENTITIES.items():
        token = secrets.token_hex(16)
        group_field = f',"{",".join(groups)}"' if groups else ""
        lines.append(f"{token},{user},{user}{group_field}")
        (workdir / f"{name}.kubeconfig").write_text(
            kubeconfig(server, workdir / "pki" / "ca.crt", token)
        )
    tokens = workdir / "tokens.csv"
    tokens.touch(mode=0o600)
    tokens.write_text("\n".join(lines) + "\n")
    return tokens
