"""The project's one C extension; everything else about the package is in pyproject.toml.

Here and not in pyproject.toml's ``[tool.setuptools] ext-modules``, which setuptools still
calls experimental (and says so on every install).

``bus/_zmqio.c`` holds the Event BUS's per-event ZeroMQ loops (docs/decisions.md, "One C
extension"). Optional: a machine without a C compiler still installs, and the BUS
falls back to pyzmq (the replica logs which it uses;
tests/unit/test_bus_zmqio.py fails when it was not built). The server image compiles it
(images/server.Dockerfile).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "eventfleet_server.bus._zmqio",
            sources=["server/eventfleet_server/bus/_zmqio.c"],
            optional=True,
        )
    ]
)
