#!/usr/bin/env bash
# Real-cluster end-to-end test of the operator on kind (Kubernetes in Docker).
#
# The CI machines of this project have no Docker engine, so this script is NOT run
# there: CI runs the operator and the chart on a real single-node Kubernetes built from
# Go modules (e2e/cluster, docs/operator.md "Tests") with the project's images. Run this where you have Docker and kind, as a check of your own cluster setup:
# the images built by docker, Helm install, pods starting, probes, DNS names of the peer
# Service, the replicas syncing, volumes, a safe scale-down, garbage collection.
#
# Needs: docker, kind (>= 0.20), kubectl, helm; optional: curl, python3 (checks).
# Usage:
#   e2e/kind/run.sh                 # create the cluster, build, install, test, delete
#   KEEP_CLUSTER=1 e2e/kind/run.sh  # keep the cluster afterwards for poking around
#   CLUSTER=my-kind e2e/kind/run.sh # reuse / name the cluster
#   NO_BUILD=1 e2e/kind/run.sh      # use already loaded images
# Exit status 0 means every step passed; each step prints what it checks.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
cluster="${CLUSTER:-eventfleet-e2e}"
ns="${NAMESPACE:-eventfleet-e2e}"
version="$(python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])' 2>/dev/null || echo 0.1.0)"
timeout="${TIMEOUT:-300s}"

step() { printf '\n=== %s\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "kind e2e: '$1' is required" >&2; exit 2; }; }
for tool in docker kind kubectl helm; do need "$tool"; done

cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "kind e2e: FAILED (exit $rc); state of the namespace:" >&2
        kubectl -n "$ns" get eventservers,statefulsets,pods,pvc,events -o wide >&2 || true
        kubectl -n eventfleet-system logs deploy/eventfleet-operator --tail=200 >&2 || true
    fi
    if [ -z "${KEEP_CLUSTER:-}" ]; then
        kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

step "cluster $cluster"
if ! kind get clusters | grep -qx "$cluster"; then
    kind create cluster --name "$cluster" --wait 120s
fi
kubectl config use-context "kind-$cluster"

if [ -z "${NO_BUILD:-}" ]; then
    step "images eventfleet/server:$version and eventfleet/operator:$version"
    docker build -f images/server.Dockerfile -t "eventfleet/server:$version" .
    docker build -f images/operator.Dockerfile -t "eventfleet/operator:$version" .
    kind load docker-image --name "$cluster" "eventfleet/server:$version" "eventfleet/operator:$version"
fi

step "operator from the Helm chart (CRD, RBAC, Deployment)"
kubectl create namespace eventfleet-system --dry-run=client -o yaml | kubectl apply -f -
# The chart is namespaced by default: watch the fleet's namespace (it must exist first).
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install eventfleet-operator charts/eventfleet-operator \
    --namespace eventfleet-system \
    --set image.tag="$version" --set image.pullPolicy=Never \
    --set "operator.watchNamespaces={$ns}" \
    --wait --timeout "$timeout"
kubectl -n eventfleet-system rollout status deploy/eventfleet-operator --timeout "$timeout"

step "EventServer demo with 3 replicas -> Ready"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$ns" apply -f - <<EOF
apiVersion: eventfleet.io/v1
kind: EventServer
metadata:
  name: demo
spec:
  replicas: 3
  imagePullPolicy: Never
  storage: {size: 256Mi, retentionPolicy: {whenDeleted: Delete}}
EOF
kubectl -n "$ns" wait --for=condition=Ready eventserver/demo --timeout "$timeout"
kubectl -n "$ns" wait --for=condition=PeersSynced eventserver/demo --timeout "$timeout"
kubectl -n "$ns" get eventserver demo -o wide

step "register events on the replica that will leave (demo-2)"
# The replica image carries the eventfleet CLI, and the pod has the token mounted.
for i in 1 2 3 4 5; do
    kubectl -n "$ns" exec demo-2 -- eventfleet register --eventer 127.0.0.1:23012 \
        --token-file /var/run/secrets/eventfleet/token e2e/kind --json "{\"i\": $i}"
done

step "scale 3 -> 2: the StatefulSet follows only once demo-0 and demo-1 hold demo-2's events"
kubectl -n "$ns" scale eventserver/demo --replicas=2
for _ in $(seq 60); do
    [ "$(kubectl -n "$ns" get statefulset demo -o jsonpath='{.spec.replicas}')" = 2 ] && break
    sleep 5
done
[ "$(kubectl -n "$ns" get statefulset demo -o jsonpath='{.spec.replicas}')" = 2 ]
kubectl -n "$ns" get eventserver demo \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'
kubectl -n "$ns" wait --for=condition=Ready eventserver/demo --timeout "$timeout"
for pod in demo-0 demo-1; do
    held="$(kubectl -n "$ns" get --raw "/api/v1/namespaces/$ns/pods/$pod:23080/proxy/status")"
    echo "$pod: $held" | head -c 400; echo
    echo "$held" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert "3" in d["last_ids"], "no events of server 3"'
done

step "delete: children and (whenDeleted: Delete) volume claims go away"
kubectl -n "$ns" delete eventserver demo --timeout "$timeout"
kubectl -n "$ns" wait --for=delete pod -l app.kubernetes.io/instance=demo --timeout "$timeout" || true
left="$(kubectl -n "$ns" get statefulset,service,configmap,secret,pdb,pvc -l app.kubernetes.io/instance=demo -o name)"
[ -z "$left" ] || { echo "left behind: $left" >&2; exit 1; }

step "PASSED"
