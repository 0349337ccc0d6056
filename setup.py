"""The project's one C extension; everything else about the package is in pyproject.toml.

Here and not in pyproject.toml's ``[tool.setuptools] ext-modules``, which setuptools still
calls experimental (and says so on every install).

``bus/_drain.c`` is the Event BUS collector's reader (docs/decisions.md, "One C
extension"). Optional: a machine without a C compiler still installs, and the collector
falls back to pyzmq (the replica logs which reader it uses;
tests/unit/test_bus_drain.py fails when it was not built). The server image compiles it
(images/server.Dockerfile).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "eventfleet_server.bus._drain",
            sources=["server/eventfleet_server/bus/_drain.c"],
            optional=True,
        )
    ]
)
