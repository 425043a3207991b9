"""The compiled core's blocks: crc32, native (the two codecs' puts and gets) and native_scan."""

from __future__ import annotations

from .cells import body, number, preformatted, rate, ratio, size, table, text


def report_crc32(data: dict) -> str:
    """ns per call of each implementation and of each mq_crc32 path this CPU ran, and GB/s (bytes per ns)."""
    def gbps(key):
        return lambda row: row[key] and row["bytes"] / row[key]

    functions = data.get("functions") or []
    paths = [name for name in functions if name.startswith("mq_") and name != "mq_zlib"]
    chosen = f"mq_{data.get('chosen')}"
    intro = ("One CRC-32 call in C per input size, each call waiting for the previous one's value: zlib (what the "
             "build links), ISA-L (the `isal` package's copy" + ("" if "isal" in functions else
                                                                 "; not loaded in this run")
             + ") and the folding paths of mq_crc32 (commitlog/csrc/crc32.c, the compiled core's) this CPU ran; "
             f"mq_crc32 takes `{data.get('chosen')}` here. 222 and 1,120 bytes are what the record CRC covers of a "
             "100 B and a 1 KB message.")
    columns = [("bytes", "bytes", number(0)), ("zlib ns", "zlib_ns", number(1))]
    columns += [("ISA-L ns", "isal_ns", number(1))] if "isal" in functions else []
    columns += [(f"{name[3:]} ns", f"{name}_ns", number(1)) for name in paths]
    columns += [("zlib GB/s", gbps("zlib_ns"), number(2))]
    columns += [("ISA-L GB/s", gbps("isal_ns"), number(2))] if "isal" in functions else []
    if chosen in functions:
        columns += [(f"{chosen[3:]} GB/s", gbps(f"{chosen}_ns"), number(2)),
                    (f"{chosen[3:]} vs zlib", lambda row: row[f"{chosen}_ns"] and row["zlib_ns"] / row[f"{chosen}_ns"],
                     ratio)]
    return intro + "\n\n" + table(data["rows"], columns)



def report_native(data: dict) -> str:
    def part(codec, key):
        return lambda row: (row.get(codec) or {}).get(key)

    intro = (f"{data.get('messages_per_row', 0):,} messages a row; each codec in a process of its own, RocketMQ "
             "4.4.0's store (`rmq put`) in the same run.")
    return intro + "\n\n" + table(data["rows"], [
        ("case", "case", text), ("compiled msgs/s", part("native", "msgs_per_s"), rate),
        ("MB/s", part("native", "mb_per_s"), number(0)), ("pure Python msgs/s", part("python", "msgs_per_s"), rate),
        ("MB/s", part("python", "mb_per_s"), number(0)), ("compiled vs Python", "native_vs_python", ratio),
        ("RocketMQ msgs/s", part("rocketmq", "msgs_per_s"), rate),
        ("compiled vs RocketMQ", "native_vs_rocketmq", ratio)])



NATIVE_SCAN_MEASURES = (
    ("dispatch to ConsumeQueues (msgs/s)", "dispatch_cq_msgs_per_s", rate),
    ("dispatch to ConsumeQueues and index (msgs/s)", "dispatch_cq_index_msgs_per_s", rate),
    ("recovery walk, CRC on (GB/s of log)", "walk_crc_gb_per_s", number(2)),
    ("store.scan() to a Table, every column (rows/s)", "scan_rows_per_s", rate),
    ("store.scan(), one topic, two columns (rows/s)", "scan_topic_two_columns_rows_per_s", rate),
)



def report_native_scan(data: dict) -> str:
    by_codec = {row["codec"]: row for row in data["rows"]}
    python, native = by_codec.get("python", {}), by_codec.get("native", {})
    targets = data.get("targets") or {}
    reference = data.get("reference") or {}
    rocketmq = (reference.get("rocketmq_load") or {}).get("gb_per_s")
    crc = reference.get("zlib_crc32_gb_per_s")
    rows = [{"measure": label, "python": python.get(key), "native": native.get(key), "format": formatter,
             "target": targets.get(key)} for label, key, formatter in NATIVE_SCAN_MEASURES]
    intro = (f"{data.get('messages', 0):,} messages of {body(data.get('body_bytes'))} "
             f"({size(data.get('log_bytes'))} of log), best of the run's repeats. References in the same run: "
             f"zlib.crc32 over the log in 1 MiB chunks {number(2)(crc)} GB/s"
             + (f"; RocketMQ 4.4.0's crash recovery (`rmq load`) {rocketmq:.2f} GB/s" if rocketmq else "")
             + ".")
    return intro + "\n\n" + table(rows, [
        ("measure", "measure", text), ("pure Python", lambda row: row["format"](row["python"]), preformatted),
        ("compiled", lambda row: row["format"](row["native"]), preformatted),
        ("compiled vs Python", lambda row: row["python"] and row["native"] and row["native"] / row["python"], ratio),
        ("target", lambda row: row["format"](row["target"]), preformatted)])
