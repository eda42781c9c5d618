"""The astropy testbed image and the per-instance images on top of it.

The testbed installs the pinned astropy wheel into ``/opt/venv`` and moves the installed package (Python
sources and compiled extensions) to ``/testbed/astropy``, found through a ``.pth`` file: no C compile, and
the code the tests import is the code in ``/testbed``. The testbed image has no git repository; each
instance image reverse-applies its gold patch (planting the bug) and commits the tree as a single root
commit, so the repository's history holds no trace of the fix.
"""

from __future__ import annotations

import shlex

from lumotree.tasks.api import TESTBED, VENV, Instance
from lumotree.tasks.rootfs import SANDBOX_UID, LayerSpec, build_base, build_layer, venv_script
from lumotree.tasks.synth.config import SynthConfig

# Fixed identity and dates: the same tree always gives the same commit, so base_commit is reproducible.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "lumotree",
    "GIT_AUTHOR_EMAIL": "lumotree@localhost",
    "GIT_COMMITTER_NAME": "lumotree",
    "GIT_COMMITTER_EMAIL": "lumotree@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    # Builds run as root in a /testbed owned by the sandbox user; git refuses that without this.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}
COMMIT_MESSAGE = "astropy-synth base"
GITIGNORE = "__pycache__/\n*.pyc\n*.so\n.pytest_cache/\n.hypothesis/\n"
PYTEST_INI = "[pytest]\nminversion = 7\naddopts = -p no:cacheprovider --color=no\nxfail_strict = true\n"
# The test command of every synthesized instance; test files are appended.
TEST_COMMAND = "pytest -rA --tb=short -p no:cacheprovider"


def git_env_exports() -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in GIT_ENV.items())


def git_init_script() -> str:
    """Shell: make /testbed a git repository whose single root commit holds the current tree."""
    msg = shlex.quote(COMMIT_MESSAGE)
    return f"{git_env_exports()}git init -q -b main . && git add -A && git commit -q -m {msg}\n"


def commit_tree_script() -> str:
    """Shell: print the sha of a root commit of the current /testbed tree (index updated, HEAD untouched)."""
    return (
        git_env_exports()
        + f'git add -A >/dev/null && git commit-tree "$(git write-tree)" -m {shlex.quote(COMMIT_MESSAGE)}\n'
    )


def testbed_spec(config: SynthConfig) -> LayerSpec:
    base = config.base.tag()
    script = (
        venv_script(["-r", "/opt/lumotree/requirements.txt"], extra_pip_args=["--no-deps"])
        + f"""
sp=$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p {TESTBED}
mv "$sp/astropy" {TESTBED}/astropy
echo {TESTBED} > "$sp/lumotree_testbed.pth"
cp /opt/lumotree/pytest.ini {TESTBED}/pytest.ini
cp /opt/lumotree/gitignore {TESTBED}/.gitignore
find {TESTBED} -name __pycache__ -prune -exec rm -rf {{}} +
rm -rf /opt/lumotree
chown -R {SANDBOX_UID}:{SANDBOX_UID} {TESTBED}
cd / && {VENV}/bin/python -c 'import astropy; assert astropy.__file__.startswith("{TESTBED}/")'
"""
    )
    return LayerSpec(
        name="astropy-synth-testbed",
        base=base,
        script=script,
        inputs={"astropy": config.astropy_version},
        files={
            "/opt/lumotree/requirements.txt": config.requirements.encode(),
            "/opt/lumotree/pytest.ini": PYTEST_INI.encode(),
            "/opt/lumotree/gitignore": GITIGNORE.encode(),
        },
    )


def build_testbed(config: SynthConfig, *, log: object = None) -> str:
    """Build (or find) the base and testbed images; returns the testbed tag."""
    build_base(config.base, log=log)
    return build_layer(testbed_spec(config), log=log)


def instance_spec(testbed: str, instance: Instance) -> LayerSpec:
    script = f"""cd {TESTBED}
git apply -R /opt/lumotree/gold.patch
rm -rf /opt/lumotree
{git_init_script()}head=$(git rev-parse HEAD)
want={shlex.quote(instance.base_commit)}
[ "$head" = "$want" ] || {{ echo "base commit $head != $want"; exit 1; }}
find {TESTBED} ! -user {SANDBOX_UID} -exec chown -h {SANDBOX_UID}:{SANDBOX_UID} {{}} +
"""
    return LayerSpec(
        name="astropy-synth",
        base=testbed,
        script=script,
        inputs={"instance_id": instance.instance_id, "base_commit": instance.base_commit},
        files={"/opt/lumotree/gold.patch": instance.patch.encode()},
    )


def build_instance_image(testbed: str, instance: Instance, *, build: bool = True, log: object = None) -> str:
    spec = instance_spec(testbed, instance)
    if not build:
        from lumotree.tasks.rootfs import image_exists

        if not image_exists(spec.tag()):
            raise LookupError(f"image {spec.tag()} for {instance.instance_id} is not built")
        return spec.tag()
    return build_layer(spec, log=log)
