"""Environments per era of the repository, following SWE-bench's astropy specs, and the test command.

SWE-bench runs astropy 4.x-5.x on Python 3.9 with a pinned test stack, installs with ``pip install -e
.[test]`` and tests with ``pytest -rA``; its 1.3-era instances ran on Python 3.6. The oldest Debian release
still on the mirror is bullseye (Python 3.9), so the old era runs there too, with the last pins that build and
test those sources on 3.9 (numpy 1.19, pytest 4.6, Cython re-generating the C files).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from packaging.version import Version

from lumotree.tasks.api import Instance

START_MARK = ">>>>> Start Test Output"
END_MARK = ">>>>> End Test Output"


@dataclass(frozen=True)
class Era:
    """A Python environment that builds and tests a range of releases."""

    name: str  # short label, part of image tags
    python: str  # Python version of the Debian release below
    debian: str  # Debian codename providing that Python
    min_release: str  # first release this era serves (inclusive)
    pins: tuple[str, ...]  # exact requirements installed into the venv before the package
    test_extras: (
        bool  # install the package with its ``[test]`` extra (the old era's extra drags in new plugins)
    )
    # Shell lines run in the source tree before building (why: pre-generated C from old Cython breaks on 3.9).
    source_fixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert all("==" in p or "<" in p for p in self.pins), "era pins must be exact or bounded"


# SWE-bench's pins for astropy 4.1-5.3 plus the build requirements --no-build-isolation needs.
MODERN = Era(
    name="py39",
    python="3.9",
    debian="bullseye",
    min_release="4.0",
    pins=(
        "attrs==23.1.0",
        "exceptiongroup==1.1.3",
        "execnet==2.0.2",
        "hypothesis==6.82.6",
        "iniconfig==2.0.0",
        "numpy==1.25.2",
        "packaging==23.1",
        "pluggy==1.3.0",
        "psutil==5.9.5",
        "pyerfa==2.0.0.3",
        "pytest-arraydiff==0.5.0",
        "pytest-astropy-header==0.2.2",
        "pytest-astropy==0.10.0",
        "pytest-cov==4.1.0",
        "pytest-doctestplus==1.0.0",
        "pytest-filter-subpackage==0.1.2",
        "pytest-mock==3.11.1",
        "pytest-openfiles==0.5.0",
        "pytest-remotedata==0.4.0",
        "pytest-xdist==3.3.1",
        "pytest==7.4.0",
        "PyYAML==6.0.1",
        "setuptools==68.0.0",
        "sortedcontainers==2.4.0",
        "tomli==2.0.1",
        "cython==0.29.34",
        "extension-helpers==1.0.0",
        "setuptools_scm==7.1.0",
        "jinja2==2.10.3",
        "markupsafe==2.0.1",
        "wheel==0.41.2",
    ),  # fmt: skip
    test_extras=True,
)

# The 1.3/3.x era (SWE-bench: Python 3.6) moved to Python 3.9 with the last pins that still work there.
LEGACY = Era(
    name="py39-legacy",
    python="3.9",
    debian="bullseye",
    min_release="0",
    pins=(
        "setuptools==49.6.0",
        "numpy==1.19.5",
        "cython==0.29.34",
        "pytest==4.6.11",
        "pytest-doctestplus==0.5.0",
        "pytest-remotedata==0.3.2",
        "pytest-openfiles==0.4.0",
        "pytest-arraydiff==0.3",
        "hypothesis<5",
        "pytest-mock==1.13.0",
        "wheel==0.37.1",
        "attrs==19.3.0",
        "pyyaml==5.4.1",
    ),  # fmt: skip
    test_extras=False,
    source_fixes=(
        # Generated C beside its .pyx came from an old Cython that does not compile for 3.9: regenerate it.
        'find astropy -name "*.pyx" | while read -r f; do rm -f "${f%.pyx}.c"; done',
        "rm -f astropy/cython_version.py",
    ),
)

ERAS = (MODERN, LEGACY)  # newest first: a release belongs to the first era whose floor it reaches


def era_for(release: str) -> Era:
    version = Version(release)
    return next(e for e in ERAS if version >= Version(e.min_release))


def test_command(instance: Instance) -> str:
    """The test command of the instance: the one between SWE-bench's markers in its eval script, else the
    command SWE-bench's specs give its version (``pytest -rA`` on the test patch's files; classic verbose
    output for the 1.x era) - so rows without an eval script still run the same way."""
    if instance.eval_script:
        lines = instance.eval_script.splitlines()
        starts = [i for i, line in enumerate(lines) if START_MARK in line]
        ends = [i for i, line in enumerate(lines) if END_MARK in line]
        if starts and ends and ends[0] > starts[0]:
            body = [ln.strip() for ln in lines[starts[0] + 1 : ends[0]] if ln.strip()]
            if body:
                return " && ".join(body)
    files = [f for f in re.findall(r"^\+\+\+ b/(\S+)", instance.test_patch, re.M)]
    files = files or [t.split("::", 1)[0] for t in instance.FAIL_TO_PASS if "::" in t]
    flags = "-rA"
    version = instance.version.lstrip("v")
    if version and Version(version) < Version("3.0"):
        flags = "-rA -vv -o console_output_style=classic --tb=no"
    return f"pytest {flags} " + " ".join(shlex.quote(f) for f in dict.fromkeys(files))
