"""The vendored upstream CRDs are byte-identical to the recorded upstream files."""

from __future__ import annotations

import hashlib
import re

import op_k8s_schema as k8s_schema


def test_vendored_crds_match_their_recorded_sha256():
    sources = (k8s_schema.EXTERNAL / "SOURCES.md").read_text()
    rows = re.findall(r"^\| `([^`]+\.yaml)` \|.*\| `([0-9a-f]{64})` \|$", sources, re.M)
    assert len(rows) == 4
    for name, digest in rows:
        assert hashlib.sha256((k8s_schema.EXTERNAL / name).read_bytes()).hexdigest() == digest, name
