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
