"""The long description: README.md with its relative links and pictures
written out as file names, since PyPI can resolve neither (the files are in
the sdist: docs/). Everything else is in pyproject.toml."""

import re
from pathlib import Path

from setuptools import setup

RELATIVE = r"\((?![a-z]+:)([^)\s]+)\)"               # (path or #anchor), not (https://...)
PICTURE = re.compile(r"!\[([^\]]*)\]" + RELATIVE)
LINK = re.compile(r"\[([^\]]+)\]" + RELATIVE)


def _link(match):
    text, path = match.groups()
    if path.startswith("#"):
        return text
    return f"`{path}`" if text.strip("`") == path.partition("#")[0] else f"{text} (`{path}`)"


readme = (Path(__file__).parent / "README.md").read_text(encoding="utf-8")
readme = PICTURE.sub(r"*(Picture not shown here: \1, `\2` in the sources.)*", readme)
setup(long_description=LINK.sub(_link, readme), long_description_content_type="text/markdown")
