"""The Spark source's block: spark_read."""

from __future__ import annotations

from .cells import number, rate, table, text


def report_spark_read(data: dict) -> str:
    summary = data.get("summary") or {}
    settings = data.get("settings") or {}
    intro = (f"{settings.get('rows', 0):,} messages of {settings.get('body_bytes')} B written by MessageStore with "
             f"the default StoreConfig (a tag and a key each, UNIQ_KEY, put_batch of "
             f"{settings.get('put_batch_messages')}), {settings.get('topics')} topics of "
             f"{settings.get('queues_per_topic')} queues, against a Parquet file of the same rows; master "
             f"{settings.get('master')}, {settings.get('rounds')} interleaved rounds, medians (min-max). \"commitlog\" "
             f"is the JVM reader, \"commitlog-python\" the Python source.")
    for kind, key in (("full scan", "full_scan"), ("group-by topic", "group_by_topic"),
                      ("topic+queue filter", "topic_queue_filter")):
        if f"{key}_commitlog_vs_parquet" in summary:
            low, high = summary[f"{key}_commitlog_vs_parquet_min_max"]
            intro += (f" {kind.capitalize()}: {summary[f'{key}_commitlog_vs_parquet']:.2f}x Parquet ({low:.2f}-"
                      f"{high:.2f}; target >= {summary[f'{key}_target_vs_parquet']:.1f}x, "
                      f"{'met' if summary[f'{key}_meets_target'] else 'not met'}; the Python source "
                      f"{summary[f'{key}_python_vs_parquet']:.2f}x).")
    load = (data.get("machine") or {}).get("load_average_1m_before_after")
    if load:
        intro += f" Load average (1 min) {load[0]} before, {load[1]} after."
    return intro + "\n\n" + table(data["results"], [
        ("query", "name", text), ("rows", "rows", number(0)), ("median s", "seconds_median", number(3)),
        ("min-max s", lambda r: f"{r['seconds_min']:.3f}-{r['seconds_max']:.3f}", text),
        ("rows/s", "rows_per_s", rate), ("CPU s JVM", "cpu_jvm_s", number(2)),
        ("CPU s Python workers", "cpu_python_workers_s", number(2))])
