"""Event storage: one SQLite (aiosqlite, WAL) database per replica.

See `eventfleet_server.storage.db` for threading and `eventfleet_server.storage.schema`
for tables, indexes and the SQL of every query.
"""

from eventfleet_server.storage.db import (
    CorruptStoreError,
    Retention,
    SchemaVersionError,
    Storage,
    StorageError,
    StorageStats,
)

__all__ = [
    "CorruptStoreError",
    "Retention",
    "SchemaVersionError",
    "Storage",
    "StorageError",
    "StorageStats",
]
