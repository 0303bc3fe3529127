"""The documentation site builds: ``mkdocs build --strict`` (every page in the nav, every
link and anchor resolved, the API reference generated from the docstrings), and the
reference covers the whole public API. The build is skipped where the docs extra
(``pip install -e ".[docs]"``) is not installed."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import minidist
from minidist import collectives

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BUILD_TIMEOUT = 300  # seconds; the build takes about 5 s on 2 cores

# the docs extra: mkdocs, the material theme, mkdocstrings and its python handler
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_docs_modules() -> list[str]:
    missing = []
    for name in DOCS_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package of a dotted name is absent
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.timeout(BUILD_TIMEOUT + 60)
def test_mkdocs_build_strict(tmp_path):
    missing = _missing_docs_modules()
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}); "
                    'pip install -e ".[docs]"')
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict",
             "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mkdocs build did not finish in {BUILD_TIMEOUT} s:\n{e.stderr or ''}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert not re.search(r"^WARNING", output, re.M), output
    assert (tmp_path / "site" / "index.html").is_file()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="minidist.all_reduce"' in api, "the API reference was not generated"


def _nav_pages() -> set[str]:
    """The Markdown files named in mkdocs.yml's nav (read without a YAML parser)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return set(re.findall(r"([\w/.-]+\.md)\s*$", nav, re.M))


def test_every_page_is_in_the_nav_and_exists():
    nav = _nav_pages()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not nav - pages, f"in the nav but missing: {sorted(nav - pages)}"
    assert not pages - nav, f"not in mkdocs.yml's nav: {sorted(pages - nav)}"


def test_the_reference_covers_the_public_api():
    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: minidist\.(\w+)\s*$", text, re.M))
    errors = {n for n in minidist.__all__ if n.endswith("Error")}
    assert "::: minidist.errors" in text
    # collectives whose functions are generated from their catalog record (minidist.scan)
    # have a section of their own: mkdocstrings reads the source, where they are not
    generated = {rec.front.function: rec for rec in collectives.front_ends()}
    for name in generated:
        assert f"### minidist.{name}" in text, f"no section for minidist.{name}"
        section = text.split(f"### minidist.{name}", 1)[1].split("\n::: ", 1)[0]
        for param in inspect.signature(getattr(minidist, name)).parameters:
            assert param in section, f"minidist.{name}'s section does not name {param!r}"
    missing = sorted(set(minidist.__all__) - documented - errors - set(generated)
                     - {"__version__", "Store"})
    assert not missing, f"not in docs/reference/api.md: {missing}"
    assert "::: minidist.kvstore" in text  # Store


INTERNAL = re.compile(r"\bsession [0-9]|\bhouse plan\b|/work/shared|DESIGN\.md", re.I)


def test_no_internal_wording_in_docs_or_code():
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", *DOCS.rglob("*.md"),
             *(ROOT / "benchmarks").rglob("*.md"), *(ROOT / "minidist").rglob("*.py")]
    hits = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
            for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
            if INTERNAL.search(line)]
    assert not hits, "internal wording:\n" + "\n".join(hits)


def test_the_readme_says_how_to_build_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[docs]" && mkdocs build --strict' in readme
