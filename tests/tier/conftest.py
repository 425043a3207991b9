"""Tier locations for the tests: a local directory (`file://`) and an S3-compatible server (moto) on 127.0.0.1.

The S3 server is started once per test session by `s3_server`, on a free loopback port; every client is given its
endpoint, a region and dummy keys explicitly, and AWS_EC2_METADATA_DISABLED=true, so that nothing leaves the
machine. Each test gets a bucket prefix of its own (`tier_uri`), parametrised over both kinds.
"""

from __future__ import annotations

import logging
import os
import uuid

import pytest

S3_REGION = "us-east-1"
S3_BUCKET = "mqstore-tests"
S3_KEY = "testing"  # dummy credentials: moto accepts any


class S3Server:
    """moto's S3 server on 127.0.0.1: `uri(prefix)` is a tier URI naming its endpoint; stop() and start() cut it
    off and bring it back on the same port (the objects stay)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto logs every request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.running = True

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, prefix: str) -> str:
        return (f"s3://{S3_KEY}:{S3_KEY}@{S3_BUCKET}/{prefix}?endpoint_override={self.endpoint}&scheme=http"
                f"&region={S3_REGION}")

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=S3_KEY, secret_key=S3_KEY, region=S3_REGION, scheme="http",
                                 endpoint_override=self.endpoint, allow_bucket_creation=True)

    def stop(self) -> None:
        self._server.stop()
        self.running = False

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.running = True


@pytest.fixture(scope="session")
def s3_server():
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = S3Server()
    server.filesystem().create_dir(S3_BUCKET)
    yield server
    if server.running:
        server.stop()


@pytest.fixture(params=["file", "s3"])
def tier_uri(request, tmp_path) -> str:
    """A fresh, empty tier: a local directory, or a prefix of the test S3 server's bucket."""
    if request.param == "file":
        return (tmp_path / "tier").as_uri()
    server = request.getfixturevalue("s3_server")
    if not server.running:
        server.start()
    return server.uri(f"t-{uuid.uuid4().hex[:12]}")
