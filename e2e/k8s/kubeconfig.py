"""A kubeconfig for a plain-HTTP API endpoint on loopback (the emulator)."""

from __future__ import annotations

import os
import pathlib

import yaml


def write_kubeconfig(
    path: str | os.PathLike[str], server: str, *, namespace: str = "default"
) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "emulator", "user": {"token": "emulator-has-no-auth"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    target = pathlib.Path(path)
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target
