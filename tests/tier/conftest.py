"""Tier locations for the tests: a local directory (`file://`) and an S3-compatible server (moto) on 127.0.0.1.

The S3 server is started once per test session by `s3_server`, on a free loopback port; every client is given its
endpoint, a region and dummy keys explicitly, and AWS_EC2_METADATA_DISABLED=true, so that nothing leaves the
machine. Each test gets a bucket prefix of its own (`tier_uri`), parametrised over both kinds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

S3_REGION = "us-east-1"
S3_BUCKET = "mqstore-tests"
S3_KEY = "testing"  # dummy credentials: moto accepts any


SERVER_PROGRAM = """
import logging, os, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
port = 0
for command in iter(sys.stdin.readline, ""):
    if command.strip() == "start":
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        port = server.get_host_and_port()[1]
        print(port, flush=True)
    elif command.strip() == "stop":
        server.stop()
        print("stopped", flush=True)
os._exit(0)  # standard input closed: the test session ended, or died
"""


class S3Server:
    """moto's S3 server on 127.0.0.1, in a process of its own (its requests do not wait for the test's threads,
    nor they for it): `uri(prefix)` is a tier URI naming its endpoint; stop() and start() cut it off and bring it
    back on the same port (the objects stay: the process keeps them)."""

    def __init__(self):
        self._process = subprocess.Popen([sys.executable, "-c", SERVER_PROGRAM], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True,
                                         env=dict(os.environ, AWS_EC2_METADATA_DISABLED="true"))
        self.host, self.port = "127.0.0.1", int(self._command("start"))
        self.running = True

    def _command(self, command: str) -> str:
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline().strip()
        if not answer:
            raise RuntimeError(f"the moto server process did not {command}: exit status {self._process.poll()}")
        return answer

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
        self._command("stop")
        self.running = False

    def start(self) -> None:
        self._command("start")
        self.running = True

    def close(self) -> None:
        """Stop the server and its process."""
        self._process.stdin.close()
        self._process.wait(30)
        self.running = False


@pytest.fixture(scope="session")
def s3_server():
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = S3Server()
    server.filesystem().create_dir(S3_BUCKET)
    yield server
    server.close()


@pytest.fixture(params=["file", "s3"])
def tier_uri(request, tmp_path) -> str:
    """A fresh, empty tier: a local directory, or a prefix of the test S3 server's bucket."""
    if request.param == "file":
        return (tmp_path / "tier").as_uri()
    server = request.getfixturevalue("s3_server")
    if not server.running:
        server.start()
    return server.uri(f"t-{uuid.uuid4().hex[:12]}")
