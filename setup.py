"""The long description: README.md with each picture replaced by a line
naming it, since PyPI cannot show pictures linked by relative paths (the
pictures travel in the sdist's docs/). Everything else is in pyproject.toml."""

import re
from pathlib import Path

from setuptools import setup

PICTURE = re.compile(r"^!\[([^\]]*)\]\((?![a-z]+://)([^)\s]+)\)$", re.MULTILINE)

readme = (Path(__file__).parent / "README.md").read_text(encoding="utf-8")
setup(long_description=PICTURE.sub(r"*(Picture not shown here: \1, `\2` in the sources.)*", readme),
      long_description_content_type="text/markdown")
