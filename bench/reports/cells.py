"""Cell formatters and the Markdown table every block is made of.

A formatter takes a cell's value (None for a missing one, shown empty) and returns its text; `table` right-aligns
every column but those formatted with `text`.
"""

from __future__ import annotations


def rate(value) -> str:
    """A count per second, to three significant digits: 1.23M, 456k, 7,509."""
    if value is None:
        return ""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e5:
        return f"{value / 1e3:.0f}k"
    return f"{value:,.0f}"



def number(digits: int):
    return lambda value: "" if value is None else f"{value:,.{digits}f}"



def share(value) -> str:
    return "" if value is None else f"{value * 100:.0f}%"



def size(value) -> str:
    if value is None:
        return ""
    if value == 0:
        return "0"
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= unit:
            return f"{value / unit:g} {name}" if value % unit == 0 else f"{value / unit:.1f} {name}"
    return f"{value} B"



def body(value) -> str:
    return "" if value is None else {100: "100 B", 1000: "1 KB", 1024: "1 KB", 16384: "16 KB"}.get(value, f"{value} B")



def text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|")



def ratio(value) -> str:
    return "" if value is None else f"{value:.2f}x"



def figure(value) -> str:
    """A measurement whose unit the row names: 1.23M, 456k, 7,509, 0.085."""
    if value is None:
        return ""
    if value >= 1e5:
        return rate(value)
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"



def preformatted(value) -> str:
    """A cell already formatted by its column's function (right-aligned, unlike text)."""
    return value or ""



def table(rows: list[dict], columns: list[tuple[str, object, object]]) -> str:
    """A Markdown table: one column per (header, key or function of the row, formatter)."""
    lines = ["| " + " | ".join(header for header, _, _ in columns) + " |",
             "|" + "|".join("---" if formatter is text else "---:" for _, _, formatter in columns) + "|"]
    for row in rows:
        cells = [formatter(key(row) if callable(key) else row.get(key)) for _, key, formatter in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
