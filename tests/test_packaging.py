"""A regular (non-editable) wheel carries native/ and golden/, and the code finds
them in both layouts: the source checkout and the copy inside the package."""
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from strata_ref._paths import DATA_DIRS, data_dir

ROOT = Path(__file__).resolve().parents[1]
NATIVE_PATTERNS = ("*.cu", "*.cuh", "*.h", "*.cpp")
# What a wheel build reads: the project files, not caches or build outputs.
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.nbi", "*.nbc", "*.egg-info")


def _shipped(name: str) -> list[Path]:
    """Files of the checkout's data directory `name` that a wheel must carry."""
    d = ROOT / name
    if name == "native":
        return sorted(p for pat in NATIVE_PATTERNS for p in d.glob(pat))
    return sorted(d.rglob("*.json"))


def _fake_package(root: Path, golden: bool, checkout: bool) -> Path:
    """A minimal strata_ref under root (just _paths.py), optionally with an
    installed golden copy and/or a checkout's pyproject.toml and golden/."""
    pkg = root / "strata_ref"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(ROOT / "strata_ref" / "_paths.py", pkg / "_paths.py")
    if golden:
        (pkg / "_golden").mkdir()
    if checkout:
        (root / "pyproject.toml").write_text("")
        (root / "golden").mkdir()
    return root


def _where(root: Path, call: str) -> str:
    """Run `call` (an expression over data_dir) with only the fake package importable."""
    code = f"from strata_ref._paths import data_dir\ntry:\n    print({call})\n" \
           "except Exception as e:\n    print(type(e).__name__)"
    p = subprocess.run([sys.executable, "-S", "-c", code], cwd=root, capture_output=True,
                       text=True, timeout=60, env={"PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


# ---------------------------------------------------------------- the locator

def test_checkout_layout_is_found():
    assert data_dir("native") == ROOT / "native"
    assert data_dir("golden") == ROOT / "golden"
    assert data_dir("golden", checkout_only=True) == ROOT / "golden"


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown data directory 'tools'"):
        data_dir("tools")


def test_installed_copy_when_no_checkout(tmp_path):
    root = _fake_package(tmp_path, golden=True, checkout=False)
    assert _where(root, 'data_dir("golden")') == str(root / "strata_ref" / "_golden")
    # writers never get the copy inside the package
    assert _where(root, 'data_dir("golden", checkout_only=True)') == "FileNotFoundError"
    # nothing shipped for native/ in this fake package
    assert _where(root, 'data_dir("native")') == "FileNotFoundError"


def test_checkout_wins_over_installed_copy(tmp_path):
    root = _fake_package(tmp_path, golden=True, checkout=True)
    assert _where(root, 'data_dir("golden")') == str(root / "golden")


def test_site_packages_without_pyproject_is_not_a_checkout(tmp_path):
    # a stray golden/ beside the package (e.g. in site-packages) is not a checkout
    root = _fake_package(tmp_path, golden=True, checkout=False)
    (root / "golden").mkdir()
    assert _where(root, 'data_dir("golden")') == str(root / "strata_ref" / "_golden")


# ---------------------------------------------------------------- the wheel

def _can_build_without_isolation() -> bool:
    import setuptools
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    # bdist_wheel is in setuptools from 70.1; before that it comes from `wheel`
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _can_build_without_isolation():
        pytest.skip("building a wheel offline needs setuptools >= 70.1 or the `wheel` package")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"   # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    for d in ("strata_ref", "native", "golden"):
        shutil.copytree(ROOT / d, src / d, ignore=_SKIP)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(tmp / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = (tmp / "dist").glob("strata_ref-*.whl")
    return whl


def test_wheel_carries_native_sources_and_golden_files(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name, inside in DATA_DIRS.items():
            files = _shipped(name)
            assert files, name
            for f in files:
                arc = f"strata_ref/{inside}/{f.relative_to(ROOT / name).as_posix()}"
                assert arc in names, arc
                assert z.read(arc) == f.read_bytes(), arc
    # the build flags and the cdef headers the loaders read are among them
    for f in ("api.cu", "strata_dequant.h", "strata_gemm.h", "strata_mmvq.h", "mmvq.cu", "gemm.cu"):
        assert f"strata_ref/_native_src/{f}" in names
    assert "strata_ref/_golden/corpus.json" in names


def test_wheel_has_every_subpackage(wheel):
    # pyproject.toml lists the packages by hand (for the directory mapping):
    # a subpackage missing from that list would silently leave the wheel.
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for init in (ROOT / "strata_ref").rglob("__init__.py"):
        if "__pycache__" not in init.parts:
            assert init.relative_to(ROOT).as_posix() in names, init
    for py in (ROOT / "strata_ref").rglob("*.py"):
        if "__pycache__" not in py.parts:
            assert py.relative_to(ROOT).as_posix() in names, py


def test_installed_wheel_finds_its_copies(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    code = ("import strata_ref, strata_ref.native.build as b, strata_ref.golden as g\n"
            "print(strata_ref.__file__); print(b.source_dir()); print(g.default_golden_dir())\n"
            "try:\n    g.default_golden_dir(for_writing=True)\n"
            "except ValueError as e:\n    print('ValueError', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "STRATA_REF_NATIVE_SRC"}
    env["PYTHONPATH"] = str(site)   # ahead of any editable install of the checkout
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    init, native, golden, err = p.stdout.strip().splitlines()
    assert Path(init) == site / "strata_ref" / "__init__.py"
    assert Path(native) == site / "strata_ref" / "_native_src"
    assert Path(golden) == site / "strata_ref" / "_golden"
    assert err.startswith("ValueError") and "not in a source checkout" in err
