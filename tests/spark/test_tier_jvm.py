"""The JVM reader reads a store from its tier: spark.read.format("commitlog").load(<tier URI>) gives the rows the
local store's scan gives below the tier's end, for a file:// tier and an S3 tier on moto's server (loopback), with
every check on the bytes the local read makes (errors naming the object), refusing a manifest that breaks
manifest.py's validity rule as manifest.py refuses it; its SigV4 signer agrees with AWS's published test vectors
and with botocore. The store is written by MessageStore with a tier (tests/tier/test_uploader.py's helpers)."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import urllib.parse
import uuid

import pytest

from mqstore import MessageStore
from mqstore.store.scan import scan_store
from mqstore.tier import manifest as manifest_module
from mqstore.tier.location import TierLocation, crc32
from mqstore.tier.manifest import MANIFEST_KEYS, segment_key
from tests.conftest import wait_until
from tests.spark.test_scan_parity import rows_by_offset
from tests.tier.conftest import S3_BUCKET, S3_REGION, S3Server
from tests.tier.test_uploader import put_messages, tier_config

SEGMENT = 128 * 1024  # three sealed segments; a read of one is cut in two partitions
MESSAGES = 1500
SECRET = "s3cr3t-Never-Shown"  # moto takes any key pair: this one must appear in no message
JVM_ERROR = re.compile(r"\[rule ([\w.-]+)\] \(file (\S+), offset (\d+)\)")


@pytest.fixture(scope="module")
def s3_server():
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = S3Server()
    server.filesystem().create_dir(S3_BUCKET)
    yield server
    server.close()


def s3_uri(server, prefix: str, secret: str = SECRET) -> str:
    return (f"s3://mqstore:{urllib.parse.quote(secret, safe='')}@{S3_BUCKET}/{prefix}"
            f"?endpoint_override={server.endpoint}&scheme=http&region={S3_REGION}")


class Tiered:
    """A store MessageStore wrote with a tier, closed: its root, its tier's URI and end."""

    def __init__(self, root, uri: str):
        self.root = root
        self.uri = uri
        self.location = TierLocation.open(uri)
        self.manifest = manifest_module.load(self.location)
        self.end = self.manifest.end

    def expected(self, **filters) -> list[dict]:
        """What the local store's scan gives below the tier's end."""
        end = min(self.end, filters.pop("end_offset", self.end))
        return rows_by_offset(scan_store(self.root, end_offset=end, **filters).read_all())


def write_tiered(root, uri: str) -> Tiered:
    with MessageStore.open(root, tier_config(uri, segment_size_bytes=SEGMENT)) as store:
        put_messages(store, random.Random(41), MESSAGES)
        written = store.stats()["commitlog"]["max_offset"]
        sealed = written - written % SEGMENT
        assert wait_until(lambda: (store.stats()["tier"]["uploaded_end"] or 0) >= sealed), store.stats()["tier"]
    tiered = Tiered(root, uri)
    assert tiered.end == sealed >= 3 * SEGMENT and written > sealed  # the local store goes on past the tier
    return tiered


@pytest.fixture(scope="module", params=["file", "s3"])
def tiered(request, tmp_path_factory) -> Tiered:
    base = tmp_path_factory.mktemp(f"tiered-{request.param}")
    if request.param == "file":
        uri = (base / "tier").as_uri()
    else:
        uri = s3_uri(request.getfixturevalue("s3_server"), f"jvm-{uuid.uuid4().hex[:8]}")
    return write_tiered(base / "store", uri)


def read_rows(spark, uri: str, **options) -> list[dict]:
    return rows_by_offset(spark.read.format("commitlog").options(**options).load(uri).toArrow())


def outcome(spark, uri: str, **options) -> tuple:
    """("ok",) or the (rule, file, offset) the JVM reader's error names; its text never holds the secret."""
    try:
        spark.read.format("commitlog").options(**options).load(uri).toArrow()
    except Exception as exc:  # noqa: BLE001 - compared as a value
        assert SECRET not in str(exc)
        found = JVM_ERROR.search(str(exc))
        assert found is not None, str(exc)[-3000:]
        return found.group(1), found.group(2), int(found.group(3))
    return ("ok",)


def copy_tier(tiered: Tiered, tmp_path) -> tuple[str, TierLocation]:
    """A copy of the tier's objects (to damage), at a new location of the same kind."""
    if tiered.uri.startswith("file:"):
        target = tmp_path / "tier-copy"
        shutil.copytree(tiered.location.root, target)
        uri = target.as_uri()
    else:
        prefix = f"copy-{uuid.uuid4().hex[:8]}"
        filesystem = tiered.location.filesystem
        for info in tiered.location.list():
            filesystem.copy_file(tiered.location.path(info.key), f"{S3_BUCKET}/{prefix}/{info.key}")
        uri = tiered.uri.replace(tiered.location.root.split("/", 1)[1], prefix, 1)
    return uri, TierLocation.open(uri)


# --- the rows -------------------------------------------------------------------------------------------------
def test_a_tier_gives_the_rows_of_the_local_store_below_its_end(spark, jvm_reader, tiered):
    expected = tiered.expected()
    assert len(expected) > 1000 and read_rows(spark, tiered.uri) == expected


@pytest.mark.parametrize("filters", [
    {"topic": "orders"}, {"topic": "audit,%RETRY%group", "queue_id": "1"}, {"queue_id": "0,2"},
    {"start_offset": str(SEGMENT + 1000), "end_offset": str(2 * SEGMENT + 5000)}], ids=str)
def test_filters_give_the_rows_of_the_local_scan(spark, jvm_reader, tiered, filters):
    """The reader's options, and the same filters given to scan_store (queue_id there is queue_ids)."""
    typed = {}
    for name, value in filters.items():
        if name == "queue_id":
            typed["queue_ids"] = [int(v) for v in value.split(",")]
        else:
            typed[name] = value.split(",") if name == "topic" else int(value)
    assert read_rows(spark, tiered.uri, **filters) == tiered.expected(**typed)


def test_a_time_filter_gives_the_rows_of_the_local_scan(spark, jvm_reader, tiered):
    everything = tiered.expected()
    middle = everything[len(everything) // 2]["store_timestamp"]
    start = middle.isoformat()
    got = read_rows(spark, tiered.uri, start_time=start)
    assert got == tiered.expected(start_time=middle) and 0 < len(got) < len(everything)


def test_a_read_of_one_segment_is_cut_at_a_record_start(spark, jvm_reader, tiered):
    """A piece longer than 1.5 partitions is cut where a record starts, found by range reads of the object."""
    frame = spark.read.format("commitlog").option("end_offset", str(SEGMENT)).load(tiered.uri)
    assert frame.rdd.getNumPartitions() == 2
    assert rows_by_offset(frame.toArrow()) == tiered.expected(end_offset=SEGMENT)


def test_columns_and_the_store_label_of_several_tiers(spark, jvm_reader, tiered, tmp_path):
    """Two loads of the same tier are one store; with a local store beside it, rows carry the tier's shown URI."""
    frame = (spark.read.format("commitlog").option("paths", json.dumps([tiered.uri, str(tiered.root)]))
             .load().select("store", "commitlog_offset", "topic", "body"))
    rows = frame.toArrow().to_pylist()
    shown = tiered.location.display("").rstrip("/")
    assert {row["store"] for row in rows} == {shown, str(tiered.root)}
    assert SECRET not in shown and "?" not in shown
    from_tier = sorted((r["commitlog_offset"], r["topic"], r["body"]) for r in rows if r["store"] == shown)
    assert from_tier == [(r["commitlog_offset"], r["topic"], r["body"]) for r in tiered.expected()]


@pytest.mark.parametrize("tiered", ["file"], indirect=True)
def test_hadoops_filesystem_reads_a_file_tier(spark, jvm_reader, tiered):
    """tier.io=hadoop: the objects through Hadoop's LocalFileSystem, positioned reads; the same rows."""
    assert read_rows(spark, tiered.uri, **{"tier.io": "hadoop"}) == tiered.expected()


@pytest.mark.parametrize("tiered", ["s3"], indirect=True)
def test_s3_settings_from_the_options(spark, jvm_reader, tiered):
    """The URI names only the bucket and prefix; the endpoint, region and keys come from the reader's options."""
    parts = urllib.parse.urlsplit(tiered.uri)
    bare = f"s3://{parts.hostname}{parts.path}"
    query = dict(urllib.parse.parse_qsl(parts.query))
    options = {"s3.endpoint": query["endpoint_override"], "s3.scheme": "http", "s3.region": S3_REGION,
               "s3.accessKey": "mqstore", "s3.secretKey": SECRET}
    assert read_rows(spark, bare, **options) == tiered.expected()


# --- damage ---------------------------------------------------------------------------------------------------
def put_object(location: TierLocation, key: str, data: bytes) -> None:
    if location.filesystem.type_name == "local":
        with open(location.path(key), "wb") as handle:
            handle.write(data)
    else:
        location.put_bytes(key, data)


def local_outcome(root) -> tuple:
    from mqstore.commitlog.errors import CorruptionError

    try:
        scan_store(root).read_all()
    except CorruptionError as exc:
        return exc.rule, exc.path, exc.offset
    return ("ok",)


@pytest.mark.parametrize("damage", ["magic", "body_length", "physical_offset"])
def test_a_damaged_object_gives_the_local_readers_error_naming_the_object(spark, jvm_reader, tiered, tmp_path,
                                                                         damage):
    uri, location = copy_tier(tiered, tmp_path)
    local = tmp_path / "local"
    shutil.copytree(tiered.root, local)
    base = SEGMENT  # the second segment
    record = tiered.expected(start_offset=base + 20_000)[0]
    at = record["commitlog_offset"] - base
    field = {"magic": 4, "physical_offset": 28 + 7, "body_length": None}[damage]
    data = bytearray(location.read_range(segment_key(base), SEGMENT, 0, SEGMENT))
    if field is None:  # BODYLENGTH: after the fixed fields of a v1 IPv4 record
        field = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8
    data[at + field] ^= 0x40
    put_object(location, segment_key(base), bytes(data))
    with open(local / "commitlog" / f"{base:020d}", "r+b") as handle:
        handle.seek(at + field)
        handle.write(bytes([data[at + field]]))
    rule, path, offset = local_outcome(local)
    assert path == str(local / "commitlog" / f"{base:020d}") and offset == at
    assert outcome(spark, uri) == (rule, location.display(segment_key(base)), offset)


def test_an_object_shorter_than_listed_or_missing_is_refused(spark, jvm_reader, tiered, tmp_path):
    uri, location = copy_tier(tiered, tmp_path)
    key = segment_key(2 * SEGMENT)
    data = location.read_range(key, SEGMENT, 0, SEGMENT)
    put_object(location, key, data[:SEGMENT - 1000])
    rule, path, offset = outcome(spark, uri)
    assert (rule, path) == ("tier.object-size", location.display(key)) and offset <= SEGMENT - 1000
    location.delete(key)
    assert outcome(spark, uri)[:2] == ("tier.object-missing", location.display(key))


def manifest_variants(document: dict) -> dict[str, bytes]:
    """Manifests that break manifest.py's validity rule, one way each."""
    def changed(**fields) -> bytes:
        return json.dumps({**document, **fields}).encode()

    segments = document["segments"]
    queues = document["queues"]
    return {
        "not JSON": b"{\"format\": \"mqstore-tier\",",
        "trailing bytes": json.dumps(document).encode() + b" []",
        "a list": b"[]",
        "version 2": changed(version=2),
        "a float": changed(generation=1.5),
        "a negative offset": changed(segments=[[-SEGMENT, 0]] + segments),
        "not contiguous": changed(segments=[segments[0], segments[2]]),
        "a base off the grid": changed(segments=[[SEGMENT + 1, 0]]),
        "a CRC past 32 bits": changed(segments=[[0, 1 << 32]]),
        "a bad topic": changed(queues={"bad topic": next(iter(queues.values()))}),
        "too many entries": changed(queues={t: {q: [[f[0], 10 ** 9, f[2]] for f in files] for q, files in ids.items()}
                                            for t, ids in queues.items()}),
        "an index name": changed(index=[["123", 1, 0, 0]]),
        "segment size": changed(store={**document["store"], "segment_size_bytes": 100}),
    }


def slot(document: bytes) -> bytes:
    """`document` in a manifest slot's CRC-checked wrapper (manifest.py's slot_bytes, for any bytes)."""
    return b'{"manifest":' + document + b',"crc32":"%08x"}' % crc32(document)


def test_a_bad_manifest_is_refused_as_manifest_py_refuses_it(spark, jvm_reader, tiered, tmp_path):
    from mqstore.commitlog.errors import CorruptionError

    uri, location = copy_tier(tiered, tmp_path)
    newest = manifest_module.load(location)
    for listed in MANIFEST_KEYS:
        location.delete(listed)
    key = MANIFEST_KEYS[0]  # one slot, not generation 1's (alone and spoiled, that is a torn first write: no tier)
    document = json.loads(newest.to_json())
    variants = {name: slot(raw) for name, raw in manifest_variants(document).items()}
    variants["torn"] = slot(json.dumps(document).encode())[:-7]
    variants["a flipped byte"] = slot(json.dumps(document).encode()).replace(b'"version"', b'"versioN"')
    for name, raw in variants.items():
        with pytest.raises(CorruptionError) as python:
            manifest_module.parse_slot(raw, location.display(key))
        assert python.value.rule == "tier.manifest", name
        put_object(location, key, raw)
        assert outcome(spark, uri) == ("tier.manifest", location.display(key), 0), name
    location.delete(key)
    put_object(location, MANIFEST_KEYS[newest.generation % 2], manifest_module.slot_bytes(newest))
    assert read_rows(spark, uri) == tiered.expected()  # the copy itself was sound


def test_a_torn_newest_slot_is_passed_over_for_the_other(spark, jvm_reader, tiered, tmp_path):
    uri, location = copy_tier(tiered, tmp_path)
    newest = manifest_module.load(location)
    older = manifest_module.Manifest(store=newest.store, generation=newest.generation + 1, written_ms=1,
                                     segments=newest.segments[:1])
    put_object(location, MANIFEST_KEYS[older.generation % 2], manifest_module.slot_bytes(older))
    assert read_rows(spark, uri) == tiered.expected(end_offset=manifest_module.load(location).end)  # the newer one wins
    whole = manifest_module.slot_bytes(older)
    put_object(location, MANIFEST_KEYS[older.generation % 2], whole[: len(whole) // 2])  # torn: the other is read
    assert read_rows(spark, uri) == tiered.expected()


def test_a_location_without_a_manifest_or_a_stream_is_refused(spark, jvm_reader, tiered, tmp_path):
    uri, location = copy_tier(tiered, tmp_path)
    for key in MANIFEST_KEYS:
        location.delete(key)
    with pytest.raises(Exception, match="no tier manifest at") as refused:
        spark.read.format("commitlog").load(uri).count()
    assert SECRET not in str(refused.value)
    query = spark.readStream.format("commitlog").load(tiered.uri).writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match="readStream of a tier"):
            query.awaitTermination(120)
    finally:
        query.stop()


@pytest.mark.parametrize("uri, said", [
    ("gs://bucket/prefix", "Hadoop's FileSystem cannot open the tier gs://bucket/prefix"),
    (f"s3://k:{SECRET}@bucket/prefix?endpoint=x", "unexpected query parameter 'endpoint'"),
    (f"s3://k:{SECRET}@bucket/prefix?endpoint_override=127.0.0.1:9&scheme=http",
     "GET s3://bucket/prefix/tier/manifest.0.json failed 4 times"),
    ("file://host/dir", "a file tier URI is file:///absolute/directory")], ids=["gs", "query", "no server", "host"])
def test_a_location_that_cannot_be_read_is_refused_with_the_reason(spark, jvm_reader, uri, said):
    with pytest.raises(Exception) as refused:
        spark.read.format("commitlog").load(uri).count()
    assert said in str(refused.value) and SECRET not in str(refused.value)


# --- the signer -----------------------------------------------------------------------------------------------
def jvm_authorization(spark, method, path, headers, access_key, secret_key, region, service,
                      payload_hash="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") -> str:
    from py4j.java_collections import MapConverter

    gateway = spark.sparkContext._gateway
    java_headers = MapConverter().convert(headers, gateway._gateway_client)
    signer = spark.sparkContext._jvm.io.mqstore.spark.SigV4
    return signer.authorization(method, path, "", java_headers, payload_hash, access_key, secret_key, region,
                                service)


def test_the_signer_gives_aws_published_signatures(spark, jvm_reader):
    # AWS's SigV4 test suite, get-vanilla: GET / of example.amazonaws.com, service "service"
    vanilla = jvm_authorization(spark, "GET", "/", {"Host": "example.amazonaws.com", "X-Amz-Date": "20150830T123600Z"},
                                "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "us-east-1", "service")
    assert vanilla == ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
                       "SignedHeaders=host;x-amz-date, "
                       "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")
    # the S3 documentation's example: GET /test.txt with a Range header
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    ranged = jvm_authorization(spark, "GET", "/test.txt", {
        "Host": "examplebucket.s3.amazonaws.com", "Range": "bytes=0-9", "x-amz-content-sha256": empty,
        "x-amz-date": "20130524T000000Z"}, "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "us-east-1", "s3")
    assert ranged.endswith("Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_the_signer_agrees_with_botocore(spark, jvm_reader):
    """The range GET the reader sends, signed by botocore's S3 signer and by ours: the same Authorization."""
    import datetime
    from unittest import mock

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    key = "prefix/consumequeue/%RETRY%group|x/0/00000000000000000000"
    path = f"/{S3_BUCKET}/" + spark.sparkContext._jvm.io.mqstore.spark.SigV4.uriEncode(key, True)
    assert path == f"/{S3_BUCKET}/" + urllib.parse.quote(key, safe="/~")  # RFC 3986's unreserved, '/' kept
    for token in (None, "session-token/+="):
        request = AWSRequest(method="GET", url=f"http://127.0.0.1:9000{path}",
                             headers={"Range": "bytes=100-16777315"})
        when = datetime.datetime(2026, 12, 1, 8, 30, 5)
        with mock.patch("botocore.auth.get_current_datetime", return_value=when):
            S3SigV4Auth(Credentials("AKIDEXAMPLE", SECRET, token), "s3", "eu-west-3").add_auth(request)
        headers = {"host": "127.0.0.1:9000", "range": "bytes=100-16777315",
                   "x-amz-content-sha256": request.headers["X-Amz-Content-SHA256"],
                   "x-amz-date": request.headers["X-Amz-Date"]}
        if token:
            headers["x-amz-security-token"] = token
        assert request.headers["X-Amz-Date"] == "20261201T083005Z"
        ours = jvm_authorization(spark, "GET", path, headers, "AKIDEXAMPLE", SECRET, "eu-west-3", "s3",
                                 payload_hash=request.headers["X-Amz-Content-SHA256"])
        assert ours == request.headers["Authorization"]


# --- the benchmark --------------------------------------------------------------------------------------------
@pytest.mark.long  # 9 s: moto in a process of its own and 5 queries; test-long runs it
def test_the_benchmark_quick_mode_runs(spark, jvm_reader, tmp_path):
    """bench/spark_tier.py end to end on a small store (speed is not asserted); it writes under tmp_path only."""
    import importlib.util

    from tests.spark.conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("spark_tier_bench", REPO_ROOT / "bench" / "spark_tier.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "spark_tier_quick.md"
    path = bench.main(["--quick", "--rows", "20000", "--segment-mib", "1", "--rounds", "1", "--out", str(out),
                       "--work-dir", str(tmp_path / "work")], spark=spark)
    assert path == str(out) and not (tmp_path / "work" / "spark_tier_quick").exists()
    text = out.read_text(encoding="utf-8")
    for name in ("full scan: local", "full scan: file:// tier", "full scan: S3 tier (moto)",
                 "topic filter: S3 tier (moto)"):
        assert f"| {name} |" in text
    assert "bench/spark_tier.py --quick" in text


# --- a server that answers ranges its own way -----------------------------------------------------------------
class _OddServer:
    """Serves a file:// tier's objects as path-style S3 GETs on loopback, answering a range as `mode` says:
    "honest" (206, the range), "whole" (200, the whole object: a server that ignores Range) or "shifted" (206
    with a Content-Range and bytes that start 8 bytes past the asked offset)."""

    def __init__(self, root, mode: str):
        import http.server
        import threading

        served, self.mode = root, mode

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler):  # noqa: N802 - http.server's name
                key = urllib.parse.unquote(handler.path.split("?")[0]).split("/", 3)[3]  # /bucket/prefix/key
                path = os.path.join(served, key)
                if not os.path.isfile(path):
                    handler.send_response(404)
                    handler.send_header("Content-Length", "0")
                    handler.end_headers()
                    return
                with open(path, "rb") as source:
                    data = source.read()
                asked = re.fullmatch(r"bytes=(\d+)-(\d+)", handler.headers.get("Range", ""))
                if asked is None or self.mode == "whole":
                    handler.send_response(200)
                    body = data
                else:
                    start = int(asked.group(1)) + (8 if self.mode == "shifted" else 0)
                    body = data[start:int(asked.group(2)) + 1]
                    handler.send_response(206)
                    handler.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def uri(self) -> str:
        host, port = self.server.server_address
        return f"s3://odd/tier?endpoint_override={host}:{port}&scheme=http&region={S3_REGION}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def file_tiered(tmp_path_factory) -> Tiered:
    base = tmp_path_factory.mktemp("tiered-odd")
    return write_tiered(base / "store", (base / "tier").as_uri())


def test_a_server_that_ignores_range_still_gives_the_rows_and_a_shifted_range_is_refused(spark, jvm_reader,
                                                                                            file_tiered):
    tiered = file_tiered
    system = spark.sparkContext._jvm.java.lang.System  # local[2]: the executors are the driver's JVM
    for client, mode in itertools.product((None, "httpclient"), ("honest", "whole", "shifted")):
        server = _OddServer(tiered.location.root, mode)
        if client is not None:  # S3Objects.RANGE_CLIENT_PROPERTY: the bench's "before" path checks ranges too
            system.setProperty("io.mqstore.spark.s3RangeClient", client)
        try:
            if mode == "shifted":
                with pytest.raises(Exception, match=r"answered 206 with Content-Range bytes \d+-"):
                    read_rows(spark, server.uri())
            else:
                assert read_rows(spark, server.uri()) == tiered.expected(), (client, mode)
        finally:
            system.clearProperty("io.mqstore.spark.s3RangeClient")
            server.stop()
