"""The project's four C extensions; everything else about the package is in pyproject.toml.

Here and not in pyproject.toml's ``[tool.setuptools] ext-modules``, which setuptools still
calls experimental (and says so on every install).

All four are hot loops of the replica (docs/decisions.md, "Four small C extensions"):

- ``bus/_zmqio.c``: the Event BUS's per-event ZeroMQ loops; without it the BUS falls
  back to pyzmq (the replica logs which it uses; tests/unit/test_bus_zmqio.py fails when
  it was not built).
- ``syncer/_rows.c``: the Syncer's walk of a received MsgEvents into merge rows; without
  it ``syncer/rows.py`` walks in Python, with the same result
  (tests/unit/test_syncer_rows_c.py fails when it was not built).
- ``eventer/_register.c``: the Eventer's decode of a one-slice MsgRegisterReq into
  events, and the splice of their stored bytes; without it ``eventer/wire.py`` walks,
  decodes and splices in Python, with the same result
  (tests/unit/test_eventer_register_c.py fails when it was not built).
- ``chatter/_frame.c``: the parse of each received chatter message and the head of each
  sent one; without it ``chatter/connection.py`` does both in Python, with the same
  messages and bytes (tests/unit/test_chatter_frame_c.py fails when it was not built).

The last three read untrusted SBS with the readers of ``common/sbs_read.h``; the last
two write SBS Integers with ``common/sbs_write.h`` (headers, listed in their
``depends`` so that a change to one rebuilds them).

Optional: a machine without a C compiler still installs. The server image compiles all four
(images/server.Dockerfile).
"""

from setuptools import Extension, setup

_SBS_READ = "server/eventfleet_server/common/sbs_read.h"
_SBS_WRITE = "server/eventfleet_server/common/sbs_write.h"

setup(
    ext_modules=[
        Extension(
            "eventfleet_server.bus._zmqio",
            sources=["server/eventfleet_server/bus/_zmqio.c"],
            optional=True,
        ),
        Extension(
            "eventfleet_server.syncer._rows",
            sources=["server/eventfleet_server/syncer/_rows.c"],
            depends=[_SBS_READ],
            optional=True,
        ),
        Extension(
            "eventfleet_server.eventer._register",
            sources=["server/eventfleet_server/eventer/_register.c"],
            depends=[_SBS_READ, _SBS_WRITE],
            optional=True,
        ),
        Extension(
            "eventfleet_server.chatter._frame",
            sources=["server/eventfleet_server/chatter/_frame.c"],
            depends=[_SBS_READ, _SBS_WRITE],
            optional=True,
        ),
    ]
)
