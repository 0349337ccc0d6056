"""``kubectl eventfleet``: day-2 commands for EventServers, through the Kubernetes API only.

Installed as the ``kubectl-eventfleet`` console script, which kubectl finds on ``PATH``
as the plugin ``kubectl eventfleet``. Every command reads or patches the EventServer;
the operator does the work and reports in the status (no port-forward, no access to
the replicas needed)::

    kubectl eventfleet status NAME [-o table|json]
    kubectl eventfleet flush NAME [--timeout S]     # every replica to every other, verified
    kubectl eventfleet restart NAME                 # managed rollout of every pod
    kubectl eventfleet pause NAME | resume NAME     # eventfleet.io/reconcile=paused
    kubectl eventfleet hibernate NAME | wake NAME   # spec.hibernate
    kubectl eventfleet backup NAME [--wait]         # an on-demand EventServerBackup

Credentials and namespace: ``--kubeconfig``, ``--context``, ``-n/--namespace`` as for
kubectl; otherwise ``KUBECONFIG`` (or ``~/.kube/config``) and its context's namespace.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import GROUP, PLURAL, VERSION, crd, naming


class PluginError(Exception):
    """A failed command; the message is printed, the exit code is 1."""


# Seconds to connect to the API server and to wait for an answer: an unreachable server
# is an error within seconds, not a hang.
REQUEST_TIMEOUT = (10, 30)
INSTALL_HINT = (
    "the kubectl plugin needs the Python package 'kubernetes': install the operator extra "
    "into the same environment (./scripts/bootstrap operator in a checkout, or "
    "pip install 'eventfleet[operator]')"
)


class Api:
    """The few EventServer calls the plugin makes, with the ``kubernetes`` client.

    Every expected failure (the package missing, no credentials, the API server
    unreachable, an API error) is a :class:`PluginError` with what to do.
    """

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        try:
            import kubernetes  # heavy; only when a command runs
        except ImportError:
            raise PluginError(INSTALL_HINT) from None

        self._k = kubernetes
        try:
            kubernetes.config.load_kube_config(config_file=kubeconfig, context=context)
            _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
            if context:
                contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
                active = next((c for c in contexts if c["name"] == context), active)
            self.default_namespace = (active.get("context") or {}).get("namespace") or "default"
            self.server = kubernetes.client.Configuration.get_default_copy().host
        except kubernetes.config.ConfigException as e:
            if kubeconfig or context:
                where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"--context {context}"
                raise PluginError(f"{where}: {e}") from None
            try:
                kubernetes.config.load_incluster_config()
            except kubernetes.config.ConfigException:
                raise PluginError(
                    "no Kubernetes credentials: no kubeconfig ($KUBECONFIG, ~/.kube/config "
                    f"or --kubeconfig: {e}) and not running in a pod; point KUBECONFIG at "
                    "your cluster's kubeconfig (the one kubectl uses)"
                ) from None
            self.default_namespace = "default"
            self.server = kubernetes.client.Configuration.get_default_copy().host
        self.custom = kubernetes.client.CustomObjectsApi()

    def _call(self, what: str, namespace: str, name: str, fn, *args) -> dict[str, Any]:
        import urllib3

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT)
        except self._k.client.ApiException as e:
            raise PluginError(_api_error(e, namespace, name, what)) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise PluginError(_unreachable(self.server, e)) from None

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        c = self.custom
        args = (GROUP, VERSION, namespace, PLURAL, name)
        return self._call("eventserver", namespace, name, c.get_namespaced_custom_object, *args)

    def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        c = self.custom
        args = (GROUP, VERSION, namespace, PLURAL, name, dict(body))
        return self._call("eventserver", namespace, name, c.patch_namespaced_custom_object, *args)

    def create_backup(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        c = self.custom
        args = (GROUP, VERSION, namespace, "eventserverbackups", dict(body))
        name = body["metadata"]["name"]
        return self._call(
            "eventserverbackup", namespace, name, c.create_namespaced_custom_object, *args
        )

    def get_backup(self, namespace: str, name: str) -> dict[str, Any]:
        c = self.custom
        args = (GROUP, VERSION, namespace, "eventserverbackups", name)
        return self._call(
            "eventserverbackup", namespace, name, c.get_namespaced_custom_object, *args
        )


def _unreachable(server: str | None, e: BaseException) -> str:
    """One line for a request that never got an answer, with its innermost cause."""
    cause: BaseException = e
    while getattr(cause, "reason", None) is not None and isinstance(cause.reason, BaseException):
        cause = cause.reason  # urllib3's MaxRetryError -> NewConnectionError -> OSError
    text = str(cause)
    # urllib3 prefixes its connection object: "<...HTTPSConnection object at 0x..>: Failed..."
    if text.startswith("<") and ">: " in text:
        text = text.split(">: ", 1)[1]
    return (
        f"cannot reach the Kubernetes API server {server or ''}: "
        f"{type(cause).__name__}: {text or 'no answer'}; is the cluster running, and does "
        "`kubectl cluster-info` work with the same kubeconfig and context?"
    )


def _api_error(e: Any, namespace: str, name: str, kind: str = "eventserver") -> str:
    try:
        body = json.loads(e.body)
        message = body.get("message", e.reason)
    except (TypeError, ValueError, AttributeError):
        body, message = {}, e.reason
    if e.status == 404 and not (body.get("details") or {}).get("name") and body:
        # The API server knows no such resource type: the CRD is missing.
        return (
            f"this cluster has no {kind}s ({message}): install the eventfleet CRDs "
            "(helm install ... charts/eventfleet-operator, or kubectl apply -f crds/)"
        )
    if e.status == 404:
        return f'{kind} "{name}" not found in namespace "{namespace}"'
    if e.status in (401, 403):
        message += " (the kubeconfig's user lacks the right; see docs/operator.md, RBAC)"
    return f"{kind} {namespace}/{name}: {e.status} {message}"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def annotate(value: str | None, key: str) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) one annotation."""
    return {"metadata": {"annotations": {key: value}}}


# ---------------------------------------------------------------- status


def summary(es: Mapping[str, Any]) -> dict[str, Any]:
    """What ``status -o json`` prints: the spec's intent next to the observed status."""
    meta, spec, status = es["metadata"], es.get("spec") or {}, es.get("status") or {}
    notes = meta.get("annotations") or {}
    return {
        "name": meta["name"],
        "namespace": meta.get("namespace"),
        "replicas": spec.get("replicas"),
        "hibernate": bool(spec.get("hibernate")),
        "paused": notes.get(naming.PAUSE_ANNOTATION) == naming.PAUSED,
        "updateStrategy": (spec.get("updateStrategy") or {}).get(
            "type", crd.default("spec.updateStrategy.type")
        ),
        "phase": status.get("phase"),
        "readyReplicas": status.get("readyReplicas", 0),
        "statefulSetReplicas": status.get("statefulSetReplicas"),
        "currentRevision": status.get("currentRevision"),
        "updateRevision": status.get("updateRevision"),
        "updatedReplicas": status.get("updatedReplicas"),
        "observedGeneration": status.get("observedGeneration"),
        "generation": meta.get("generation"),
        "conditions": status.get("conditions") or [],
        "peers": status.get("peers") or [],
        "lastFlush": status.get("lastFlush"),
    }


def _table(rows: Sequence[Sequence[Any]]) -> list[str]:
    text = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(text[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in text]


def _event_id(value: Mapping[str, Any] | None) -> str:
    if not value:
        return "-"
    return f"{value.get('server')}/{value.get('session')}/{value.get('instance')}"


def render_status(s: Mapping[str, Any]) -> str:
    """The readable ``status`` view: fleet, conditions, one line per replica."""
    flags = [f for f, on in (("paused", s["paused"]), ("hibernate", s["hibernate"])) if on]
    stale = s["observedGeneration"] is not None and s["observedGeneration"] != s["generation"]
    head = [
        f"EventServer {s['namespace']}/{s['name']}: {s['phase'] or 'no status yet'}"
        + (f" ({', '.join(flags)})" if flags else ""),
        f"Replicas:   {s['readyReplicas']}/{s['replicas']} ready, StatefulSet at "
        f"{s['statefulSetReplicas'] if s['statefulSetReplicas'] is not None else '-'}",
        f"Revisions:  {s['updatedReplicas'] if s['updatedReplicas'] is not None else '-'} "
        f"on {s['updateRevision'] or '-'} (current {s['currentRevision'] or '-'}, "
        f"strategy {s['updateStrategy']})",
    ]
    if stale:
        head.append(
            f"Note:       the status is of generation {s['observedGeneration']}, "
            f"the spec is at {s['generation']}"
        )
    if s["lastFlush"]:
        f = s["lastFlush"]
        head.append(f"Last flush: {f.get('result')} at {f.get('time')} ({f.get('message')})")
    out = [*head, ""]
    conditions = [("CONDITION", "STATUS", "REASON", "MESSAGE")]
    conditions += [
        (c.get("type"), c.get("status"), c.get("reason"), (c.get("message") or "")[:100])
        for c in s["conditions"]
    ]
    out += _table(conditions)
    out.append("")
    peers = [("REPLICA", "SERVER", "READY", "SYNC", "LAST EVENT", "LAG EVENTS", "LAG S", "EVENTS")]
    for p in s["peers"]:
        peers.append(
            (
                p.get("name"),
                p.get("serverId"),
                "yes" if p.get("ready") else "no",
                p.get("syncState"),
                _event_id(p.get("lastEventId")),
                p.get("lagEvents"),
                p.get("lagSeconds"),
                p.get("events"),
            )
        )
    out += _table(peers) if len(peers) > 1 else ["no replica reports (none running)"]
    return "\n".join(out)


# ---------------------------------------------------------------- commands


def cmd_status(api: Api, args: argparse.Namespace) -> str:
    s = summary(api.get(args.namespace, args.name))
    return json.dumps(s, indent=2) if args.output == "json" else render_status(s)


def progress(line: str) -> None:
    """A progress line of a long wait, on stderr (stdout keeps only the result)."""
    print(line, file=sys.stderr, flush=True)


# Seconds between "still waiting" lines when nothing observable changed.
PROGRESS_EVERY = 10.0


def _ready(es: Mapping[str, Any]) -> str:
    ready = next(
        (c for c in (es.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    return f"Ready={ready.get('status')} {ready.get('reason')}" if ready else "no status yet"


def cmd_flush(api: Api, args: argparse.Namespace) -> str:
    token = f"{now()}-{time.monotonic_ns() % 1_000_000}"
    api.patch(args.namespace, args.name, annotate(token, naming.FLUSH_ANNOTATION))
    progress(
        f"flush requested ({naming.FLUSH_ANNOTATION}={token}): the operator flushes every "
        f"replica to every other one and verifies; waiting up to {args.timeout:g} s"
    )
    started = time.monotonic()
    deadline, next_note = started + args.timeout, started + PROGRESS_EVERY
    while time.monotonic() < deadline:
        es = api.get(args.namespace, args.name)
        flush = (es.get("status") or {}).get("lastFlush") or {}
        if flush.get("requested") == token:
            if flush.get("result") != "Verified":
                raise PluginError(f"flush failed: {flush.get('result')}: {flush.get('message')}")
            return f"eventserver/{args.name} flushed: {flush.get('message')}"
        if time.monotonic() >= next_note:
            progress(
                f"  still waiting for the operator's answer after "
                f"{time.monotonic() - started:.0f} s ({_ready(es)})"
            )
            next_note += PROGRESS_EVERY
        time.sleep(0.5)
    raise PluginError(
        f"no answer from the operator within {args.timeout}s "
        f"(is it running and watching {args.namespace}? is the fleet paused?)"
    )


def cmd_restart(api: Api, args: argparse.Namespace) -> str:
    value = now()
    api.patch(args.namespace, args.name, annotate(value, naming.RESTART_ANNOTATION))
    return f"eventserver/{args.name} restart requested ({naming.RESTART_ANNOTATION}={value})"


def cmd_pause(api: Api, args: argparse.Namespace) -> str:
    api.patch(args.namespace, args.name, annotate(naming.PAUSED, naming.PAUSE_ANNOTATION))
    return f"eventserver/{args.name} paused: the operator only updates its status"


def cmd_resume(api: Api, args: argparse.Namespace) -> str:
    api.patch(args.namespace, args.name, annotate(None, naming.PAUSE_ANNOTATION))
    return f"eventserver/{args.name} resumed"


def cmd_hibernate(api: Api, args: argparse.Namespace) -> str:
    api.patch(args.namespace, args.name, {"spec": {"hibernate": True}})
    return (
        f"eventserver/{args.name} hibernating: flush, verify, then 0 replicas (claims kept); "
        f"kubectl wait --for=condition=Hibernated eventserver/{args.name}"
    )


def cmd_wake(api: Api, args: argparse.Namespace) -> str:
    api.patch(args.namespace, args.name, {"spec": {"hibernate": False}})
    return f"eventserver/{args.name} waking up"


def cmd_backup(api: Api, args: argparse.Namespace) -> str:
    from eventfleet_operator import backups  # the operator's module; loaded only here

    es = api.get(args.namespace, args.name)
    if not (es.get("spec") or {}).get("backup"):
        raise PluginError(f"eventserver/{args.name} has no spec.backup (the S3 target)")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S")
    name = args.backup_name or f"{args.name}-manual-{stamp}"
    api.create_backup(
        args.namespace, backups.manifest(args.name, args.namespace, name, scheduled=False)
    )
    if not args.wait:
        return (
            f"eventserverbackup/{name} created; kubectl get eventserverbackup {name} -w follows it"
        )
    progress(f"eventserverbackup/{name} created; waiting up to {args.timeout:g} s")
    started = time.monotonic()
    deadline, next_note = started + args.timeout, started + PROGRESS_EVERY
    seen: tuple[Any, ...] | None = None
    while time.monotonic() < deadline:
        status = api.get_backup(args.namespace, name).get("status") or {}
        state = (status.get("phase"), status.get("replica"), status.get("error"))
        elapsed = time.monotonic() - started
        if state != seen:  # a new phase, replica or reason: say so at once
            seen, next_note = state, time.monotonic() + PROGRESS_EVERY
            progress(f"  {elapsed:.0f} s: {_backup_state(status)}")
        elif time.monotonic() >= next_note:
            progress(f"  {elapsed:.0f} s: still {_backup_state(status)}")
            next_note += PROGRESS_EVERY
        if status.get("phase") == backups.COMPLETED:
            digest = status.get("digest") or {}
            return (
                f"eventserverbackup/{name} completed from {status.get('replica')}: "
                f"{digest.get('events')} events, {digest.get('size')} bytes at "
                f"s3://{status.get('bucket')}/{status.get('objectKey')} "
                f"(sha256 {digest.get('sha256')})"
            )
        if status.get("phase") == backups.FAILED:
            raise PluginError(f"eventserverbackup/{name} failed: {status.get('error')}")
        time.sleep(1.0)
    raise PluginError(f"eventserverbackup/{name} not finished within {args.timeout}s")


def _backup_state(status: Mapping[str, Any]) -> str:
    phase = status.get("phase") or "not picked up by the operator yet"
    parts = [phase]
    if status.get("replica"):
        parts.append(f"from {status['replica']}")
    if status.get("attempts"):
        parts.append(f"attempt {status['attempts']}")
    if status.get("error"):
        parts.append(f"({status['error']})")  # while Pending: why no replica qualifies
    return " ".join(parts)


COMMANDS = {
    "status": (cmd_status, "replicas, revisions, conditions and per-replica sync state"),
    "flush": (cmd_flush, "flush every replica to every other one and verify (waits)"),
    "restart": (cmd_restart, "replace every pod, one at a time (managed rollout)"),
    "pause": (cmd_pause, "stop reconciling (status only)"),
    "resume": (cmd_resume, "reconcile again"),
    "hibernate": (cmd_hibernate, "flush, verify, scale to 0, keep the volumes"),
    "wake": (cmd_wake, "scale back to spec.replicas"),
    "backup": (cmd_backup, "back the fleet up now (an EventServerBackup; --wait to follow)"),
}


def _connection_options(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)",
    )
    p.add_argument("--context", default=default, help="kubeconfig context")
    p.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")


def parser() -> argparse.ArgumentParser:
    """Options in any position, as with kubectl: ``-n NS status NAME`` and
    ``status NAME -n NS`` mean the same."""
    p = argparse.ArgumentParser(
        prog="kubectl eventfleet", description="Day-2 commands for eventfleet EventServers."
    )
    _connection_options(p, None)
    # After the command too; SUPPRESS keeps a value given before it when absent after.
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        one = sub.add_parser(name, help=help_text, parents=[common])
        one.add_argument("name", help="the EventServer")
        if name == "status":
            one.add_argument("-o", "--output", choices=("table", "json"), default="table")
        if name == "flush":
            one.add_argument("--timeout", type=float, default=120.0, help="seconds (120)")
        if name == "backup":
            one.add_argument("--wait", action="store_true", help="wait until it finishes")
            one.add_argument("--timeout", type=float, default=600.0, help="seconds (600)")
            one.add_argument("--backup-name", help="name of the EventServerBackup")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-eventfleet`` entry point."""
    args = parser().parse_args(argv)
    try:
        api = Api(args.kubeconfig, args.context)
        args.namespace = args.namespace or api.default_namespace
        print(COMMANDS[args.command][0](api, args))
        return 0
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C during a wait: what was asked for (a flush, a backup) goes on without us.
        print("interrupted (the operator still carries out the request)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
