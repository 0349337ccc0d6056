"""`helm test`: the operator answers and the CRDs are served.

Runs in the operator image (standard library only) with the chart's test ServiceAccount,
which may read pods and deployments in the release namespace and nothing else. It checks,
in order, and stops at the first failure with a line saying what is wrong:

1. the API server serves every CRD of the chart (discovery of eventfleet.io/v1);
2. the operator Deployment has all its replicas available (replicaCount 0 is a failure:
   nothing reconciles);
3. each running operator pod answers GET /healthz on the health port (Kopf's liveness
   endpoint, the same one the kubelet probes). A pod being deleted is left out: right
   after an upgrade or a reinstall the old pod still reads "Running" while its network
   is already gone, and it no longer serves anything.

Settings come from the environment the chart's test pod sets.
"""

import json
import os
import ssl
import sys
import urllib.parse
import urllib.request

API = os.environ.get("KUBERNETES_API", "https://kubernetes.default.svc")
SA_DIR = os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
NAMESPACE = os.environ["RELEASE_NAMESPACE"]
DEPLOYMENT = os.environ["OPERATOR_DEPLOYMENT"]
SELECTOR = os.environ["OPERATOR_SELECTOR"]
HEALTH_PORT = int(os.environ["OPERATOR_HEALTH_PORT"])
GROUP_VERSION = os.environ.get("CRD_GROUP_VERSION", "eventfleet.io/v1")
CRDS = [c for c in os.environ.get("CRD_RESOURCES", "").split(",") if c]
TIMEOUT = 10


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def api(path):
    with open(os.path.join(SA_DIR, "token")) as f:
        token = f.read().strip()
    request = urllib.request.Request(API + path, headers={"Authorization": f"Bearer {token}"})
    context = None
    if API.startswith("https:"):
        context = ssl.create_default_context(cafile=os.path.join(SA_DIR, "ca.crt"))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        fail(f"GET {path}: HTTP {e.code} {e.reason}")
    except OSError as e:
        fail(f"GET {API}{path}: {e}")


def main():
    discovery = api(f"/apis/{GROUP_VERSION}")
    served = {r["name"] for r in (discovery or {}).get("resources", [])}
    missing = [c for c in CRDS if c not in served]
    if missing:
        fail(
            f"the API server does not serve {', '.join(missing)} ({GROUP_VERSION}): "
            "install the chart with crds.create=true or apply crds/ from the repository"
        )
    print(f"ok: {GROUP_VERSION} serves {', '.join(CRDS)}", flush=True)

    deployment = api(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
    if deployment is None:
        fail(f"deployment {NAMESPACE}/{DEPLOYMENT} not found")
    want = int((deployment.get("spec") or {}).get("replicas", 1))
    available = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if want == 0:
        fail(f"deployment {DEPLOYMENT} has replicaCount 0: no operator reconciles")
    if available < want:
        fail(
            f"deployment {DEPLOYMENT}: {available} of {want} operator pods available "
            f"(kubectl -n {NAMESPACE} describe deployment {DEPLOYMENT})"
        )
    print(f"ok: deployment {DEPLOYMENT} has {available} of {want} pods available", flush=True)

    query = urllib.parse.urlencode({"labelSelector": SELECTOR})
    pods = (api(f"/api/v1/namespaces/{NAMESPACE}/pods?{query}") or {}).get("items", [])
    running = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            print(f"skipped: operator pod {pod['metadata']['name']} is being deleted", flush=True)
            continue
        running.append(pod)
    if not running:
        fail(f"no running operator pod matches {SELECTOR} in {NAMESPACE}")
    for pod in running:
        name, ip = pod["metadata"]["name"], pod["status"].get("podIP")
        url = f"http://{ip}:{HEALTH_PORT}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                status = response.status
        except OSError as e:
            fail(f"operator pod {name} does not answer {url}: {e}")
        if status != 200:
            fail(f"operator pod {name}: {url} answered {status}")
        print(f"ok: operator pod {name} answers {url}", flush=True)


if __name__ == "__main__":
    main()
