"""Bad input gives an error naming the path or option, the same words from the JVM reader ("commitlog") and the
Python source ("commitlog-python")."""

from __future__ import annotations

import pytest

SOURCES = ["commitlog", "commitlog-python"]


def load_error(spark, path, name="commitlog", **options) -> str:
    with pytest.raises(Exception) as caught:
        spark.read.format(name).options(**options).load(path).collect()
    return str(caught.value)


@pytest.mark.parametrize("name", SOURCES)
def test_bad_paths(spark, tmp_path, name):
    missing = tmp_path / "no-such-store"
    assert f"store path does not exist: {missing}" in load_error(spark, str(missing), name)
    (tmp_path / "plain").mkdir()
    assert f"not a RocketMQ store (no commitlog/ directory): {tmp_path / 'plain'}" in \
        load_error(spark, str(tmp_path / "plain"), name)
    (tmp_path / "file").write_text("x")
    assert "store path is not a directory" in load_error(spark, str(tmp_path / "file"), name)
    assert "no store matches the path pattern" in load_error(spark, str(tmp_path / "nothing-*"), name)
    assert "no store path" in load_error(spark, [], name)


@pytest.mark.parametrize("options, message", [
    ({"bogus": "1"}, "unknown option 'bogus'"),
    ({"queue_id": "one"}, "option 'queue_id' must be integers"),
    ({"start_offset": "-5"}, "option 'start_offset' must be >= 0"),
    ({"end_offset": "12x"}, "option 'end_offset' must be an integer"),
    ({"start_time": "yesterday"}, "option 'start_time' must be milliseconds since the epoch or an ISO-8601"),
    ({"topic": "a,,b"}, "option 'topic' has an empty name"),
    ({"maxRecordsPerTrigger": "0"}, "option 'maxRecordsPerTrigger' must be >= 1"),
    ({"startingOffsets": "sometime"}, "option 'startingOffsets' must be 'earliest' or 'latest'"),
])
@pytest.mark.parametrize("name", SOURCES)
def test_bad_options(spark, fixture_store, options, message, name):
    assert message in load_error(spark, str(fixture_store), name, **options)


@pytest.mark.parametrize("name", SOURCES)
def test_a_schema_other_than_the_source_schema_is_refused(spark, fixture_store, name):
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format(name).schema("topic string").load(str(fixture_store)).collect()


@pytest.mark.parametrize("name", SOURCES)
def test_stream_errors_name_the_option(spark, fixture_store, name):
    with pytest.raises(Exception, match="option 'maxBytesPerTrigger' must be an integer"):
        spark.readStream.format(name).option("maxBytesPerTrigger", "lots").load(str(fixture_store)).writeStream \
            .format("noop").start().awaitTermination(60)
