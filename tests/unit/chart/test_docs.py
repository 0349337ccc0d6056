"""The user docs stay true: links resolve, examples parse and match the chart and the CRD."""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml

from tests.unit.chart.chartlib import (
    CHART,
    REPO,
    crd_version_schema,
    one,
    render,
    structural_to_jsonschema,
)

DOCS = REPO / "docs"
# The docs this suite owns; other docs are checked by their owners' tests.
OWN_DOCS = [
    DOCS / name
    for name in (
        "README.md",
        "quickstart.md",
        "architecture.md",
        "runbook.md",
        "helm-chart.md",
        "images.md",
        "hat.md",
    )
] + [CHART / "README.md"]

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.strip().lower().replace("`", "")
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


def _anchors(path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


@pytest.mark.parametrize("doc", OWN_DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(doc):
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: link to missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc.name}: no heading for #{anchor} in {path}"


def _blocks(doc, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", doc.read_text(), re.S)


@pytest.mark.parametrize("doc", OWN_DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_yaml_examples_parse(doc):
    for block in _blocks(doc, "yaml"):
        list(yaml.safe_load_all(block))


def test_quickstart_eventserver_is_valid_against_the_crd():
    crd = yaml.safe_load((REPO / "crds" / "eventfleet.io_eventservers.yaml").read_text())
    docs = [
        d
        for block in _blocks(DOCS / "quickstart.md", "yaml")
        for d in yaml.safe_load_all(block)
        if isinstance(d, dict) and d.get("kind") == "EventServer"
    ]
    assert docs, "the quick start shows no EventServer"
    for doc in docs:
        version = doc["apiVersion"].split("/")[1]
        jsonschema.validate(doc, structural_to_jsonschema(crd_version_schema(crd, version)))


def test_documented_release_gives_the_documented_deployment_name(tmp_path):
    """`helm install NAME` in the docs and `deployment/...` in the docs agree."""
    text = "\n".join(p.read_text() for p in OWN_DOCS)
    install = r"helm (?:install|upgrade) ([a-z0-9-]+) charts/eventfleet-operator"
    releases = set(re.findall(install, text))
    assert len(releases) == 1, f"the docs use several release names: {releases}"
    (release,) = releases
    deployments = set(re.findall(r"-n eventfleet-system [a-z ]*deployment/([a-z0-9-]+)", text))
    deployments |= set(re.findall(r"deployment/([a-z0-9-]+)\n", text))
    deployment = one(render(tmp_path, release=release), "Deployment")
    assert deployments == {deployment["metadata"]["name"]}


def test_every_repository_path_mentioned_exists():
    """Scripts and files named in the docs, the chart and the Dockerfiles are real."""
    sources = [*OWN_DOCS, *CHART.rglob("*.yaml"), *CHART.rglob("*.tpl")]
    sources += [*(REPO / "images").glob("*.Dockerfile")]
    pattern = re.compile(r"(?<![\w./-])((?:scripts|e2e|crds|operator/deploy|images)/[\w./-]*\w)")
    missing = set()
    for path in sources:
        for ref in pattern.findall(path.read_text()):
            if "*" in ref or not (REPO / ref).exists():
                missing.add(f"{path.relative_to(REPO)}: {ref}")
    assert missing == set()


def _table_names(text: str) -> set[str]:
    """The backquoted names that open a row of a Markdown table."""
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", text, re.M))


def test_reference_tables_name_every_condition_and_phase():
    """A condition or phase the operator writes is explained where users look it up."""
    from eventfleet_operator.constants import ConditionType, Phase

    conditions = {c.value for c in ConditionType}
    for doc in (DOCS / "runbook.md", DOCS / "operator.md"):
        missing = conditions - _table_names(doc.read_text())
        assert missing == set(), f"{doc.name}: no table row for the conditions {missing}"
    crd = yaml.safe_load((REPO / "crds" / "eventfleet.io_eventservers.yaml").read_text())
    status = crd_version_schema(crd, "v1")["properties"]["status"]["properties"]
    runbook = (DOCS / "runbook.md").read_text()
    (runbook_phases,) = re.findall(r"^`phase` \(([^)]*)\)", runbook, re.M)
    for where, text in (
        ("CRD status.phase", status["phase"]["description"]),
        ("runbook", runbook_phases),
    ):
        missing = [p.value for p in Phase if p.value not in text]
        assert missing == [], f"{where} does not name the phases {missing}"


@pytest.mark.parametrize("page", ["replication.md", "jetstream.md"])
def test_documented_http_from_admits_websocket_clients(page):
    """The NetworkPolicy example where websocket users look is a valid EventServer, and
    the policy the operator builds from it admits those sources to the HTTP port."""
    from eventfleet_operator import builders, model

    crd = yaml.safe_load((REPO / "crds" / "eventfleet.io_eventservers.yaml").read_text())
    (doc,) = [
        d
        for block in _blocks(DOCS / page, "yaml")
        for d in yaml.safe_load_all(block)
        if isinstance(d, dict) and "networkPolicy" in (d.get("spec") or {})
    ]
    jsonschema.validate(doc, structural_to_jsonschema(crd_version_schema(crd, "v1")))
    sources = doc["spec"]["networkPolicy"]["http"]["from"]
    spec = model.parse("events", "prod", doc["spec"], uid="u")
    policy = builders.network_policy(spec, {"podSelector": {"matchLabels": {"app": "op"}}})
    http_port = spec.ports.http
    (http_rule,) = [
        r for r in policy["spec"]["ingress"] if {"protocol": "TCP", "port": http_port} in r["ports"]
    ]
    assert all(source in http_rule["from"] for source in sources)


def test_chart_readme_quick_install_puts_the_fleet_where_the_operator_watches(tmp_path):
    """Installed without watch settings, the operator watches only its release
    namespace: the example must be applied (and waited for) there."""
    # The first install block is the quick install (later ones install the package).
    block = next(b for b in _blocks(CHART / "README.md", "sh") if "helm install" in b)
    lines = [line for line in block.splitlines() if line.strip()]
    (install,) = [line for line in lines if line.startswith("helm install")]
    release_ns = re.search(r"(?:-n|--namespace)[ =](\S+)", install).group(1)
    assert "watchNamespaces" not in install and "allNamespaces" not in install
    # What the chart renders for that install: the operator's --namespace argument.
    docs = render(tmp_path, namespace=release_ns, release="eventfleet-operator")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    watched = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--namespace=")]
    assert watched == [release_ns], container["args"]
    for line in lines:
        if line.startswith(("kubectl apply", "kubectl wait")):
            assert re.search(rf"(?:-n|--namespace)[ =]{re.escape(release_ns)}\b", line), line
