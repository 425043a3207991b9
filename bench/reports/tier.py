"""The tiered store's blocks: tier_upload, tier_scan and tier_get."""

from __future__ import annotations

import statistics

from .cells import number, preformatted, rate, ratio, size, table, text


def report_tier_upload(data: dict) -> str:
    shape = data["shape"]
    endpoints = data["endpoints"]

    def vs_no_tier(row):
        spread = row.get("vs_no_tier_range")
        if row.get("vs_no_tier") is None or spread is None:
            return ratio(row.get("vs_no_tier"))
        return f"{row['vs_no_tier']:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"

    def phase(name):
        return lambda row: (row.get("phase_cpu_s_per_gb") or {}).get(name)

    tiers = [row for row in data["rows"] if "uploader_cpu_s_per_gb" in row]
    parts = [f"{shape['messages']:,} messages of 1 KB by put_batch, segments of {shape['segment_size_bytes'] >> 20} "
             f"MiB, medians of {data['rounds']} interleaved rounds (against no tier: each round's ratio, median and "
             "min-max):", table(data["rows"], [
                 ("row", "row", text), ("msgs/s", "rate", rate), ("GB/s", "gb_per_s", number(2)),
                 ("vs no tier", vs_no_tier, text), ("tier lag at the loop's end (s)", "lag_at_end_s", number(1)),
                 ("largest lag seen (s)", "lag_max_sampled_s", number(1)), ("failures", "failures", number(0))])]
    if tiers:
        parts += ["CPU seconds, medians: the writer process's per GB put (the put loop and the tier's catch-up), and "
                  "the uploader's two threads' per GB uploaded, whole and by phase (`stats()[\"tier\"]"
                  "[\"upload_cost\"]`; the S3 client's own threads are in the writer's figure only):",
                  table(data["rows"], [
                      ("row", "row", text), ("writer CPU s/GB put", "process_cpu_s_per_gb_put", number(2)),
                      ("uploader CPU s/GB", "uploader_cpu_s_per_gb", number(2)), ("read", phase("read"), number(2)),
                      ("CRC", phase("crc"), number(2)), ("put", phase("put"), number(2)),
                      ("read back", phase("verify_read"), number(2)), ("its CRC", phase("verify_crc"), number(2))])]
    parts.append("Each endpoint's own rates in the same run (one 64 MiB object through pyarrow): " + "; ".join(
        f"{name} PUT {rates['put_mb_per_s']:,.0f} MB/s, GET {rates['get_mb_per_s']:,.0f} MB/s"
        for name, rates in endpoints.items()) + ".")
    return "\n\n".join(parts)



def _round_ratio(samples: list[dict], row: str, reference: str) -> str:
    """The median over rounds of two rows' rows/s ratio (load that shifts between rounds cancels), min-max."""
    ratios = [sample[row]["rows_per_s"] / sample[reference]["rows_per_s"] for sample in samples]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"



def report_tier_scan(data: dict) -> str:
    shape, medians, samples = data["shape"], data["medians"], data["samples"]
    rows = []
    for kind, label in (("full", "every row"), ("topic", f"topic={data.get('topic', 'T0')}")):
        rows.append({"read": label, "endpoint": "local store", "scan": medians[f"local {kind}"], "raw": "-",
                     "vs_raw": "-", "vs_local": "1.00"})
        for name in ("file://", "S3 (moto)"):
            raw_mb = statistics.median(sample[f"{name} raw {kind}"]["mb_per_s"] for sample in samples)
            rows.append({"read": label, "endpoint": f"{name} tier", "scan": medians[f"{name} tier {kind}"],
                         "raw": f"{rate(medians[f'{name} raw {kind}'])} ({raw_mb:,.0f})",
                         "vs_raw": _round_ratio(samples, f"{name} tier {kind}", f"{name} raw {kind}"),
                         "vs_local": _round_ratio(samples, f"{name} tier {kind}", f"local {kind}")})
    plans = "; ".join(f"{name} {plan['seconds'] * 1000:.0f} ms, {plan['partitions']} partitions of {plan['pieces']} "
                      f"pieces, {plan['queue_range_reads']} range reads of queue images for the cuts"
                      for name, plan in data["planning"].items())
    parts = [f"{shape['messages']:,} messages of 100 B with a tag and a key (4 topics x 4 queues), {data['segments']} "
             f"segments of {size(shape['segment_size_bytes'])}, {data['log_bytes_per_row']:.0f} log bytes a row; "
             f"scans read {data['scan_threads']} partitions at once, the raw read replays the tier scan's range reads "
             f"on as many threads; medians of {data['rounds']} interleaved rounds (ratios: median of the rounds' "
             "ratios, min-max):",
             table(rows, [("read", "read", text), ("endpoint", "endpoint", text), ("scan rows/s", "scan", rate),
                          ("raw read rows/s (MB/s)", "raw", preformatted), ("scan / raw read", "vs_raw", preformatted),
                          ("scan / local scan", "vs_local", preformatted)]),
             "Targets (issue #31): tier scan >= 0.80 of the local scan and >= 0.80 of the raw read. The topic rows "
             "count matching rows: the tier scan walks every segment (a topic filter does not read through the "
             "tier's queue images), the raw read replays the same reads.",
             f"Planning a full scan of the tier (once, before the rounds): {plans}."]
    if "reader_cpu_s" in samples[0]["local full"]:
        parts += _tier_scan_cpu(data)
    return "\n\n".join(parts)


def ceiling_rows_per_s(row: dict) -> float | None:
    """Rows/s one read could reach if its endpoint cost no CPU on these cores, the read being CPU-bound: it keeps
    the cores it had busy, (reader + endpoint CPU) / wall, and spends them on the reader's CPU alone, so its wall
    shrinks by reader / (reader + endpoint). None without reader CPU."""
    reader, endpoint = row.get("reader_cpu_s"), row.get("endpoint_cpu_s") or 0.0
    if not reader:
        return None
    return row["rows_per_s"] * (reader + endpoint) / reader


def _tier_scan_cpu(data: dict) -> list[str]:
    """The CPU table: each read's CPU seconds, reader and endpoint, and the ceiling if CPU-bound (medians)."""
    samples, rows = data["samples"], []

    def median(name, field):
        return statistics.median(field(sample[name]) for sample in samples)

    def over(name, reference):  # the median over rounds of ceiling(name) / ceiling or rows/s (reference)
        found = [ceiling_rows_per_s(s[name]) / (ceiling_rows_per_s(s[reference]) if " raw " in reference
                                                 else s[reference]["rows_per_s"]) for s in samples]
        return f"{statistics.median(found):.2f} ({min(found):.2f}-{max(found):.2f})"

    for kind, label in (("full", "every row"), ("topic", f"topic={data.get('topic', 'T0')}")):
        for name, endpoint in ((f"local {kind}", "local store"), (f"S3 (moto) tier {kind}", "S3 (moto) tier scan"),
                               (f"S3 (moto) raw {kind}", "S3 (moto) raw read")):
            rows.append({"read": f"{label}: {endpoint}", "wall": median(name, lambda r: r["seconds"]),
                         "reader": median(name, lambda r: r["reader_cpu_s"]),
                         "endpoint": median(name, lambda r: r["endpoint_cpu_s"]),
                         "busy": median(name, lambda r: (r["reader_cpu_s"] + r["endpoint_cpu_s"]) / r["seconds"]),
                         "ceiling": median(name, ceiling_rows_per_s),
                         "all_cores": median(name, lambda r: r["rows"] * data["cpus"] / r["reader_cpu_s"]
                                             if r.get("rows") else r["rows_per_s"] * r["seconds"] * data["cpus"]
                                             / r["reader_cpu_s"]),
                         "vs_local": over(name, f"local {kind}") if "tier" in name else "",
                         "vs_raw": over(name, f"S3 (moto) raw {kind}") if "tier" in name else ""})
    return ["CPU, measured around the same reads (medians over rounds): the reader is this process, every thread "
            "(the scan's decoding, pyarrow's S3 client, the raw read's client), from getrusage; the endpoint is "
            "moto's S3 server, a process of its own, from /proc/<pid>/stat (10 ms ticks). Cores busy = (reader + "
            "endpoint CPU) / wall, out of the machine's cores, which other work shares.",
            table(rows, [("read", "read", text), ("wall s", "wall", number(2)),
                         ("reader CPU s", "reader", number(2)), ("endpoint CPU s", "endpoint", number(2)),
                         ("cores busy", "busy", number(2)), ("ceiling if CPU-bound, rows/s", "ceiling", rate),
                         ("reader alone on every core, rows/s", "all_cores", rate),
                         ("ceiling / local scan", "vs_local", preformatted),
                         ("ceiling / raw read's ceiling", "vs_raw", preformatted)]),
            "Ceiling if CPU-bound: the rows/s the read would reach if the endpoint cost no CPU on these cores, "
            "assuming the read is CPU-bound, i.e. it keeps the cores it kept busy and spends them on its own CPU "
            "alone: rows/s x (reader + endpoint CPU) / reader CPU. It is an upper bound: a read that waited on "
            "anything but the endpoint's CPU (latency, the other helpers' load) gains less. The client's CPU (HTTP, "
            "pyarrow's S3 reads, copies) stays in the reader's figure, as it would against any S3 endpoint. A "
            "ceiling / local scan below 0.80 means the target is out of reach on this machine with this reader "
            "even against an endpoint of no CPU cost; above it, the endpoint's CPU is what stands between. Reader "
            "alone on every core: rows / (reader CPU / the machine's cores), the bound with nothing else running "
            "and the reader's work spread perfectly over every core."]



TIER_GET_LABELS = {  # bench/tier_get.py's rows, as the table names them
    "get 1": "cold `get(..., max_count=1)`", "get 32": "cold `get(...)` (32 messages)", "read_at": "cold `read_at`",
    "query": "cold `query(topic, key)`", "get 32, object not open": "cold `get(...)`, object not open",
    "get 32, warm": "warm `get(...)` (cache hit)", "GET same range": "endpoint: GET of the cold get's range",
    "GET 256 KiB": "endpoint: GET of 256 KiB", "GET 1 byte": "endpoint: GET of 1 byte",
    "HEAD + GET 1 byte": "endpoint: open (HEAD) + GET of 1 byte"}



def report_tier_get(data: dict) -> str:
    shape = data["shape"]
    rows = []
    for endpoint, found in data["endpoints"].items():
        for name, row in found["rows"].items():
            reads = row.get("range_reads") or row.get("requests")
            same, block_ = (found["ratios"].get(f"{name} / {reference}") for reference in
                            ("GET same range", "GET 256 KiB"))
            rows.append({**row, "endpoint": endpoint, "read": TIER_GET_LABELS.get(name, name),
                         "reads": "" if reads is None else f"{reads['min']}-{reads['max']}"
                         if reads["min"] != reads["max"] else str(reads["min"]),
                         "opened": (row.get("objects_opened") or {}).get("total"),
                         "vs_same": same and f"{same['median']:.2f}x ({same['min']:.2f}-{same['max']:.2f})",
                         "vs_block": block_ and f"{block_['median']:.2f}x"})
    verdicts = "; ".join(f"{endpoint} {ratio_:.2f}x, " + ("met" if ratio_ <= 2 else "**not met**")
                         for endpoint, ratio_ in ((endpoint, found["ratios"]["get 32 / GET same range"]["median"])
                                                  for endpoint, found in data["endpoints"].items()))
    parts = [f"{shape['messages']:,} messages of 100 B with a tag and a key (4 topics x 4 queues), {data['segments']} "
             f"segments of {size(shape['segment_size_bytes'])}, all in the tier only; {data['rounds']} interleaved "
             f"round(s) of {shape['samples']} messages spread over the tier, a read_only open per endpoint and round; "
             "latencies over every sample (ms); ratios: median (min-max) over rounds of each round's p50s' ratio:",
             table(rows, [("endpoint", "endpoint", text), ("read", "read", text), ("p50 ms", "p50_ms", number(3)),
                          ("p90 ms", "p90_ms", number(3)), ("p99 ms", "p99_ms", number(3)),
                          ("range reads a call", "reads", preformatted), ("objects opened", "opened", number(0)),
                          ("p50 / GET of the same range", "vs_same", preformatted),
                          ("p50 / GET of 256 KiB", "vs_block", preformatted)]),
             "Target (issue #31): a cold get is one range read, its p50 within 2x the endpoint's GET "
             f"(`cold get(...) / GET of the cold get's range`): {verdicts}. Cold rows empty the reader's block cache "
             "first and keep its open handles; \"object not open\" also closes them (`TierReader.close()`), so the "
             "object is opened again. The endpoint rows use pyarrow on one open handle per object. A get of 32 "
             "messages makes two range reads when they lie in two objects, a query when another key shares the key's "
             "hash (its message is read and dropped)."]
    if data.get("handles_max") is not None:
        parts[-1] += f" The reader kept at most {data['handles_max']} open handles (`--handles-max`)."
    return "\n\n".join(parts)
