"""The README and docs/*.md: every relative link points to a file that
exists (and, with an anchor into a Markdown file, to one of its headings),
and the README keeps its two set-up commands, the test command being the
one CI (.ci/run) runs."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEMO_COMMAND = "pip install -e . && numba-alloc demo"
TEST_COMMAND = 'pip install -e ".[test,cu13]" && python -m pytest'

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def prose(text):
    """The Markdown outside fenced code blocks and code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(text):
    """GitHub's anchors for the headings of a Markdown text: lower case,
    punctuation but hyphens and underscores dropped, spaces as hyphens,
    -1, -2 ... after repeats."""
    seen, out = {}, set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(page):
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):    # http:, https:, mailto:
            yield target


def test_there_are_pages_and_links():
    assert len(PAGES) > 1
    assert any(True for page in PAGES for _ in relative_links(page))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(
                file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_keeps_its_two_set_up_commands():
    lines = [line.strip() for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    assert DEMO_COMMAND in lines
    assert TEST_COMMAND in lines


def test_ci_runs_the_readmes_test_command():
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_anchors_are_githubs():
    text = "# A `b`: c, d's e\n## Figures so far\n### Figures so far\n```\n# not a heading\n```\n"
    assert anchors(text) == {"a-b-c-ds-e", "figures-so-far", "figures-so-far-1"}


def test_the_readmes_counter_table_is_the_declared_one():
    from numba_alloc.policy.counters import markdown_table
    assert markdown_table() in (ROOT / "README.md").read_text()


def test_the_readme_has_no_bracket_then_parenthesis_pypi_would_show_broken():
    """setup.py writes out relative links (no spaces) for PyPI; any other
    "](" (a kernel launch such as ``kernel[blocks, threads](a, b)``) would
    stay a link PyPI cannot resolve, which CI's install check refuses."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"\]\((?![a-z]+:)[^)]*\s[^)]*\)", readme)


def test_the_pictures_show_what_the_pool_does_now():
    """docs/figures.json holds what docs/segments.png and docs/timeline.png
    show, in numbers; recomputed here, they must agree (else run
    python docs/make_figures.py)."""
    pytest.importorskip("matplotlib")
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "docs" / "make_figures.py")
    make_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_figures)
    now = make_figures.shown(make_figures.scattered_pool(), make_figures.replayed_pool())
    assert now == json.loads((ROOT / "docs" / "figures.json").read_text()), \
        "the pictures are stale: python docs/make_figures.py"


def test_the_quoted_replay_report_is_what_numba_alloc_replay_prints_now():
    """observability.md quotes `numba-alloc replay`'s report: every figure
    but the host time (which depends on the machine) as it prints now."""
    import numba_alloc
    from numba_alloc import Pool, SimulatedDevice
    text = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    start = text.index("      replay of .../numba_alloc/data/training_loop.csv")
    quoted = [line.strip() for line in text[start:].split("\n\n")[0].splitlines()]
    report = numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, Pool(SimulatedDevice("16GiB")))
    now = [line.strip() for line in report.format().splitlines()]
    now[0] = now[0].replace(str(numba_alloc.BUNDLED_TRACE), ".../numba_alloc/data/training_loop.csv")
    host = re.compile(r"host time [\d.]+ us|\([\d.]+ of them")
    assert [host.sub("host time", line) for line in quoted] == \
        [host.sub("host time", line) for line in now]


def test_the_settings_quote_the_replays_they_name():
    """The README's expandable_segments replay (700 MiB device) and
    settings.md's keep_whole_segments replay (16 GiB device) quote peaks of
    reserved memory: each as numba-alloc replay gives it now."""
    import numba_alloc
    from numba_alloc import Pool, SimulatedDevice

    def peak(capacity, **settings):
        pool = Pool(SimulatedDevice(capacity, holds_data=False), **settings)
        return numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, pool).peak_reserved >> 20

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "it peaks at 654 MiB reserved, against all 700 MiB" in readme
    assert (peak("700MiB", expandable_segments=True), peak("700MiB")) == (654, 700)
    settings = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert "now 768 with it on or off" in settings
    assert peak("16GiB") == peak("16GiB", keep_whole_segments=False) == 768


def test_stats_md_names_every_part_of_pool_snapshot():
    """stats.md says what Pool.snapshot() holds: every key it has."""
    from numba_alloc import Pool, SimulatedDevice
    text = (ROOT / "docs" / "stats.md").read_text(encoding="utf-8")
    start = text.index("`Pool.snapshot()` is the plain dict")
    sentence = text[start:text.index(".\n", start)]
    keys = set(Pool(SimulatedDevice("64MiB")).snapshot())
    assert keys == set(re.findall(r"`(\w+)`", sentence)) - {"snapshot"}


def test_stats_md_names_every_key_of_host_memory_stats():
    """stats.md lists host_memory_stats' keys: every one it has."""
    import numba_alloc
    from numba_alloc import Pool, SimulatedDevice
    text = (ROOT / "docs" / "stats.md").read_text(encoding="utf-8")
    start = text.index("* `host_memory_stats(device=None)`")
    item = re.sub(r"\s+", "", text[start:text.index("\n* ", start + 1)])
    def expand(span):        # "a_{b,c}.{d,e}": a_b.d, a_b.e, a_c.d, a_c.e
        group = re.search(r"\{([^{}]*)\}", span)
        if not group:
            return {span}
        return {name for choice in group.group(1).split(",")
                for name in expand(span[:group.start()] + choice + span[group.end():])}
    named = set().union(*map(expand, re.findall(r"`([\w.{},]+)`", item)))
    keys = set(numba_alloc.host_memory_stats(Pool(SimulatedDevice("64MiB"))))
    assert keys <= named, sorted(keys - named)


def test_stats_md_names_every_counter_family_the_primitives_take():
    """stats.md lists the families current(), peak() and accumulated()
    take: every one the pool counts, and nothing else."""
    from numba_alloc.policy.counters import FAMILIES
    text = (ROOT / "docs" / "stats.md").read_text(encoding="utf-8")
    start = text.index("A family is one of")
    sentence = text[start:text.index(";", start)]
    assert set(re.findall(r"`(\w+)`", sentence)) == {family.name for family in FAMILIES}
