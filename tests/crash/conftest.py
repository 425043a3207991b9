"""The crash tests' fixtures: the S3 server on 127.0.0.1 of tests/tier (for kills during uploads to a tier)."""

from tests.tier.conftest import s3_server  # noqa: F401 - a fixture, used by name
