"""The documentation stays true to the code: generated tables are current, README's examples run."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tier.conftest import s3_server  # noqa: F401 - a fixture, used by name (README's tier example)

ROOT = Path(__file__).resolve().parents[1]


def _load(relative: str):
    """A script of the repository (docs/generate.py, bench/report.py) as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_page_matches_store_config():
    generate = _load("docs/generate.py")
    assert generate.generated_settings_page() == generate.SETTINGS_PAGE.read_text(encoding="utf-8"), \
        "docs/settings.md is out of date: run `make docs`"


def test_settings_table_has_one_row_per_field_with_its_docstring():
    from mqstore import StoreConfig

    generate = _load("docs/generate.py")
    rows = [line for line in generate.settings_table().splitlines()[2:]]
    names = [re.match(r"\| `(\w+)` \|", row).group(1) for row in rows]
    assert names == [field.name for field in dataclasses.fields(StoreConfig)]
    docs = generate.field_docstrings(StoreConfig)
    assert set(docs) == set(names), "every StoreConfig field needs a docstring under it"
    assert "| `segment_size_bytes` | 1 GiB |" in rows[0]


def test_settings_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    generate = _load("docs/generate.py")
    stale = tmp_path / "settings.md"
    stale.write_text(f"intro\n{generate.BEGIN}\n| STALE-ROW |\n{generate.END}\n", encoding="utf-8")
    monkeypatch.setattr(generate, "SETTINGS_PAGE", stale)
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 1
    assert "STALE-ROW" in stale.read_text(encoding="utf-8")
    assert generate.main([]) == 0
    assert "`segment_size_bytes`" in stale.read_text(encoding="utf-8")
    assert generate.main(["--check"]) == 0


def test_bench_readme_tables_match_the_results():
    report = _load("bench/report.py")
    current = report.README.read_text(encoding="utf-8")
    assert report.generated_readme(current) == current, "bench/README.md is out of date: run `make docs`"
    top = report.TOP_README.read_text(encoding="utf-8")
    assert report.generated_readme(top, report.TOP_README_BLOCKS) == top, "README.md is out of date: run `make docs`"


def test_every_speed_row_not_met_says_where_its_time_goes():
    """Issue 30: a row of README's Speed table that misses its target shows where the time goes and the next
    step: bench/results/users-gaps.md has a section for each such row, and none for a row that is met."""
    report = _load("bench/report.py")
    rows = json.loads((report.RESULTS / "users.json").read_text(encoding="utf-8"))["rows"]
    sections = report.gap_sections()
    assert len(sections) == len(set(sections)), "a row with two sections in users-gaps.md"
    assert sorted(sections) == sorted(row["name"] for row in rows if row["met"] is False)
    text = report.GAPS.read_text(encoding="utf-8")
    for part in text.split("\n## ")[1:]:
        assert "Where the time goes" in part and "Next step" in part, part[:80]


def test_bench_report_has_a_table_for_every_result_file():
    report = _load("bench/report.py")
    results = sorted(path.stem for path in report.RESULTS.glob("*.json") if not path.stem.endswith("_quick"))
    assert results == sorted(report.BENCHMARKS), "a benchmark without a report function (bench/report.py)"
    for name in results:
        block = report.block(name)
        assert block.startswith(f"`{report.command(name)}`, "), block[:80]
        script = report.command(name).split()[1]
        assert (ROOT / script).is_file(), f"{name}: {script} does not exist"
        assert "\n| " in block and "---" in block


def test_bench_report_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    report = _load("bench/report.py")
    stale = tmp_path / "README.md"
    stale.write_text("\n".join(f"{report.begin_marker(name)}\nSTALE-ROW\n{report.end_marker(name)}"
                               for name in report.BENCHMARKS), encoding="utf-8")
    monkeypatch.setattr(report, "README", stale)
    assert report.main(["--check"]) == 1
    assert report.main(["--write"]) == 0
    assert "STALE-ROW" not in stale.read_text(encoding="utf-8")
    assert report.main(["--check"]) == 0


# docs/spark.md's examples need the Spark session: tests/spark/test_docs_spark.py runs them.
PAGES_WITH_RUN_EXAMPLES = (
    "README.md", "docs/arrow.md", "docs/asyncio.md", "docs/lease.md", "docs/settings.md", "docs/tuning.md")


def python_blocks(markdown: str) -> list[str]:
    """The ```python code blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def test_python_blocks_are_found():
    assert python_blocks("text\n```python\nx = 1\n```\n```\nnot python\n```\n```python\ny = 2\n```\n") == [
        "x = 1\n", "y = 2\n"]


def example_environment(script: str, request) -> dict[str, str]:
    """The environment a page's examples run in: when they name `s3://` buckets, the S3 endpoint is the test S3
    server on 127.0.0.1 (tests/tier/conftest.py) with those buckets made, and dummy keys, so that the examples work
    as against a real bucket and nothing leaves the machine (an unreachable endpoint costs the S3 client's retries,
    about 6 s a call)."""
    buckets = sorted(set(re.findall(r"s3://(?:[^@/\s]+@)?([a-z0-9][a-z0-9.-]+)/", script)))
    if not buckets:
        return dict(os.environ)
    from tests.tier.conftest import S3_KEY

    server = request.getfixturevalue("s3_server")
    for bucket in buckets:
        server.filesystem().create_dir(bucket)
    return {**os.environ, "AWS_ENDPOINT_URL": f"http://{server.endpoint}", "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_KEY, "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("page", PAGES_WITH_RUN_EXAMPLES)
def test_examples_run(page, tmp_path, request):
    """Each page's python blocks run in order, as one script, in an empty directory."""
    blocks = python_blocks((ROOT / page).read_text(encoding="utf-8"))
    if page == "README.md":
        assert len(blocks) >= 2
    script = tmp_path / "examples.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=example_environment(script.read_text(encoding="utf-8"), request))
    assert result.returncode == 0, f"{page}'s examples failed:\n{result.stderr}"


# Pages other branches add (the lead removes an entry once its page is merged).
PAGES_FROM_OTHER_BRANCHES: set[str] = set()
LINKED_PAGES = ("README.md", "bench/README.md", "docs/*.md", "docs/decisions/*.md")


def relative_links(markdown: str) -> list[str]:
    """The targets of a page's Markdown links that point into the repository (no URL scheme, no bare anchor)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [target.split("#")[0] for target in targets if not re.match(r"[a-z]+:", target)
            and not target.startswith("#")]


def test_relative_links_are_found():
    assert relative_links("[a](docs/x.md) [b](https://e.org) [c](#top) [d](../y.md#part)") == ["docs/x.md", "../y.md"]


def test_relative_links_resolve():
    broken = []
    for pattern in LINKED_PAGES:
        for page in sorted(ROOT.glob(pattern)):
            for target in relative_links(page.read_text(encoding="utf-8")):
                path = (page.parent / target).resolve()
                if not path.exists() and str(path.relative_to(ROOT)) not in PAGES_FROM_OTHER_BRANCHES:
                    broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


PAGES_NAMING_FILES = ("README.md", "bench/README.md", "docs/*.md")
# A page another helper owns that still names a file of the old layout: (page, path). Remove once fixed.
STALE_PATHS_ELSEWHERE: set[tuple[str, str]] = set()


def named_files(markdown: str) -> list[str]:
    """The repository files a page names as `dir/name.py` (or .c, .h), placeholders such as bench/NAME.py left out."""
    paths = re.findall(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|c|h))(?![\w/])", markdown)
    return [path for path in paths if not re.search(r"(^|/)[A-Z]{2,}[A-Z_]*\.", path)]


def test_named_files_are_found():
    assert named_files("see `mqstore/store/engine.py`, bench/NAME.py, engine.py and commitlog/csrc/crc32.c.") == [
        "mqstore/store/engine.py", "commitlog/csrc/crc32.c"]


def test_named_files_exist():
    missing = []
    for pattern in PAGES_NAMING_FILES:
        for page in sorted(ROOT.glob(pattern)):
            name = str(page.relative_to(ROOT))
            for path in named_files(page.read_text(encoding="utf-8")):
                found = (ROOT / path).exists() or (page.parent / path).exists()  # a link is relative to its page
                if not found and (name, path) not in STALE_PATHS_ELSEWHERE:
                    missing.append(f"{name} -> {path}")
    assert missing == []


def dotted_names(markdown: str) -> list[str]:
    """The `mqstore.x.y` names a page mentions."""
    return re.findall(r"(?<![\w./-])(mqstore(?:\.[A-Za-z_]\w*)+)", markdown)


def resolves(name: str) -> bool:
    """Whether a dotted name is a module of the installed package, or an attribute of one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        value = module
        for attribute in parts[end:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_dotted_names_resolve():
    assert resolves("mqstore.store.engine.MessageStore") and not resolves("mqstore.engine")
    unresolved = []
    for pattern in PAGES_NAMING_FILES:
        for page in sorted(ROOT.glob(pattern)):
            for name in sorted(set(dotted_names(page.read_text(encoding="utf-8")))):
                if not resolves(name):
                    unresolved.append(f"{page.relative_to(ROOT)} -> {name}")
    assert unresolved == []


def test_every_decision_is_indexed():
    index = (ROOT / "docs/decisions/README.md").read_text(encoding="utf-8")
    records = sorted(path.name for path in (ROOT / "docs/decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert "0001-writer-lock-hand-off.md" in records
    assert [name for name in records if f"]({name})" not in index] == [], "add it to docs/decisions/README.md"
