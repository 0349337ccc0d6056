"""Echo: the smallest protocol a replica can serve, the worked example of
docs/architecture.md, "Adding a protocol" (tests/integration/test_add_a_protocol.py
runs it in a real replica process).

A client sends lines over TCP; each line is registered as an event
``echo/<client name>`` (the line as JSON payload) and, once committed, echoed back as
``<instance> <line>``. Rooms, as in every protocol package: `schema.json` + `config`
(its section), `plugin` (the factory and the `ProtocolServer`). It has no wire codec,
session or engine adapter of its own: a protocol has the rooms it needs, named alike.
"""
