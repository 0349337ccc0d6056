"""The aggregation job as a pod, from the ScheduledSparkApplication the operator wrote.

spark-operator does not run here (its controller is not served by the Go module proxy;
docs/aggregation.md): this module does the part of it that matters to the fleet. It
turns the ScheduledSparkApplication read from the API server into the pod of one run's
driver, as spark-operator and its webhook would make it — the template's image and pull
policy, the driver's labels plus ``spark-role=driver`` and
``sparkoperator.k8s.io/app-name``, its service account, environment (the token from the
fleet's Secret), volumes, mounts and security contexts, the main file with exactly the
template's ``arguments`` — and runs ``spark-submit`` there. The difference: the executors
run as threads of the driver (``--master local[N]``, N = instances * cores) instead of
pods the driver asks the API server for.
"""

from __future__ import annotations

import time
from typing import Any

from .clients import ClusterKubectl

# Spark's name for the driver's container (Spark on Kubernetes).
DRIVER_CONTAINER = "spark-kubernetes-driver"


def submit_command(template: dict[str, Any]) -> list[str]:
    """``spark-submit`` of the template's main file with its arguments."""
    if template.get("type") != "Python" or template.get("mode") != "cluster":
        raise AssertionError(f"not a cluster-mode Python application: {template}")
    main = template["mainApplicationFile"]
    if not main.startswith("local://"):
        raise AssertionError(f"the main file is not in the image: {main!r}")
    executor = template["executor"]
    threads = int(executor.get("instances", 1)) * int(executor.get("cores", 1))
    command = [
        "/opt/spark/bin/spark-submit",
        "--master", f"local[{threads}]",
        "--driver-memory", template["driver"]["memory"],
    ]  # fmt: skip
    for key, value in sorted((template.get("sparkConf") or {}).items()):
        command += ["--conf", f"{key}={value}"]
    for key, value in sorted((template.get("hadoopConf") or {}).items()):
        command += ["--conf", f"spark.hadoop.{key}={value}"]
    return [*command, main.removeprefix("local://"), *template.get("arguments", [])]


def driver_pod(app: dict[str, Any], run: str) -> dict[str, Any]:
    """The driver pod of run ``run`` of the ScheduledSparkApplication ``app``."""
    template = app["spec"]["template"]
    driver = template["driver"]
    labels = {
        **(driver.get("labels") or {}),
        "spark-role": "driver",
        "spark-app-name": run,
        "sparkoperator.k8s.io/app-name": run,
        "sparkoperator.k8s.io/launched-by-spark-operator": "true",
    }
    container: dict[str, Any] = {
        "name": DRIVER_CONTAINER,
        "image": template["image"],
        "imagePullPolicy": template.get("imagePullPolicy", "IfNotPresent"),
        "command": submit_command(template),
        "env": driver.get("env", []),
    }
    for key in ("volumeMounts", "securityContext"):
        if key in driver:
            container[key] = driver[key]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{run}-driver", "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": driver["serviceAccount"],
            "containers": [container],
        },
    }
    if "podSecurityContext" in driver:
        pod["spec"]["securityContext"] = driver["podSecurityContext"]
    if template.get("volumes"):
        pod["spec"]["volumes"] = template["volumes"]
    return pod


def run_driver(k: ClusterKubectl, app: dict[str, Any], run: str, timeout: float) -> dict[str, Any]:
    """Create the run's driver pod and wait until it has ended; returns the pod."""
    k.apply(driver_pod(app, run))
    deadline = time.monotonic() + timeout
    while True:
        pod = k.get("pod", f"{run}-driver") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return pod
        if time.monotonic() > deadline:
            log = k.run("logs", f"{run}-driver", "--tail=80", check=False)
            raise AssertionError(
                f"driver {run}-driver not done after {timeout:.0f} s (phase {phase}): "
                f"{log.stdout}{log.stderr}"
            )
        time.sleep(2)
