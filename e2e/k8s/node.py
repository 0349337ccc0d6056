"""A node agent for the real control plane: it plays the kubelet for one namespace.

The control plane (``e2e.k8s.controlplane``) runs the real StatefulSet controller, which
creates the Pod and PersistentVolumeClaim objects; nothing would ever run them, because
no kubelet can run here. This agent does the kubelet's part, honestly and no more:

* registers a Node and binds the namespace's unscheduled pods to it (there is no
  scheduler either; binding through the ``binding`` subresource, like the scheduler);
* runs each bound pod's container with the pod's own command, env (values and
  ``fieldRef`` metadata.name/namespace), ConfigMap and Secret volumes, an emptyDir and a
  per-claim host directory for each PersistentVolumeClaim (kept across pod restarts and
  re-creation, like a bound volume), either

  - as a **podman container from the image the pod names** (``runtime="podman"``; the
    images built by scripts/tools/images.sh): runAsUser/runAsGroup, readOnlyRootFilesystem,
    volumes mounted at the pod's mount paths, or
  - as a **host process** (``runtime="process"``, only when asked for explicitly:
    ``eventfleet`` becomes ``python -m eventfleet_cli`` and mount paths are rewritten to
    host directories);

* keeps every port on 127.0.0.1 with the host network: each pod gets its own host port
  per container port (stable per pod name, like a pod's DNS name), and the replica
  configuration from the ConfigMap is localised accordingly (its ports, and each peer
  ``<pod>.<service>.<ns>.svc:<port>`` becomes ``127.0.0.1:<that pod's port>``). This is
  the simulated part: no pod network, no DNS, no Services;
* refreshes ConfigMap and Secret files when they change (and sends SIGHUP so the
  replica reloads at once rather than at its next poll);
* reports pod status (phase, podIP 127.0.0.1, Ready from the pod's readinessProbe,
  restartCount) so the real StatefulSet controller, the disruption controller and the
  operator see what really runs;
* on graceful deletion stops the container with SIGTERM within the pod's grace period,
  then removes the pod (gracePeriodSeconds=0, uid precondition), like the kubelet;
* restarts containers that exit (restartPolicy Always);
* plays a CSI driver for StorageClasses with the provisioner ``PROVISIONER`` only: a
  PersistentVolume per pending claim (the real PV controller binds it; the data stays
  the per-claim host directory), and volume expansion of a bound claim whose request
  grew (the PV's capacity, ``FileSystemResizePending``, then the claim's capacity), so
  the API server's own resize admission and the operator's growth path run for real.

A test can ``pause`` a pod (SIGKILL and keep it down: a lost node) and ``resume`` it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

import yaml

from e2e.ports import free_port

from .controlplane import ControlPlane
from .harness import ROOT, stop_process, wait_for

PODMAN = ROOT / ".tools" / "bin" / "efpodman"
# StorageClasses with this provisioner get volumes from the node agent (``_storage``).
PROVISIONER = "e2e.eventfleet.io/node-agent"
_URLS_LOCK = threading.Lock()


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunningPod:
    """One pod's container as we run it."""

    def __init__(self, pod: dict[str, Any], directory: pathlib.Path) -> None:
        self.name: str = pod["metadata"]["name"]
        self.uid: str = pod["metadata"]["uid"]
        self.directory = directory
        self.proc: subprocess.Popen | None = None
        self.container_name = ""
        self.restarts = 0
        self.started_at = ""
        self.stopping = False
        self.files: dict[str, str] = {}  # written volume files: path -> content
        self.reported: Any = None
        self.next_start = 0.0  # monotonic time before which a crashed container stays down

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class NodeAgent(threading.Thread):
    """Runs the pods of one namespace; ``start()``, then ``stop()``."""

    def __init__(
        self,
        cluster: ControlPlane,
        namespace: str,
        workdir: pathlib.Path,
        urls_file: pathlib.Path,
        *,
        runtime: str = "podman",
    ) -> None:
        super().__init__(name=f"node-{namespace}", daemon=True)
        if runtime not in ("process", "podman"):
            raise ValueError(f"runtime must be 'process' or 'podman', not {runtime!r}")
        # Never fall back to host processes on its own: pods then run without the image,
        # its user or its read-only root, and a test would pass for the wrong reason.
        if runtime == "podman" and (reason := podman_available()):
            raise RuntimeError(f"the node agent cannot run pods with podman: {reason}")
        self.cluster, self.namespace, self.runtime = cluster, namespace, runtime
        self.node = f"node-{namespace}"
        self.workdir = workdir / f"node-{namespace}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.urls_file = urls_file
        self.ports: dict[str, dict[int, int]] = {}  # pod name -> container port -> host port
        self.pods: dict[str, RunningPod] = {}  # by pod name
        self.paused: set[str] = set()
        self.errors: list[str] = []
        self.pids_seen: dict[str, list[int]] = {}
        self._halt = threading.Event()
        self._storage_checked = 0.0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        self._register_node()
        super().start()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        with self._lock:
            stoppers = [self._stop_async(p, grace=20) for p in list(self.pods.values())]
        for t in stoppers:
            t.join(timeout=40)
        # Nothing runs them any more: remove our pods as a kubelet would once they have
        # stopped, so the namespace's deletion is not left waiting for a node that left.
        with contextlib.suppress(RuntimeError):
            listing = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/pods")
            for pod in (listing or {}).get("items", []):
                if pod["spec"].get("nodeName") == self.node:
                    self._delete_pod(pod)
        with contextlib.suppress(RuntimeError):
            self.cluster.request("DELETE", f"/api/v1/nodes/{self.node}")

    def fleet(self, name: str) -> Fleet:
        return Fleet(self, name)

    def pause(self, pod: str) -> None:
        """Kill pod ``pod``'s container and keep it down (a lost node: no goodbye)."""
        with self._lock:
            self.paused.add(pod)
            running = self.pods.get(pod)
            if running is not None:
                self._kill(running)

    def resume(self, pod: str) -> None:
        with self._lock:
            self.paused.discard(pod)

    def pid(self, pod: str) -> int | None:
        """The pid of the container's process (podman: its `podman run`), or None."""
        with self._lock:
            running = self.pods.get(pod)
            if running is None or running.stopping or not running.alive():
                return None
            return running.proc.pid

    def http(self, pod: str) -> str:
        return f"http://127.0.0.1:{self._host_port(pod, 'http')}"

    def eventer(self, pod: str) -> str:
        return f"127.0.0.1:{self._host_port(pod, 'eventer')}"

    def pod_dir(self, pod: str) -> pathlib.Path:
        return self.workdir / "pods" / pod

    def log(self, pod: str) -> str:
        path = self.pod_dir(pod) / "container.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with self._lock:
                    self.sync()
            except Exception as e:  # keep playing the kubelet, report in teardown
                self.errors.append(f"{type(e).__name__}: {e}")
                del self.errors[:-20]
            self._halt.wait(0.3)

    def _register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"},
            },
        }
        if self.cluster.get(f"/api/v1/nodes/{self.node}") is None:
            self.cluster.request("POST", "/api/v1/nodes", node)
        capacity = {"cpu": "2", "memory": "8Gi", "pods": "110"}
        self.cluster.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}/status",
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": self.node},
                    ],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "e2e node agent (not a kubelet)",
                            "lastHeartbeatTime": now(),
                            "lastTransitionTime": now(),
                        }
                    ],
                }
            },
            "application/merge-patch+json",
        )

    def sync(self) -> None:
        if time.monotonic() - self._storage_checked >= 1.0:  # once a second is plenty
            self._storage_checked = time.monotonic()
            self._storage()
        listing = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/pods")
        seen: set[str] = set()
        for pod in listing["items"]:
            meta, spec = pod["metadata"], pod["spec"]
            name = meta["name"]
            seen.add(name)
            if not spec.get("nodeName"):
                self._bind(name)
                continue
            if spec["nodeName"] != self.node:
                continue
            running = self.pods.get(name)
            if running is not None and running.uid != meta["uid"]:
                # The old incarnation is gone from the API server: stop it now.
                self._stop_async(running, grace=5).join(timeout=30)
                running = None
            if meta.get("deletionTimestamp"):
                if running is not None and not running.stopping:
                    grace = meta.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = spec.get("terminationGracePeriodSeconds", 30)
                    self._stop_async(running, grace=float(grace), delete=pod)
                elif running is None:
                    self._delete_pod(pod)
                continue
            if running is None:
                running = self.pods[name] = RunningPod(pod, self.pod_dir(name))
            if running.stopping:
                continue
            changed = self._write_volumes(pod, running)
            if running.alive():
                if changed:
                    self._signal(running, signal.SIGHUP)  # the mount changed; reload now
            elif name not in self.paused and time.monotonic() >= running.next_start:
                if running.proc is not None:
                    running.restarts += 1
                    # Back off like the kubelet's CrashLoopBackOff (capped lower here).
                    running.next_start = time.monotonic() + min(10.0, 0.5 * 2**running.restarts)
                self._start(pod, running)
            self._report(pod, running)
        for name in list(self.pods):
            if name not in seen and not self.pods[name].stopping:
                self._stop_async(self.pods[name], grace=5)
        self._write_urls()

    # ------------------------------------------------------------------ API calls

    def _path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    # ------------------------------------------------------------------ storage

    def _storage(self) -> None:
        """The storage side a cluster's CSI driver plays, for claims of a StorageClass
        whose provisioner is ``PROVISIONER``: provision a PersistentVolume for a pending
        claim (the real PV controller binds them), and expand a bound claim whose
        request grew (the external-resizer's part, then the kubelet's: the PV's capacity,
        ``FileSystemResizePending``, then the claim's capacity). Claims of other classes
        stay pending, as they would without a provisioner."""
        classes = self.cluster.get("/apis/storage.k8s.io/v1/storageclasses") or {"items": []}
        ours = {
            c["metadata"]["name"] for c in classes["items"] if c.get("provisioner") == PROVISIONER
        }
        if not ours:
            return
        claims = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims")
        for claim in claims["items"]:
            if claim["spec"].get("storageClassName") not in ours:
                continue
            name = claim["metadata"]["name"]
            want = claim["spec"]["resources"]["requests"]["storage"]
            status = claim.get("status") or {}
            if not claim["spec"].get("volumeName"):
                self._provision(claim, want)
            elif (
                status.get("phase") == "Bound" and status.get("capacity", {}).get("storage") != want
            ):
                self._expand(claim, name, want)

    def _provision(self, claim: dict[str, Any], size: str) -> None:
        meta = claim["metadata"]
        volume = f"pv-{self.namespace}-{meta['name']}"
        if self.cluster.get(f"/api/v1/persistentvolumes/{volume}") is not None:
            return
        # The pod's first mount creates the directory, owned by its fsGroup.
        directory = self.workdir / "claims" / meta["name"]
        self.cluster.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": claim["spec"]["accessModes"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": claim["spec"]["storageClassName"],
                    "hostPath": {"path": str(directory)},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": self.namespace,
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            },
        )

    def _expand(self, claim: dict[str, Any], name: str, size: str) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{name}/status"
        merge = "application/merge-patch+json"
        conditions = (claim.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "FileSystemResizePending" for c in conditions):
            # The resizer: the volume grew; the file system waits for the node.
            self.cluster.request(
                "PATCH",
                f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}",
                {"spec": {"capacity": {"storage": size}}},
                merge,
            )
            pending = {
                "type": "FileSystemResizePending",
                "status": "True",
                "lastTransitionTime": now(),
                "message": "Waiting for user to (re-)start a pod to finish file system resize",
            }
            self.cluster.request("PATCH", path, {"status": {"conditions": [pending]}}, merge)
            return
        # The node: an online resize of the mounted file system, then the new capacity.
        self.cluster.request(
            "PATCH", path, {"status": {"capacity": {"storage": size}, "conditions": None}}, merge
        )

    def _bind(self, name: str) -> None:
        with contextlib.suppress(RuntimeError):  # a conflict: someone bound it already
            self.cluster.request(
                "POST",
                self._path(name) + "/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                },
            )

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # already gone, or a new uid
            self.cluster.request(
                "DELETE",
                self._path(pod["metadata"]["name"]),
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": pod["metadata"]["uid"]},
                },
            )

    def _report(self, pod: dict[str, Any], running: RunningPod) -> None:
        alive = running.alive()
        ready = alive and self._probe(pod, running)
        flag = "True" if ready else "False"
        (container,) = pod["spec"]["containers"]
        waiting = "CrashLoopBackOff" if running.proc else "ContainerCreating"
        state = (
            {"running": {"startedAt": running.started_at}}
            if alive
            else {"waiting": {"reason": waiting}}
        )
        status = {
            "phase": "Running" if alive else "Pending",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": running.started_at or now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": flag},
                {"type": "Ready", "status": flag},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": ready,
                    "started": alive,
                    "restartCount": running.restarts,
                    "state": state,
                }
            ],
        }
        key = json.dumps(status, sort_keys=True)
        if key == running.reported and pod.get("status", {}).get("phase") == status["phase"]:
            return
        stamp = now()
        for c in status["conditions"]:
            c["lastTransitionTime"] = stamp
        self.cluster.request(
            "PATCH",
            self._path(running.name) + "/status",
            {"status": status},
            "application/merge-patch+json",
        )
        running.reported = key

    # ------------------------------------------------------------------ ports, volumes

    def _alloc(self, pod: str, container_ports: list[int]) -> dict[int, int]:
        ports = self.ports.setdefault(pod, {})
        for port in container_ports:
            if port not in ports:  # (setdefault would take a fresh port on every call)
                ports[port] = free_port()
        return ports

    def _host_port(self, pod: str, port_name: str) -> int:
        running = self.pods.get(pod)
        names = getattr(running, "port_names", {}) if running else {}
        if port_name not in names:
            raise KeyError(f"pod {pod} has no container port named {port_name!r} (yet)")
        return self.ports[pod][names[port_name]]

    def _write_file(self, running: RunningPod, path: pathlib.Path, text: str, mode: int) -> bool:
        if running.files.get(str(path)) == text and path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(path)  # atomic, like the kubelet's symlink swap
        running.files[str(path)] = text
        return True

    def _write_volumes(self, pod: dict[str, Any], running: RunningPod) -> bool:
        """Write the pod's ConfigMap and Secret volumes; True if a file changed."""
        (container,) = pod["spec"]["containers"]
        running.port_names = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        self._alloc(running.name, list(running.port_names.values()))
        changed = False
        security = pod["spec"].get("securityContext") or {}
        for volume in pod["spec"].get("volumes", []):
            vdir = running.directory / "volumes" / volume["name"]
            if "configMap" in volume or "secret" in volume:
                source = volume.get("configMap") or volume["secret"]
                if "configMap" in volume:
                    obj = self.cluster.get(
                        f"/api/v1/namespaces/{self.namespace}/configmaps/{source['name']}"
                    )
                    data = (obj or {}).get("data") or {}
                else:
                    obj = self.cluster.get(
                        f"/api/v1/namespaces/{self.namespace}/secrets/{source['secretName']}"
                    )
                    raw = (obj or {}).get("data") or {}
                    data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
                if obj is None:
                    raise RuntimeError(f"pod {running.name}: volume {volume['name']} not found yet")
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                mode = source.get("defaultMode", 0o644)
                for item in items:
                    text = data[item["key"]]
                    if item["key"] == "config.yaml" and "configMap" in volume:
                        text = self._localise(running.name, pod, text)
                    changed |= self._write_file(running, vdir / item["path"], text, mode)
                    if "secret" in volume and "fsGroup" in security:
                        os.chown(vdir / item["path"], 0, security["fsGroup"])
            elif "projected" in volume:
                changed |= self._write_projected(pod, running, volume, vdir)
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                cdir = self.workdir / "claims" / claim
                if not cdir.exists():
                    cdir.mkdir(parents=True)
                    # fsGroup: the volume belongs to the pod's group, as on a real node.
                    os.chown(cdir, security.get("runAsUser", 0), security.get("fsGroup", 0))
                    cdir.chmod(0o2770)
                vdir.parent.mkdir(parents=True, exist_ok=True)
                if not vdir.exists():
                    vdir.symlink_to(cdir)
            elif "emptyDir" in volume:
                vdir.mkdir(parents=True, exist_ok=True)
                vdir.chmod(0o1777)
        return changed

    def _write_projected(
        self, pod: dict[str, Any], running: RunningPod, volume: dict[str, Any], vdir: pathlib.Path
    ) -> bool:
        """The service-account volume admission adds: token, CA bundle, namespace."""
        changed = False
        mode = volume["projected"].get("defaultMode", 0o644)
        for source in volume["projected"]["sources"]:
            if "serviceAccountToken" in source:
                path = vdir / source["serviceAccountToken"]["path"]
                if str(path) in running.files:
                    continue  # one token per pod incarnation (valid for an hour)
                account = pod["spec"].get("serviceAccountName", "default")
                answer = self.cluster.request(
                    "POST",
                    f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
                    {
                        "apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenRequest",
                        "spec": {
                            "expirationSeconds": source["serviceAccountToken"].get(
                                "expirationSeconds", 3607
                            ),
                            # Bound to the pod, as the kubelet's: void once it is deleted.
                            "boundObjectRef": {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": running.name,
                                "uid": running.uid,
                            },
                        },
                    },
                )
                changed |= self._write_file(running, path, answer["status"]["token"], mode)
            elif "configMap" in source:
                name = source["configMap"]["name"]
                cm = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
                if cm is None:
                    raise RuntimeError(f"pod {running.name}: configMap {name} not found yet")
                for item in source["configMap"].get("items") or [
                    {"key": k, "path": k} for k in cm.get("data", {})
                ]:
                    text = cm["data"][item["key"]]
                    changed |= self._write_file(running, vdir / item["path"], text, mode)
            elif "downwardAPI" in source:
                fields = {"metadata.namespace": self.namespace, "metadata.name": running.name}
                for item in source["downwardAPI"]["items"]:
                    text = fields[item["fieldRef"]["fieldPath"]]
                    changed |= self._write_file(running, vdir / item["path"], text, mode)
        return changed

    def _loopback(self, pod_name: str, value: str) -> str:
        """``0.0.0.0:<container port>`` -> ``127.0.0.1:<the pod's host port>``: a pod's
        all-interfaces listener would be every interface of the test machine here."""
        for container_port, host_port in self.ports.get(pod_name, {}).items():
            value = value.replace(f"0.0.0.0:{container_port}", f"127.0.0.1:{host_port}")
        return value

    def _localise(self, pod_name: str, pod: dict[str, Any], text: str) -> str:
        """The replica configuration with every port and peer on 127.0.0.1."""
        config = yaml.safe_load(text) or {}
        mine = self.ports[pod_name]
        config["host"] = "127.0.0.1"
        for section in ("eventer", "syncer", "http"):
            if isinstance(config.get(section), dict) and "port" in config[section]:
                config[section]["port"] = mine.get(config[section]["port"], config[section]["port"])
        # No ZeroMQ Event BUS here: it needs a triplet of fixed ports per replica.
        config["bus"] = {**(config.get("bus") or {}), "enabled": False}
        peers = []
        for peer in config.get("peers") or []:
            peer_pod = str(peer["host"]).split(".", 1)[0]
            ports = self._alloc(peer_pod, list(mine))  # stable per pod name, like DNS
            # With TLS the peer's certificate names its DNS name, not 127.0.0.1.
            peers.append(
                {
                    **peer,
                    "host": "127.0.0.1",
                    "port": ports[peer["port"]],
                    "tls_server_name": peer.get("tls_server_name") or peer["host"],
                }
            )
        config["peers"] = peers
        if self.runtime == "process":
            config = self._host_paths(pod, pod_name, config)
        return yaml.safe_dump(config, sort_keys=False)

    def _mounts(self, pod: dict[str, Any], pod_name: str) -> list[tuple[str, pathlib.Path, bool]]:
        (container,) = pod["spec"]["containers"]
        vdir = self.pod_dir(pod_name) / "volumes"
        return [
            (m["mountPath"], vdir / m["name"], bool(m.get("readOnly")))
            for m in container.get("volumeMounts", [])
        ]

    def _host_paths(self, pod: dict[str, Any], pod_name: str, value: Any) -> Any:
        """Container paths under a mount, rewritten to the host directory (process runtime)."""
        if isinstance(value, dict):
            return {k: self._host_paths(pod, pod_name, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._host_paths(pod, pod_name, v) for v in value]
        if isinstance(value, str) and value.startswith("/"):
            for mount, host, _ in self._mounts(pod, pod_name):
                if value == mount or value.startswith(mount.rstrip("/") + "/"):
                    return str(host) + value[len(mount.rstrip("/")) :]
        return value

    # ------------------------------------------------------------------ containers

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        (container,) = pod["spec"]["containers"]
        env: dict[str, str] = {}
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": self.namespace}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "fieldRef" in item.get("valueFrom", {}):
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                if path not in fields:
                    name = pod["metadata"]["name"]
                    raise RuntimeError(f"pod {name}: fieldRef {path} is not supported here")
                env[item["name"]] = fields[path]
        # What the kubelet gives every pod: where the API server is (in-cluster config).
        api = urllib.parse.urlsplit(self.cluster.url)
        env.setdefault("KUBERNETES_SERVICE_HOST", api.hostname or "127.0.0.1")
        env.setdefault("KUBERNETES_SERVICE_PORT", str(api.port))
        return {k: self._loopback(pod["metadata"]["name"], v) for k, v in env.items()}

    def _start(self, pod: dict[str, Any], running: RunningPod) -> None:
        (container,) = pod["spec"]["containers"]
        command = [*container.get("command", []), *container.get("args", [])]
        command = [self._loopback(running.name, arg) for arg in command]
        running.directory.mkdir(parents=True, exist_ok=True)
        log = open(running.directory / "container.log", "a")  # lives with the process
        log.write(f"--- start {now()} (restarts {running.restarts}) ---\n")
        log.flush()
        if self.runtime == "process":
            if command[:1] == ["eventfleet"]:
                command = [sys.executable, "-m", "eventfleet_cli", *command[1:]]
            command = self._host_paths(pod, running.name, command)
            env = {**os.environ, **self._env(pod), "PYTHONUNBUFFERED": "1"}
            env.pop("EVENTFLEET_TOKEN", None)
            running.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        else:
            running.container_name = f"ef-{self.namespace}-{running.name}-{running.uid[:8]}"
            subprocess.run(
                [str(PODMAN), "rm", "-f", "--ignore", running.container_name],
                capture_output=True,
                timeout=60,
            )
            running.proc = subprocess.Popen(
                self._podman_run(pod, running, command), stdout=log, stderr=subprocess.STDOUT
            )
        running.started_at = now()
        self.pids_seen.setdefault(running.name, []).append(running.proc.pid)

    def _podman_run(
        self, pod: dict[str, Any], running: RunningPod, command: list[str]
    ) -> list[str]:
        (container,) = pod["spec"]["containers"]
        pod_sc = pod["spec"].get("securityContext") or {}
        sc = {**pod_sc, **(container.get("securityContext") or {})}
        args = [str(PODMAN), "run", "--rm", "--name", running.container_name, "--network", "host"]
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        args += ["--pull", "never", "--stop-timeout", str(grace)]
        # Kubernetes ignores an image's HEALTHCHECK (the pod's probes count instead).
        args.append("--no-healthcheck")
        if "runAsUser" in sc:
            args += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
        if "fsGroup" in pod_sc:
            args += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if (sc.get("capabilities") or {}).get("drop") == ["ALL"]:
            args += ["--cap-drop", "ALL"]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount_path, host, read_only in self._mounts(pod, running.name):
            if "emptyDir" in volumes.get(host.name, {}):
                args += ["--tmpfs", f"{mount_path}:rw,mode=1777"]
            else:
                args += ["-v", f"{host.resolve()}:{mount_path}:{'ro' if read_only else 'rw'}"]
        for key, value in self._env(pod).items():
            args += ["-e", f"{key}={value}"]
        if command:
            args += ["--entrypoint", command[0]]
        return [*args, container["image"], *command[1:]]

    def _probe(self, pod: dict[str, Any], running: RunningPod) -> bool:
        (container,) = pod["spec"]["containers"]
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return True
        port = probe["port"]
        port = running.port_names.get(port, port) if isinstance(port, str) else port
        scheme = str(probe.get("scheme", "HTTP")).lower()
        url = f"{scheme}://127.0.0.1:{self.ports[running.name][port]}{probe.get('path', '/')}"
        # Like the kubelet: an HTTPS probe does not verify the certificate.
        insecure = ssl._create_unverified_context() if scheme == "https" else None
        try:
            with urllib.request.urlopen(url, timeout=1, context=insecure) as r:
                return 200 <= r.status < 400
        except OSError:
            return False

    def _signal(self, running: RunningPod, sig: int) -> None:
        if self.runtime == "process":
            with contextlib.suppress(ProcessLookupError):
                os.kill(running.proc.pid, sig)
        else:
            subprocess.run(
                [str(PODMAN), "kill", "--signal", signal.Signals(sig).name, running.container_name],
                capture_output=True,
                timeout=30,
            )

    def _kill(self, running: RunningPod) -> None:
        if running.proc is None:
            return
        if self.runtime == "podman":
            self._signal(running, signal.SIGKILL)
        stop_process(running.proc, grace=30, sig=signal.SIGKILL)

    def _stop_async(
        self, running: RunningPod, *, grace: float, delete: dict[str, Any] | None = None
    ) -> threading.Thread:
        """SIGTERM, SIGKILL after ``grace``; then remove the pod object (like the kubelet)."""
        running.stopping = True

        def stop() -> None:
            try:
                if running.alive():
                    if self.runtime == "podman":
                        subprocess.run(
                            [str(PODMAN), "stop", "-t", str(int(grace)), running.container_name],
                            capture_output=True,
                            timeout=grace + 60,
                        )
                    stop_process(running.proc, grace=grace + 5)
                if delete is not None:
                    self._delete_pod(delete)
            except Exception as e:  # reported in teardown
                self.errors.append(f"stopping {running.name}: {type(e).__name__}: {e}")
            finally:
                with self._lock:
                    if self.pods.get(running.name) is running:
                        del self.pods[running.name]

        thread = threading.Thread(target=stop, name=f"stop-{running.name}", daemon=True)
        thread.start()
        return thread

    def _write_urls(self) -> None:
        with _URLS_LOCK:
            mapping: dict[str, str] = {}
            if self.urls_file.exists():
                with contextlib.suppress(ValueError):
                    mapping = json.loads(self.urls_file.read_text() or "{}")
            for pod, running in self.pods.items():
                if "http" in getattr(running, "port_names", {}):
                    mapping[f"{self.namespace}/{pod}"] = self.http(pod)
            text = json.dumps(mapping, indent=1, sort_keys=True)
            if not self.urls_file.exists() or self.urls_file.read_text() != text:
                tmp = self.urls_file.with_suffix(f".{self.node}.tmp")
                tmp.write_text(text)
                tmp.replace(self.urls_file)


class Fleet:
    """One StatefulSet's pods on a node agent, by ordinal (the tests' view)."""

    def __init__(self, agent: NodeAgent, name: str) -> None:
        self.agent, self.name = agent, name

    def _pod(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}"

    def pid(self, ordinal: int) -> int | None:
        return self.agent.pid(self._pod(ordinal))

    def pause(self, ordinal: int) -> None:
        self.agent.pause(self._pod(ordinal))

    def resume(self, ordinal: int) -> None:
        self.agent.resume(self._pod(ordinal))

    def http(self, ordinal: int) -> str:
        return self.agent.http(self._pod(ordinal))

    def eventer(self, ordinal: int) -> str:
        return self.agent.eventer(self._pod(ordinal))

    def token_file(self, ordinal: int) -> pathlib.Path:
        return self.agent.pod_dir(self._pod(ordinal)) / "volumes" / "token" / "token"

    def store_file(self, ordinal: int) -> pathlib.Path:
        """The replica's SQLite store on its claim (``data-NAME-N``), on the host."""
        return self.agent.workdir / "claims" / f"data-{self._pod(ordinal)}" / "events.sqlite"

    @property
    def restarts(self) -> dict[int, int]:
        """Container restarts by ordinal (only pods that restarted), as the emulator's
        kubelet reports them, so a test reads ``pods.restarts`` on either."""
        prefix = f"{self.name}-"
        out = {}
        for pod, running in list(self.agent.pods.items()):
            ordinal = pod[len(prefix) :]
            if pod.startswith(prefix) and ordinal.isdigit() and running.restarts:
                out[int(ordinal)] = running.restarts
        return out

    def status(self, ordinal: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.http(ordinal) + "/status", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, KeyError):
            return None

    def wait_running(self, count: int, timeout: float = 90) -> None:
        wait_for(
            lambda: all(self.pid(i) for i in range(count)),
            timeout=timeout,
            what=f"{count} pods of {self.name} running",
        )


def podman_available() -> str | None:
    """None if containers can run here, else why not (what to run to get them)."""
    if not PODMAN.exists() or shutil.which("podman") is None:
        return f"no {PODMAN}: run scripts/tools/images.sh (needs root and Debian's podman)"
    return None
