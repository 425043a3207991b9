"""The target tables: core (issue 21's targets in one run) and users (issue 30's, README.md's Speed table, with
a version of its own for README.md), and the gaps file that says where the time of each row not met goes."""

from __future__ import annotations

from pathlib import Path

from .cells import table, text

HERE = Path(__file__).resolve().parents[1]  # bench/
GAPS = HERE / "results" / "users-gaps.md"  # where the time goes in each row of users.json not met


def report_core(data: dict) -> str:
    runs = ", ".join(f"`{run['command']}` {run['started_utc']} UTC ({run['seconds']:.0f} s, load "
                     f"{run['load_average_1min_before']:.1f})" + ("" if run["exit"] == 0 else " FAILED")
                     for run in data.get("runs", []))
    intro = (f"{data['met']} of {len(data['rows'])} targets met, {data['not_met']} not. One run of {runs}. "
             "Each reference was measured in the same benchmark's run.")
    verdict = {True: "met", False: "**not met**", None: "no figure"}
    return intro + "\n\n" + table(data["rows"], [
        ("target", "target", text), ("mqstore", "measured", text), ("reference, same run", "reference", text),
        ("", lambda row: verdict[row["met"]], text)])



def report_users(data: dict, readme_only: bool = False) -> str:
    """Issue 30's rows: each side's median (min-max) over interleaved rounds, the per-round ratio, the verdict.
    README.md gets the rows README quotes; bench/README.md also the diagnostic ones."""
    rows = [row for row in data["rows"] if row["readme"] or not readme_only]
    readme = [row for row in data["rows"] if row["readme"]]
    targets = [row for row in readme if row["met"] is not None]
    intro = (f"{data['met']} of {len(targets)} targets met, {data['not_met']} not"
             + (" (a partial run: rows are missing)" if data.get("partial") else "") + ". `StoreConfig()` unless the "
             "row says otherwise; a tag and a key a message, built in the timed loop; 4 topics x 4 queues; the ASYNC "
             "and put_batch rows roll 1 GiB segments; RocketMQ 4.4.0 warmed, index on, the better of its two put "
             f"locks. {data['rounds']} interleaved rounds of fresh processes ({data.get('minutes', 0):.0f} minutes): "
             "median (min-max) of each side and of the per-round ratio.")
    if data.get("note"):
        intro += " " + data["note"]
    reruns = data.get("reruns", [])
    if reruns:
        intro += " Measured again later (`--only ... --merge`): " + "; ".join(
            f"{', '.join(run['only'])} at {run['date_utc']} UTC, {run['rounds']} rounds"
            + (f" ({run['note'].rstrip('.')})" if run.get("note") else "") for run in reruns) + "."
    gaps = ("bench/" if readme_only else "") + GAPS.relative_to(HERE).as_posix()
    return intro + "\n\n" + table(rows, [
        ("workload", "label", text), ("mqstore", "measured_text", text), ("reference, same run", "reference_text",
                                                                         text),
        ("ratio", "ratio_text", text), ("target", "target", text),
        ("", lambda row: users_verdict(row, gaps), text)])



def users_verdict(row: dict, gaps: str) -> str:
    """A row's last cell: met, or not met with its gap and a link to where its time goes (GAPS)."""
    if row["met"] is None:
        return "-"
    if row["met"]:
        return "met"
    gap = f"{row['gap']}; " if row.get("gap") else ""
    return f"**not met** ({gap}[where the time goes]({gaps}#{row['name']}))"



def gap_sections() -> list[str]:
    """The row names GAPS has a section for (`## name`)."""
    return [line[3:].strip() for line in GAPS.read_text(encoding="utf-8").splitlines() if line.startswith("## ")]



def report_users_readme(data: dict) -> str:
    return report_users(data, readme_only=True)
