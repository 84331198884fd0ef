"""`pip install .[jetson]` on a JetPack 6 Jetson (Python 3.10, aarch64, glibc 2.35) resolves to binary wheels,
and so do the extras scripts/setup.sh adds there (test, analysis, bench, serve): pyproject.toml's requirements, markers evaluated
for that platform, resolved by pip against the package index for that interpreter and platform (a dry run into a
target folder: pip takes --platform only with --target). Skipped, with the reason, where the index cannot be
reached."""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.conftest import ROOT

try:
    import tomllib  # novm (3.11+, guarded: tomli below)
except ModuleNotFoundError:              # Python 3.10 (JetPack 6): tomllib is 3.11's; the test extra brings tomli there
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None

# JetPack 6.1/6.2 = Ubuntu 22.04 (glibc 2.35) on aarch64 with its system Python 3.10.
JETPACK6 = {**default_environment(), "python_version": "3.10", "python_full_version": "3.10.12",
            "platform_machine": "aarch64", "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORMS = [f"manylinux_2_{v}_aarch64" for v in range(35, 16, -1)] + ["manylinux2014_aarch64"]
# Not resolved here, on purpose: torch comes from NVIDIA's JetPack wheel (the index's aarch64 torch is a server CUDA
# build that does not run on a Jetson, and pulls gigabytes of CUDA wheels); accelerate, which depends on torch, is
# checked without its dependencies.
FROM_JETPACK = {"torch"}
WITHOUT_DEPS = {"accelerate"}
OFFLINE = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                     r"Network is unreachable|Could not fetch URL|ConnectionError|ReadTimeoutError", re.I)


EXTRAS = ("jetson", "test", "analysis", "bench", "serve")      # what scripts/setup.sh installs on a Jetson


def test_extras_are_what_setup_installs_on_a_jetson():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    base = re.search(r'^EXTRAS="([a-z,]+)"$', setup, re.M).group(1).split(",")
    added = re.findall(r'EXTRAS="\$EXTRAS,([a-z,]+)"', setup)
    assert sorted(base + [e for a in added for e in a.split(",")]) == sorted(EXTRAS)


def jetson_requirements() -> list[Requirement]:
    """Core requirements plus the extras of a Jetson install whose markers hold on JetPack 6."""
    if tomllib is None:
        pytest.skip(f"Python {sys.version_info.major}.{sys.version_info.minor} has no tomllib and tomli is not "
                    "installed: pip install -e .[test]")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in EXTRAS for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({**JETPACK6, "extra": ""})]


def _pip(reqs: list[str], target, deps: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--python-version", "3.10", "--implementation", "cp", "--target", str(target), "--quiet",
           "--disable-pip-version-check"] + [a for p in PLATFORMS for a in ("--platform", p)]
    return subprocess.run(cmd + ([] if deps else ["--no-deps"]) + reqs, capture_output=True, text=True, timeout=900)


def test_jetson_extra_resolves_for_python310_aarch64(tmp_path):
    reqs = jetson_requirements()
    names = {r.name for r in reqs}
    assert {"triton", "onnxruntime", "jetson-stats"} <= names and "pycuda" not in names, names
    full = [str(r) for r in reqs if r.name not in FROM_JETPACK | WITHOUT_DEPS]
    bare = [str(r) for r in reqs if r.name in WITHOUT_DEPS]
    for group, deps in ((full, True), (bare, False)):
        out = _pip(group, tmp_path / ("deps" if deps else "bare"), deps)
        if out.returncode != 0 and OFFLINE.search(out.stderr):
            pytest.skip(f"the package index cannot be reached: {OFFLINE.search(out.stderr).group(0)}")
        assert out.returncode == 0, f"no Python 3.10 aarch64 wheel for {group}:\n{out.stderr[-2000:]}"


# -- JetPack as it is: what setup.sh checks first on a Jetson, and the set-up the docs give --------------------------

def _setup_as_on_a_jetson(python, tmp_path) -> subprocess.CompletedProcess:
    """setup.sh as on a Jetson; a pip that gets that far fails at once (a constraints file that does not exist, no
    index), so a check that no longer stops it installs nothing."""
    env = {**os.environ, "BITNEST_JETSON": "1", "PYTHON": str(python), "PIP_NO_INDEX": "1",
           "PIP_CONSTRAINT": str(tmp_path / "no-such-constraints.txt")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("system_site, fix", [(False, "--system-site-packages"), (True, "python3-libnvinfer")])
def test_setup_on_a_jetson_names_a_tensorrt_it_cannot_import(tmp_path, system_site, fix):
    """A venv that cannot see the system site-packages (where JetPack's apt puts tensorrt) and a Python without
    tensorrt at all: setup.sh stops before installing anything, in one line naming the fix."""
    import venv
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here")
    venv.create(tmp_path / "venv", system_site_packages=system_site, with_pip=False)
    r = _setup_as_on_a_jetson(tmp_path / "venv" / "bin" / "python", tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and fix in lines[0] and "tensorrt" in lines[0], r.stderr


def _jetson_blocks(text: str) -> list[str]:
    return [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "--system-site-packages" in b]


def test_readme_and_tensorrt_doc_give_the_same_two_command_jetson_setup():
    readme = _jetson_blocks((ROOT / "README.md").read_text())
    doc = [textwrap.dedent(b) for b in _jetson_blocks((ROOT / "docs" / "tensorrt.md").read_text())]
    assert len(readme) == 1 and [b.strip() for b in doc] == [readme[0].strip()], (readme, doc)
    commands = readme[0].strip().splitlines()
    assert len(commands) == 2 and "python3-dev" in commands[0] and "scripts/setup.sh" in commands[1]


# -- torch on a CPU machine: never the package index's CUDA build --------------------------------------------------

def test_setup_on_a_cpu_machine_without_a_cpu_wheel_stops_instead_of_taking_the_cuda_build(tmp_path):
    """A Python without torch on a machine with no NVIDIA GPU, no wheel in pip's find-links and no CPU wheel at the
    CPU index (here an empty local index): setup.sh stops in one line naming the CPU index's install command (exit 1)
    and installs no torch. It never falls back to the package index's torch, the multi-GB CUDA build a plain
    `pip install torch==2.13.0` takes on Linux (which pulled 2.14.1+cu130 and 6 GB of CUDA wheels into a Python 3.10
    venv, whose version has no CPU wheel on this machine's disk). Every index here is the empty one, so a fallback put
    back fails in pip's own words, not the one line."""
    import venv
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    empty = tmp_path / "index"
    (empty / "torch").mkdir(parents=True)
    env = {**os.environ, "PYTHON": str(python), "BITNEST_JETSON": "0", "BITNEST_TORCH_BUILD": "cpu",
           "BITNEST_TORCH_CPU_INDEX": empty.as_uri(), "PIP_INDEX_URL": empty.as_uri(),
           "PIP_EXTRA_INDEX_URL": empty.as_uri(), "PIP_FIND_LINKS": str(empty / "torch")}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                       timeout=300)
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("setup.sh:")]
    assert r.returncode == 1 and len(ours) == 1, r.stderr[-2000:]
    assert "no CPU wheel of torch 2.13.0" in ours[0] and f"--index-url {empty.as_uri()}" in ours[0], ours
    installed = subprocess.run([str(python), "-c", "import importlib.util; print(importlib.util.find_spec('torch'))"],
                               capture_output=True, text=True)
    assert installed.stdout.strip() == "None", installed.stdout
