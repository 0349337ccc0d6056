"""Plays the StatefulSet controller and the kubelet for one fleet, with real replicas.

The emulator runs no controllers, so this thread does their part for one StatefulSet:
for each ordinal below ``spec.replicas`` it runs a *real* replica process
(``python -m eventfleet_cli server``) with the configuration the operator wrote into the
ConfigMap, localised to loopback (every pod gets its own ports; peer hosts such as
``demo-1.demo-peers.ns.svc:23013`` become ``127.0.0.1:<that pod's syncer port>``), and
the token from the Secret. Like the real kubelet it:

* updates the mounted config file when the ConfigMap changes (and sends SIGHUP, so the
  replica re-reads its peers at once instead of at its next poll);
* restarts a pod whose template ``config-hash`` annotation changed (a rolling update,
  highest ordinal first, one at a time) -- unless the StatefulSet's ``updateStrategy``
  is ``OnDelete``: then a pod keeps its own template until its Pod object is deleted
  (by the operator's managed rollout), and is then replaced from the current template;
* runs an image whose tag contains ``crashloop`` as a process that exits after a second
  (a crash loop: never ready, restarted with the pod's own template);
* stops pods above ``spec.replicas`` with SIGTERM (graceful: the replica flushes);
* creates the volume claim ``data-<pod>`` for each pod it starts (size from the claim
  template) and plays the volume expansion controller: a claim whose request grew gets
  ``status.capacity`` of the new size (a StatefulSet deleted with its pods orphaned --
  the operator's volume growth -- keeps its pods running for a few seconds, and a new
  StatefulSet of the same name adopts them);
* reports ``status.replicas`` / ``readyReplicas`` (from each replica's ``/readyz``);
* writes the operator's ``--replica-urls-file`` (pod -> its HTTP endpoint);
* mounts the other Secret volumes of the template (the S3 key pairs of spec.backup and
  spec.bootstrap.fromBackup) as files in the pod's directory, and points the config's
  paths under their mount paths there.

A test can ``pause`` a pod (stop it and keep it stopped, like a lost node) and
``resume`` it (same ports, same data directory).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import yaml

from e2e.ports import free_port

from .harness import ROOT, Api, stop_process

HASH_ANNOTATION = "eventfleet.io/config-hash"
_URLS_LOCK = threading.Lock()  # several fleets (kubelets) share one urls file


ORPHAN_GRACE = 6.0  # seconds orphaned pods wait for a new StatefulSet
CRASH_MARK = "crashloop"  # an image tag containing it plays a crash-looping container


class Pod:
    def __init__(
        self,
        ordinal: int,
        proc: subprocess.Popen,
        config_hash: str,
        template: dict[str, Any] | None = None,
    ) -> None:
        self.ordinal, self.proc, self.config_hash = ordinal, proc, config_hash
        self.template = template or {}
        self.started = time.monotonic()


class FakeKubelet(threading.Thread):
    """One StatefulSet's pods as real replica processes; ``start()``, then ``stop()``."""

    def __init__(
        self, api: Api, namespace: str, name: str, workdir: pathlib.Path, urls_file: pathlib.Path
    ) -> None:
        super().__init__(name=f"kubelet-{namespace}-{name}", daemon=True)
        self.api, self.namespace, self.name = api, namespace, name
        self.workdir = workdir / f"pods-{namespace}-{name}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.urls_file = urls_file
        self.ports: dict[int, dict[str, int]] = {}
        self.pods: dict[int, Pod] = {}
        self.paused: set[int] = set()
        self.errors: list[str] = []
        self.restarts: dict[int, int] = {}
        self._halt = threading.Event()
        self._lock = threading.RLock()
        self._reported: tuple[int, int] | None = None
        self._gone_since: float | None = None
        self.claim_size = "1Gi"

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        with self._lock:
            for ordinal in sorted(self.pods, reverse=True):
                self._stop_pod(ordinal)

    def pause(self, ordinal: int) -> None:
        """Stop pod ``ordinal`` and keep it stopped (SIGKILL: a lost node, no goodbye)."""
        with self._lock:
            self.paused.add(ordinal)
            self._stop_pod(ordinal, sig=signal.SIGKILL)

    def resume(self, ordinal: int) -> None:
        with self._lock:
            self.paused.discard(ordinal)

    def pid(self, ordinal: int) -> int | None:
        pod = self.pods.get(ordinal)
        return pod.proc.pid if pod and pod.proc.poll() is None else None

    def http(self, ordinal: int) -> str:
        return f"http://127.0.0.1:{self.ports[ordinal]['http']}"

    def eventer(self, ordinal: int) -> str:
        return f"127.0.0.1:{self.ports[ordinal]['eventer']}"

    def token_file(self, ordinal: int) -> pathlib.Path:
        return self.workdir / f"{self.name}-{ordinal}" / "token"

    def store_file(self, ordinal: int) -> pathlib.Path:
        """The replica's SQLite store (as ``e2e.k8s.node.Fleet.store_file``)."""
        return self.workdir / f"{self.name}-{ordinal}" / "data" / "events.sqlite"

    def status(self, ordinal: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.http(ordinal) + "/status", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with self._lock:
                    self.sync()
            except Exception as e:  # keep playing the controller, report later
                self.errors.append(f"{type(e).__name__}: {e}")
                del self.errors[:-20]
            self._halt.wait(0.25)

    def _path(self, plural: str, name: str, group: str = "") -> str:
        base = f"/apis/{group}" if group else "/api"
        return f"{base}/v1/namespaces/{self.namespace}/{plural}/{name}"

    def sync(self) -> None:
        sts = self.api.get(self._path("statefulsets", self.name, "apps"))
        if sts is None:
            # Deleted with its pods orphaned (volume growth recreates it at once) or with
            # them (cleanup): a new StatefulSet soon adopts them, else they go.
            self._gone_since = self._gone_since or time.monotonic()
            if time.monotonic() - self._gone_since > ORPHAN_GRACE:
                for ordinal in sorted(self.pods, reverse=True):
                    self._stop_pod(ordinal)
            return
        self._gone_since = None
        replicas = int(sts["spec"].get("replicas") or 0)
        template = sts["spec"]["template"]
        template_hash = (template["metadata"].get("annotations") or {}).get(HASH_ANNOTATION, "")
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "token")["secret"]
        cm = self.api.get(self._path("configmaps", f"{self.name}-config"))
        secret = self.api.get(self._path("secrets", volume["secretName"]))
        if cm is None or secret is None:
            return  # a real pod would not start without its volumes either
        token = base64.b64decode(secret["data"][volume["items"][0]["key"]]).decode()
        config = yaml.safe_load(cm["data"]["config.yaml"])
        mounts = self._secret_mounts(template)
        if mounts is None:
            return  # a Secret volume's Secret is missing: the pod would not start

        for ordinal in range(max(replicas, len(config.get("peers") or []))):
            if ordinal not in self.ports:  # (setdefault would take fresh ports every sync)
                self.ports[ordinal] = {
                    "eventer": free_port(),
                    "syncer": free_port(),
                    "http": free_port(),
                }
        self._write_urls()

        for ordinal in sorted(self.pods, reverse=True):
            if ordinal >= replicas:
                self._stop_pod(ordinal)  # graceful: the replica flushes to its peers
        for ordinal in range(replicas):
            changed = self._write_config(ordinal, config, token, mounts)
            pod = self.pods.get(ordinal)
            if pod and pod.proc.poll() is None and changed:
                os.kill(pod.proc.pid, signal.SIGHUP)  # kubelet updated the mount; reload now
        for claim in sts["spec"].get("volumeClaimTemplates") or []:
            if claim["metadata"]["name"] == "data":
                self.claim_size = claim["spec"]["resources"]["requests"]["storage"]
        on_delete = (sts["spec"].get("updateStrategy") or {}).get("type") == "OnDelete"
        if on_delete:
            self._replace_deleted(replicas)
        else:
            self._rolling_restart(replicas, template_hash)
        for ordinal in range(replicas):
            pod = self.pods.get(ordinal)
            if ordinal not in self.paused and (pod is None or pod.proc.poll() is not None):
                # A container restart keeps the pod's own spec; a new pod gets the template.
                own = pod.template if (on_delete and pod is not None and pod.template) else template
                own_hash = (own["metadata"].get("annotations") or {}).get(HASH_ANNOTATION, "")
                self._start_pod(ordinal, own_hash, own)
                self._pod_object(ordinal, own)
        self._report(sts, replicas)

    def _replace_deleted(self, replicas: int) -> None:
        """OnDelete: a running pod whose Pod object was deleted stops; sync recreates it."""
        for ordinal in sorted(self.pods, reverse=True):
            if ordinal >= replicas:
                continue
            if self.api.get(self._path("pods", f"{self.name}-{ordinal}")) is None:
                self._stop_pod(ordinal)
                self.restarts[ordinal] = self.restarts.get(ordinal, 0) + 1

    def _rolling_restart(self, replicas: int, template_hash: str) -> None:
        stale = [
            o
            for o in sorted(self.pods, reverse=True)
            if o < replicas and self.pods[o].config_hash != template_hash
        ]
        if not stale:
            return
        others_ready = all(self._ready(o) for o in self.pods if o not in stale[:1])
        if others_ready or len(stale) == len(self.pods):
            ordinal = stale[0]
            self._stop_pod(ordinal)
            self.restarts[ordinal] = self.restarts.get(ordinal, 0) + 1
            self._start_pod(ordinal, template_hash)

    def _secret_mounts(self, template: dict[str, Any]) -> dict[str, dict[str, str]] | None:
        """``{mount path: {file: content}}`` of the Secret volumes other than the token."""
        volumes = {v["name"]: v for v in template["spec"].get("volumes") or []}
        out: dict[str, dict[str, str]] = {}
        for mount in template["spec"]["containers"][0].get("volumeMounts") or []:
            secret_ref = (volumes.get(mount["name"]) or {}).get("secret")
            if not secret_ref or mount["name"] == "token":
                continue
            secret = self.api.get(self._path("secrets", secret_ref["secretName"]))
            if secret is None:
                return None
            data = secret.get("data") or {}
            items = secret_ref.get("items") or [{"key": k, "path": k} for k in data]
            out[mount["mountPath"]] = {
                item["path"]: base64.b64decode(data.get(item["key"], "")).decode() for item in items
            }
        return out

    def _mount_dir(self, ordinal: int, mount_path: str) -> pathlib.Path:
        return self.workdir / f"{self.name}-{ordinal}" / "mounts" / mount_path.strip("/")

    def _localise(
        self, ordinal: int, config: dict[str, Any], mounts: dict[str, dict[str, str]] | None = None
    ) -> dict[str, Any]:
        pod_dir = self.workdir / f"{self.name}-{ordinal}"
        ports = self.ports[ordinal]
        # Paths under a Secret volume's mount path point into the pod's copy of it.
        text = json.dumps(config)
        for mount_path in mounts or {}:
            text = text.replace(f'"{mount_path}/', f'"{self._mount_dir(ordinal, mount_path)}/')
        local = json.loads(text)
        local.update(
            host="127.0.0.1", data_dir=str(pod_dir / "data"), token_file=str(pod_dir / "token")
        )
        local["eventer"] = {**local.get("eventer", {}), "port": ports["eventer"]}
        local["syncer"] = {**local.get("syncer", {}), "port": ports["syncer"]}
        local["http"] = {**local.get("http", {}), "port": ports["http"]}
        local["bus"] = {**local.get("bus", {}), "enabled": False}  # no ZeroMQ port triplets here
        peers = []
        for peer in local.get("peers") or []:
            peer_ordinal = int(peer["name"].rsplit("-", 1)[1])
            port = self.ports.get(peer_ordinal, {}).get("syncer")
            if port:
                peers.append({**peer, "host": "127.0.0.1", "port": port})
        local["peers"] = peers
        return local

    def _write_config(
        self,
        ordinal: int,
        config: dict[str, Any],
        token: str,
        mounts: dict[str, dict[str, str]] | None = None,
    ) -> bool:
        """Write the pod's files; True when any changed (the caller sends SIGHUP, as the
        replica would notice a changed mount by itself at its next poll)."""
        pod_dir = self.workdir / f"{self.name}-{ordinal}"
        pod_dir.mkdir(exist_ok=True)
        files_changed = False
        token_path = pod_dir / "token"
        if not token_path.exists() or token_path.read_text() != token:
            token_path.write_text(token)
            files_changed = True
        for mount_path, files in (mounts or {}).items():
            directory = self._mount_dir(ordinal, mount_path)
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                file = directory / name
                if not file.exists() or file.read_text() != content:
                    file.write_text(content)  # e.g. a rotated peer token
                    files_changed = True
        text = yaml.safe_dump(self._localise(ordinal, config, mounts), sort_keys=False)
        path = pod_dir / "config.yaml"
        if path.exists() and path.read_text() == text:
            return files_changed
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic, like kubelet's symlink swap
        return True

    def _start_pod(
        self, ordinal: int, config_hash: str, template: dict[str, Any] | None = None
    ) -> None:
        pod_dir = self.workdir / f"{self.name}-{ordinal}"
        containers = ((template or {}).get("spec") or {}).get("containers") or [{}]
        crash = CRASH_MARK in containers[0].get("image", "")
        env = {
            **os.environ,
            "EVENTFLEET_POD_NAME": f"{self.name}-{ordinal}",  # server id = ordinal + 1
            "EVENTFLEET_NAMESPACE": self.namespace,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("EVENTFLEET_TOKEN", None)
        log = open(pod_dir / "replica.log", "a")  # lives with the process
        command = [
            sys.executable,
            "-m",
            "eventfleet_cli",
            "server",
            "--config",
            str(pod_dir / "config.yaml"),
        ]
        if crash:
            command = ["/bin/sh", "-c", "echo 'crash-looping image'; sleep 1; exit 1"]
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.pods[ordinal] = Pod(ordinal, proc, config_hash, template)
        claim = f"data-{self.name}-{ordinal}"
        if self.api.get(self._path("persistentvolumeclaims", claim)) is None:
            self.api.request(
                "POST",
                f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims",
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": claim,
                        "labels": {
                            "app.kubernetes.io/name": "eventfleet",
                            "app.kubernetes.io/instance": self.name,
                            "app.kubernetes.io/component": "replica",
                        },
                    },
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": self.claim_size}},
                    },
                },
            )

    def _stop_pod(self, ordinal: int, sig: int = signal.SIGTERM) -> None:
        pod = self.pods.pop(ordinal, None)
        if pod is not None:
            stop_process(pod.proc, grace=20, sig=sig)
        with contextlib.suppress(RuntimeError):
            self.api.request("DELETE", self._path("pods", f"{self.name}-{ordinal}"))

    def _pod_object(self, ordinal: int, template: dict[str, Any]) -> None:
        """The Pod object the StatefulSet controller would create (labels from the template)."""
        name = f"{self.name}-{ordinal}"
        if self.api.get(self._path("pods", name)) is not None:
            return
        meta = template["metadata"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {**meta.get("labels", {}), "statefulset.kubernetes.io/pod-name": name},
                "annotations": dict(meta.get("annotations") or {}),
            },
            "spec": template["spec"],
        }
        self.api.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def _ready(self, ordinal: int) -> bool:
        if ordinal not in self.ports or ordinal not in self.pods:
            return False
        try:
            with urllib.request.urlopen(self.http(ordinal) + "/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def _report(self, sts: dict[str, Any], replicas: int) -> None:
        running = [o for o, p in self.pods.items() if p.proc.poll() is None]
        ready = sum(1 for o in running if self._ready(o))
        if self._reported == (len(running), ready) and (sts.get("status") or {}).get(
            "replicas"
        ) == len(running):
            return
        status = {
            "replicas": len(running),
            "readyReplicas": ready,
            "currentReplicas": len(running),
            "availableReplicas": ready,
            "observedGeneration": sts["metadata"].get("generation", 1),
        }
        self.api.merge_patch(
            self._path("statefulsets", self.name, "apps") + "/status", {"status": status}
        )
        self._reported = (len(running), ready)

    def _write_urls(self) -> None:
        with _URLS_LOCK:
            self._write_urls_locked()

    def _write_urls_locked(self) -> None:
        mapping: dict[str, str] = {}
        if self.urls_file.exists():
            with contextlib.suppress(ValueError):
                mapping = json.loads(self.urls_file.read_text() or "{}")
        for ordinal in self.ports:
            mapping[f"{self.namespace}/{self.name}-{ordinal}"] = self.http(ordinal)
        text = json.dumps(mapping, indent=1, sort_keys=True)
        if not self.urls_file.exists() or self.urls_file.read_text() != text:
            tmp = self.urls_file.with_suffix(f".{self.name}.tmp")
            tmp.write_text(text)
            tmp.replace(self.urls_file)
