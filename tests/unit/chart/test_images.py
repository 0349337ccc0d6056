"""The Dockerfiles in images/ follow the project's image rules.

No Docker engine is available here, so the images cannot be built in CI; this parses each
Dockerfile (continuations, heredocs, ARG substitution in FROM, stages) and checks the
rules that matter once they run on Kubernetes: a non-root numeric user, multi-stage with
no build tooling in the final stage, a root filesystem that can be read-only, health
checks that match the server's endpoints, signal-friendly entry points, pinned bases.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest
import yaml

from tests.unit.chart.chartlib import REPO

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))

# Anything that compiles, fetches or installs packages. None of it belongs in an image
# that runs in production: it widens the attack surface and makes the image mutable.
BUILD_TOOLING = re.compile(
    r"\b(gcc|g\+\+|cc|make|cmake|build-essential|git|curl|wget|[\w.+-]+-dev"
    r"|pip3? install|uv (pip )?install|uv sync|apt-get install|apk add|ensurepip)\b"
)


@dataclasses.dataclass
class Instruction:
    keyword: str
    args: str
    comments: list[str]  # comment lines directly above, for "documented" checks
    heredoc: str = ""


@dataclasses.dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[list[str], dict[str, str], list[Stage]]:
    """Return (parser directives, global ARG defaults, stages)."""
    lines = text.splitlines()
    directives = []
    for line in lines:
        m = re.match(r"#\s*(\w+)=(.*)", line)
        if not m:
            break
        directives.append(f"{m[1].lower()}={m[2].strip()}")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    comments: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        # Join backslash continuations; comment lines inside a continuation are dropped,
        # as Docker does.
        while stripped.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                continue
            stripped = stripped[:-1].rstrip() + " " + nxt
        keyword, _, args = stripped.partition(" ")
        keyword = keyword.upper()
        heredoc = ""
        m = re.search(r"<<-?'?\"?(\w+)'?\"?", args)
        if m and keyword in ("RUN", "COPY"):
            end = m[1]
            body = []
            while i < len(lines) and lines[i].strip() != end:
                body.append(lines[i])
                i += 1
            i += 1
            heredoc = "\n".join(body)
        instr = Instruction(keyword, args.strip(), comments, heredoc)
        comments = []
        if keyword == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda mm: global_args.get(mm[1], mm[0]), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name, []))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede FROM, got {keyword}"
            key, _, default = args.partition("=")
            global_args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append(instr)
    return directives, global_args, stages


def _load(path):
    return parse(path.read_text())


def test_every_role_has_a_dockerfile():
    assert {p.name for p in DOCKERFILES} == {
        "server.Dockerfile",
        "operator.Dockerfile",
        "spark.Dockerfile",
    }


@pytest.fixture(params=DOCKERFILES, ids=lambda p: p.stem)
def dockerfile(request):
    return request.param


def test_multi_stage_with_a_final_stage_built_from_earlier_stages(dockerfile):
    _, _, stages = _load(dockerfile)
    assert len(stages) >= 2, "the build must happen in a separate stage"
    final = stages[-1]
    earlier = {s.name for s in stages[:-1]}
    copied_from = {
        re.match(r"--from=(\S+)", c.args)[1]
        for c in final.all("COPY")
        if c.args.startswith("--from=")
    }
    assert copied_from and copied_from <= earlier
    # The final stage takes the finished application from the build stage; it does not
    # copy sources from the build context.
    assert all(c.args.startswith("--from=") for c in final.all("COPY") + final.all("ADD"))


def test_no_build_tooling_in_the_final_stage(dockerfile):
    _, _, stages = _load(dockerfile)
    for run in stages[-1].all("RUN"):
        found = BUILD_TOOLING.search(run.args + "\n" + run.heredoc)
        assert not found, f"final stage runs build tooling: {found[0]!r} in {run.args!r}"


def test_runs_as_a_numeric_non_root_user(dockerfile):
    _, _, stages = _load(dockerfile)
    users = stages[-1].all("USER")
    assert users, "the final stage must set USER"
    uid = users[-1].args.split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can check it without the image's /etc/passwd.
    assert uid.isdigit() and int(uid) != 0, users[-1].args
    gid = users[-1].args.partition(":")[2]
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_bases_are_pinned_and_nothing_is_fetched_by_add(dockerfile):
    _, _, stages = _load(dockerfile)
    for stage in stages:
        if stage.base in {s.name for s in stages}:
            continue
        image, _, tag = stage.base.rpartition(":")
        assert image and tag and tag != "latest" and "/" not in tag, stage.base
        for add in stage.all("ADD"):
            assert "://" not in add.args, "ADD of a URL is not reproducible; fetch in RUN"


def test_read_only_root_filesystem_friendly(dockerfile):
    _, _, stages = _load(dockerfile)
    final = stages[-1]
    env = " ".join(e.args for e in final.all("ENV"))
    # Python must not try to write __pycache__ next to read-only sources.
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    for run in final.all("RUN"):
        assert "chmod 777" not in run.args and "chmod -R 777" not in run.args


def test_health_is_checked_or_the_absence_is_explained(dockerfile):
    _, _, stages = _load(dockerfile)
    (hc,) = stages[-1].all("HEALTHCHECK")
    if hc.args.upper() == "NONE":
        assert hc.comments, "HEALTHCHECK NONE needs a comment saying why"
        return
    assert "CMD" in hc.args and "/healthz" in hc.args


def test_entrypoint_is_exec_form(dockerfile):
    _, _, stages = _load(dockerfile)
    for kw in ("ENTRYPOINT", "CMD"):
        for instr in stages[-1].all(kw):
            # Shell form would put /bin/sh in front as PID 1, and SIGTERM would never
            # reach the process that has to flush and exit.
            assert isinstance(json.loads(instr.args), list), f"{kw} {instr.args}"


def test_server_image_matches_the_server_contract():
    _, _, stages = _load(IMAGES / "server.Dockerfile")
    final = stages[-1]
    exposed = {int(p.split("/")[0]) for e in final.all("EXPOSE") for p in e.args.split()}
    assert exposed == {23012, 23013, 23030, 23031, 23032, 23080}
    assert final.all("USER")[-1].args == "10001:10001"
    volumes = [json.loads(v.args) for v in final.all("VOLUME")]
    assert ["/var/lib/eventfleet"] in volumes
    (hc,) = final.all("HEALTHCHECK")
    assert "127.0.0.1:23080/healthz" in hc.args
    assert json.loads(final.all("ENTRYPOINT")[-1].args) == ["eventfleet"]
    assert json.loads(final.all("CMD")[-1].args) == [
        "server",
        "--config",
        "/etc/eventfleet/config.yaml",
    ]
    build = " ".join(r.args for r in stages[0].all("RUN"))
    # The backup extra (boto3): POST /backup and spec.bootstrap.fromBackup work in the image.
    assert '".[server,backup]"' in build


def test_operator_image_matches_the_chart():
    _, _, stages = _load(IMAGES / "operator.Dockerfile")
    final = stages[-1]
    values = yaml.safe_load((REPO / "charts" / "eventfleet-operator" / "values.yaml").read_text())
    uid = final.all("USER")[-1].args.split(":")[0]
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    port = values["operator"]["healthPort"]
    assert f"127.0.0.1:{port}/healthz" in final.all("HEALTHCHECK")[0].args
    assert '".[operator]"' in " ".join(r.args for r in stages[0].all("RUN"))


def test_spark_image_is_the_official_python_line_for_the_scheduled_spark_version():
    _, _, stages = _load(IMAGES / "spark.Dockerfile")
    crd = yaml.safe_load((REPO / "crds" / "eventfleet.io_eventservers.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    aggregation = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "aggregation"
    ]
    spark_version = aggregation["properties"]["sparkVersion"]["default"]
    final = stages[-1]
    assert final.base == f"spark:{spark_version}-scala2.13-java17-python3-ubuntu"
    env = " ".join(e.args for e in final.all("ENV"))
    assert "PYSPARK_PYTHON=/opt/eventfleet/venv/bin/python" in env
    # The main file the operator puts into the ScheduledSparkApplication is the job's
    # spark-submit file, copied in the build stage and carried over with /opt/eventfleet.
    build = stages[-2]
    assert "spark/aggregate.py /opt/eventfleet/aggregate.py" in [c.args for c in build.all("COPY")]
    assert (REPO / "spark" / "aggregate.py").exists()
    assert "--from=build /opt/eventfleet /opt/eventfleet" in [c.args for c in final.all("COPY")]
    # Only the image's own PySpark may be importable.
    runs = " ".join(r.args for r in build.all("RUN"))
    assert '".[spark]"' in runs and "uninstall" in runs and "pyspark" in runs


def test_heredocs_declare_a_dockerfile_syntax_that_supports_them(dockerfile):
    directives, _, stages = _load(dockerfile)
    if any(i.heredoc for s in stages for i in s.instructions):
        (syntax,) = [d for d in directives if d.startswith("syntax=")]
        m = re.search(r"dockerfile:(\d+)\.(\d+)", syntax)
        assert m and (int(m[1]), int(m[2])) >= (1, 4), syntax


def test_build_context_is_restricted_per_dockerfile(dockerfile):
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.exists(), f"{ignore.name} keeps .venv, .git and data out of the context"
    rules = [r for r in ignore.read_text().splitlines() if r and not r.startswith("#")]
    assert rules[0] == "*"
    # Every path the Dockerfile copies from the context is allowed back in.
    _, _, stages = _load(dockerfile)
    for stage in stages:
        for copy in stage.all("COPY"):
            if copy.args.startswith("--from") or copy.heredoc:
                continue
            for src in shlex.split(copy.args)[:-1]:
                allowed = [r[1:] for r in rules if r.startswith("!")]
                assert any(src == a or (a.endswith("/") and src.startswith(a)) for a in allowed), (
                    f"{src} is copied but excluded by {ignore.name}"
                )


def test_the_parser_sees_what_the_rules_look_for():
    # A deliberately bad Dockerfile: the checks above must be able to see each problem.
    bad = parse(
        "ARG BASE=python:latest\n"
        "FROM ${BASE}\n"
        "# comment\n"
        "RUN apt-get update \\\n"
        "    # a comment inside a continuation\n"
        " && apt-get install -y gcc\n"
        "COPY <<EOF /x.py\n"
        "print('hi')\n"
        "EOF\n"
        "USER root\n"
        "ENTRYPOINT eventfleet server\n"
    )
    _, args, (stage,) = bad
    assert args == {"BASE": "python:latest"}
    assert stage.base == "python:latest"
    (run,) = stage.all("RUN")
    assert BUILD_TOOLING.search(run.args)[0] in ("apt-get install", "gcc")
    assert stage.all("COPY")[0].heredoc == "print('hi')"
    assert stage.all("USER")[0].args == "root"
    with pytest.raises(json.JSONDecodeError):
        json.loads(stage.all("ENTRYPOINT")[0].args)
