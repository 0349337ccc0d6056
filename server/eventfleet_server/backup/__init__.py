"""Backups of the store to S3-compatible object storage, and restores from them.

`eventfleet_server.backup.s3` talks to the object store (boto3, imported on first use:
the ``backup`` extra); `eventfleet_server.backup.restore` is the start-up restore of an
empty replica; the HTTP route that takes a backup is `eventfleet_server.http.backup`.
The consistent copy and its digest come from `eventfleet_server.storage.snapshot`.
docs/backup.md describes the whole feature.
"""

from eventfleet_server.backup.s3 import BackupError, Location, RestoreSource, Target

__all__ = ["BackupError", "Location", "RestoreSource", "Target"]
