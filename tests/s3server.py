"""A real S3-compatible server for tests: moto in server mode on 127.0.0.1 (or on the
address given, e.g. the single-node cluster's bridge so that pods reach it).

Not a mocked client: the code under test speaks HTTP (boto3, signed requests) to
moto's S3 implementation listening on a free loopback port, exactly as it would to
MinIO or AWS. `running_s3()` starts it (in a thread of the test process), creates the
bucket and stops it afterwards. moto accepts any credentials; tests still pass them
through the files or variables the product reads, so that path is exercised.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

ACCESS_KEY = "eventfleet-test-key"
SECRET_KEY = "eventfleet-test-secret"  # moto accepts any pair


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str

    def client(self):
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def keys(self, prefix: str = "") -> list[str]:
        listing = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in listing.get("Contents", []))


@contextlib.contextmanager
def running_s3(bucket: str = "eventfleet-backups", host: str = "127.0.0.1") -> Iterator[S3Server]:
    """moto's S3 server on a free port of ``host`` with `bucket` created. The e2e tests on
    the real cluster pass its bridge address (198.18.0.1, reserved for benchmark testing):
    pods reach the node there, and nothing listens on a private range."""
    from moto.server import ThreadedMotoServer

    from e2e.ports import free_port  # below the ephemeral range, never handed out twice

    port = free_port()
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    try:
        s3 = S3Server(f"http://{host}:{port}", bucket)
        # moto keeps its backends in process-wide state: a server started after another
        # in the same test process would see the earlier buckets and objects.
        reset = urllib.request.Request(f"{s3.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(reset, timeout=10):
            pass
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()
