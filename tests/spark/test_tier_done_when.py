"""Issue 31's end to end, its Spark part: the demo's workload in a store with a tier, sealed, uploaded and removed
from local disk, is read back byte for byte by `spark.read.format("commitlog").load(<tier URI>)` from the bucket
alone (tests/tier/test_done_when.py does the API, the command line, scan() and RocketMQ)."""

from __future__ import annotations

import pytest

from tests.tier.conftest import (
    s3_server,  # noqa: F401 - the fixture, used through tier_uri
    tier_uri,  # noqa: F401 - a fixture, parametrised over file:// and S3
)
from tests.tier.test_done_when import MESSAGES, expected_messages, offloaded  # noqa: F401 - a fixture

# about a minute over its two tiers: `make test-long` (CI runs it after `make test`)
pytestmark = pytest.mark.long


def test_spark_reads_every_message_from_the_bucket_alone(spark, jvm_reader, offloaded):  # noqa: F811
    _, uri, _, _ = offloaded
    table = spark.read.format("commitlog").load(uri).select("topic", "queue_id", "queue_offset", "body", "tags",
                                                             "keys").toArrow()
    assert table.num_rows == MESSAGES
    rows = sorted(table.to_pylist(), key=lambda row: (row["topic"], row["queue_id"], row["queue_offset"]))
    expected = expected_messages()
    wanted = [message for key in sorted(expected) for message in expected[key]]
    assert [(r["topic"], r["queue_id"], bytes(r["body"]), r["tags"], tuple(r["keys"])) for r in rows] == \
        [(m.topic, m.queue_id, m.body, m.tags, tuple(m.keys)) for m in wanted]
