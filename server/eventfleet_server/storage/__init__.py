"""Event storage: one SQLite (aiosqlite, WAL) database per replica.

`eventfleet_server.storage.backend` owns the connections, threads and transactions;
`eventfleet_server.storage.schema` lists the tables (one module each), the schema
version and the migrations; `eventfleet_server.storage.queries` the Eventer queries.
"""

from eventfleet_server.storage.backend import (
    Retention,
    SbsResult,
    Storage,
    StorageStats,
)
from eventfleet_server.storage.errors import (
    CorruptStoreError,
    SchemaVersionError,
    StorageError,
    StorageFaultError,
)

__all__ = [
    "CorruptStoreError",
    "Retention",
    "SbsResult",
    "SchemaVersionError",
    "Storage",
    "StorageError",
    "StorageFaultError",
    "StorageStats",
]
