"""The compiled modules (Cython, built ahead of time: nothing is compiled
when the package runs) and the long description: README.md with its
relative links and pictures written out as file names, since PyPI can
resolve neither (the files are in the sdist: docs/). Everything else is in
pyproject.toml."""

import re
from pathlib import Path

from setuptools import Extension, setup

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
# the pool's core, the defragmentation planner and the reclaim hooks' work
# on each launch: C, from Cython sources (setuptools runs Cython on .pyx
# sources: it is in the build requirements)
COMPILED = [Extension(f"numba_alloc.{name.replace('/', '.')}", [f"numba_alloc/{name}.pyx"],
                      extra_compile_args=["-O2"])
            for name in ("policy/_core", "policy/_planner", "plugin/_launch")]
setup(long_description=LINK.sub(_link, readme), long_description_content_type="text/markdown",
      ext_modules=COMPILED)
