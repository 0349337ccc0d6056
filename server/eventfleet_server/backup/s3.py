"""S3-compatible object storage through boto3, run in worker threads by the callers.

Credentials come from the files the configuration names, else from boto3's own chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ...). They are never logged and never
part of an error message: errors name the endpoint, bucket and key only.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.common.secretfile import SecretFileError, read_secret_file

INSTALL_HINT = "S3 backups need boto3: pip install 'eventfleet[backup]'"
# Metadata values are strings (x-amz-meta-*); keys in lower case, as S3 returns them.
META_SHA256 = "sha256"


class BackupError(Exception):
    """A backup or restore step failed; the message names what (never a credential)."""


@dataclass(frozen=True)
class Location:
    """Where the object store is and how to sign for it."""

    bucket: str
    endpoint_url: str | None = None
    region: str = "us-east-1"
    addressing_style: str = "path"
    access_key_id_file: str | None = None
    secret_access_key_file: str | None = None

    @classmethod
    def _fields(cls, section: Mapping[str, Any]) -> dict:
        return {
            "bucket": section["bucket"],
            "endpoint_url": section.get("endpoint_url"),
            "region": section.get("region") or "us-east-1",
            "addressing_style": section.get("addressing_style") or "path",
            "access_key_id_file": section.get("access_key_id_file"),
            "secret_access_key_file": section.get("secret_access_key_file"),
        }

    def describe(self, key: str | None = None) -> str:
        """``s3://bucket/key at endpoint`` for messages."""
        where = f"s3://{self.bucket}/{key or ''}"
        return f"{where} at {self.endpoint_url}" if self.endpoint_url else where


@dataclass(frozen=True)
class Target(Location):
    """``backup.target``: where copies go."""

    prefix: str = ""

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> Target | None:
        if not section:
            return None
        return cls(**cls._fields(section), prefix=section.get("prefix") or "")

    def key(self, name: str) -> str:
        prefix = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        return f"{prefix}{name}.sqlite"


@dataclass(frozen=True)
class RestoreSource(Location):
    """``backup.restore_from``: the copy a new replica starts from."""

    key: str = ""
    sha256: str | None = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> RestoreSource | None:
        if not section:
            return None
        return cls(**cls._fields(section), key=section["key"], sha256=section.get("sha256"))


def _read_secret(path: str, what: str) -> str:
    try:
        return read_secret_file(path, what)
    except SecretFileError as e:
        raise BackupError(str(e)) from None


def client(location: Location) -> Any:
    """A boto3 S3 client for `location` (blocking calls: use it from a worker thread)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise BackupError(INSTALL_HINT) from None
    kwargs: dict[str, Any] = {}
    if location.access_key_id_file or location.secret_access_key_file:
        if not (location.access_key_id_file and location.secret_access_key_file):
            raise BackupError("access_key_id_file and secret_access_key_file must be set together")
        kwargs["aws_access_key_id"] = _read_secret(
            location.access_key_id_file, "access_key_id_file"
        )
        kwargs["aws_secret_access_key"] = _read_secret(
            location.secret_access_key_file, "secret_access_key_file"
        )
    # A session of its own: boto3's default session is shared, module-global state.
    return boto3.session.Session().client(
        "s3",
        endpoint_url=location.endpoint_url,
        region_name=location.region,
        config=Config(
            connect_timeout=10,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": location.addressing_style},
        ),
        **kwargs,
    )


def _error(action: str, location: Location, key: str, e: Exception) -> BackupError:
    # botocore's messages name the operation and the S3 error code, never the keys.
    return BackupError(f"{action} {location.describe(key)} failed: {e}")


def upload(location: Location, key: str, path: pathlib.Path, metadata: Mapping[str, str]) -> None:
    """Upload file `path` as `key` with user `metadata` (multipart for large files)."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = client(location)
    try:
        s3.upload_file(str(path), location.bucket, key, ExtraArgs={"Metadata": dict(metadata)})
    except (BotoCoreError, ClientError, OSError) as e:
        raise _error("upload to", location, key, e) from None
    except Exception as e:  # boto3's S3UploadFailedError and friends
        raise _error("upload to", location, key, e) from None


def download(location: Location, key: str, dest: pathlib.Path) -> dict[str, str]:
    """Download `key` to `dest`; returns the object's user metadata."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = client(location)
    try:
        head = s3.head_object(Bucket=location.bucket, Key=key)
        s3.download_file(location.bucket, key, str(dest))
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchKey", "NotFound"):
            raise BackupError(f"{location.describe(key)}: no such object") from None
        raise _error("download of", location, key, e) from None
    except (BotoCoreError, OSError) as e:
        raise _error("download of", location, key, e) from None
    return {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}


def delete(location: Location, key: str) -> None:
    """Delete `key` (deleting a missing object is not an error in S3)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client(location).delete_object(Bucket=location.bucket, Key=key)
    except (BotoCoreError, ClientError) as e:
        raise _error("delete of", location, key, e) from None
