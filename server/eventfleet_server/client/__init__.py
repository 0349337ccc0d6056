"""Clients of the replica's protocols, importable without the server.

Nothing here imports the engine, storage or a protocol's server side (so not aiosqlite
either): the Spark job and the CLI use these clients in processes that never run a
replica. An import-linter contract and tests/unit/test_spark_imports.py check it.
"""
