"""A built wheel is a complete package: it carries conf/ (a non-editable install runs from any
directory), the license, and the build prints no setuptools deprecation warnings."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["flashnum", "conf", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """pip wheel of a copy of the sources (the build writes build/ and *.egg-info in place)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, symlinks=True,  # flashnum/conf stays a link
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (whl,) = out.glob("flashnum-*.whl")
    return whl, p.stdout + p.stderr


def test_the_wheel_carries_every_config_file_byte_for_byte(wheel):
    whl, _ = wheel
    with zipfile.ZipFile(whl) as z:
        shipped = {n.removeprefix("flashnum/conf/"): z.read(n) for n in z.namelist()
                   if n.startswith("flashnum/conf/")}
    source = {f.relative_to(REPO / "conf").as_posix(): f.read_bytes()
              for f in (REPO / "conf").rglob("*.yaml")}
    assert "config.yaml" in source and shipped == source


def test_the_wheel_states_its_license_as_an_spdx_expression_with_the_file(wheel):
    whl, _ = wheel
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
        lic = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert b"License-Expression: MIT" in meta and len(lic) == 1


def test_building_prints_no_setuptools_deprecation_warning(wheel):
    _, log = wheel
    assert "SetuptoolsDeprecationWarning" not in log and "is deprecated" not in log


@pytest.mark.slow
def test_the_unpacked_wheel_runs_an_experiment_from_another_directory(wheel, tmp_path):
    whl, _ = wheel
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    p = subprocess.run([sys.executable, "-m", "flashnum.run", "experiment=smoke", "dry_run=true",
                        f"store.root={tmp_path / 'x'}"], cwd=cwd, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "smoke: 48 cases in the grid" in p.stdout
    q = subprocess.run([sys.executable, "-c", "import flashnum.store.paths as p; print(p.CONF)"],
                       cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)})
    assert Path(q.stdout.strip()) == site / "flashnum" / "conf"


def _target(make: str, name: str) -> str:
    return make[make.index(f"\n{name}:"):].split("\n\n")[0]


def test_make_test_runs_every_test_ci_runs_and_ci_calls_it_once():
    """`make test` is the whole suite (no marker deselected) and CI runs it once; the
    split stays available: test-fast deselects the marker slow, test-slow selects it.
    Every `make test...` line of README's quick start is a target, and setup installs the
    Triton kernel's extra."""
    make = (REPO / "Makefile").read_text()
    test, fast, slow = (_target(make, n) for n in ("test", "test-fast", "test-slow"))
    for t in (test, fast, slow):
        assert "setup" in t.splitlines()[1] and "pytest" in t
    assert "slow" not in test.split("pytest", 1)[1]
    assert '-m "not slow"' in fast and "-m slow" in slow
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert [ln for ln in ci if ln.startswith("make test")] == ["make test"]
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):]
    quick = quick[:quick.index("\n## ", 1)]
    for ln in quick.splitlines():
        if ln.startswith("make test"):
            assert f"\n{ln.split('#')[0].split()[1]}:" in make
    install = [ln for ln in make.splitlines() if "pip install" in ln and "-e" in ln]
    assert len(install) == 1 and "triton" in install[0].split("[")[1].split("]")[0].split(",")


def _files_under(d: Path) -> set[str]:
    return {p.relative_to(d).as_posix() for p in d.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_installed_run_and_figures_write_only_under_the_working_folder(wheel, tmp_path):
    """A non-editable install (the unpacked wheel alone on the path) run from an empty
    folder: the store, Hydra's multirun files and the figures go under that folder, and
    not one file appears inside the installed package."""
    whl, _ = wheel
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    installed = _files_under(site)
    cwd = tmp_path / "empty"
    cwd.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1",
           "HOME": str(tmp_path / "home")}
    small = ["shape.seq_len_q=32", "shape.head_dim=16", "tiling.block_n=16", "n_jobs=1",
             "progress=false"]
    for args in (["flashnum.run", *small], ["flashnum.run", "-m", "precision=fp16,bf16",
                                            "name=mine", *small], ["flashnum.figures"]):
        p = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                           text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
    assert _files_under(site) == installed  # nothing written inside the package
    assert sorted(x.name for x in cwd.iterdir()) == ["experiments", "paper"]
    tables = sorted(x.name for x in (cwd / "experiments").iterdir())
    assert tables == [".hydra", "mine", "single"]  # Hydra's own files under the store
    assert (cwd / "paper" / "figures" / "numbers.tex").is_file()
