"""Where the repository's data directories are, in a checkout or an installed
wheel; and what a path that cannot be reached is (`unreachable`).

The CUDA sources (`native/`) and the golden files (`golden/`) live at the top of
the repository (DESIGN.md fixes that layout). A checkout (or `pip install -e .`)
reads them there; a regular wheel carries copies inside the package, as
`strata_ref/_native_src/` and `strata_ref/_golden/` (pyproject.toml maps those
package names onto the two directories). `data_dir` is the one place that
chooses between the two layouts.
"""
from __future__ import annotations

import errno
import os
from importlib import resources
from pathlib import Path

__all__ = ["DATA_DIRS", "data_dir", "unreachable"]

#: repository directory -> its name inside an installed package
DATA_DIRS = {"native": "_native_src", "golden": "_golden"}


def data_dir(name: str, *, checkout_only: bool = False) -> Path:
    """The directory `name` ("native" or "golden") as a filesystem path.

    Looks in the source checkout first (the directory next to the package,
    when a pyproject.toml sits beside it), then in the copy an installed
    wheel ships inside the package (`importlib.resources`). checkout_only:
    skip the installed copy (for writers, which must not write into
    site-packages). Raises ValueError for another name, FileNotFoundError
    when neither layout has the directory.
    """
    if name not in DATA_DIRS:
        raise ValueError(f"unknown data directory {name!r} (one of {', '.join(DATA_DIRS)})")
    pkg = Path(__file__).resolve().parent
    cands = [pkg.parent / name] if (pkg.parent / "pyproject.toml").is_file() else []
    if not checkout_only:
        cands.append(Path(str(resources.files("strata_ref") / DATA_DIRS[name])))
    for c in cands:
        if c.is_dir():
            return c
    where = ", ".join(str(c) for c in cands) if cands else f"{pkg} is not in a source checkout"
    raise FileNotFoundError(f"no {name}/ directory ({where})")


def unreachable(path) -> str | None:
    """Why `path` cannot be reached although a directory entry of that name
    exists, in words, or None: "a symbolic link loop (it leads back to
    itself)" (ELOOP), or "a symbolic link to 'TARGET', which does not
    exist". None when there is no such entry or the path can be reached."""
    path = os.fspath(path)
    try:
        os.stat(path)
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop (it leads back to itself)"
        if e.errno != errno.ENOENT or not os.path.islink(path):
            return None
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return f"a symbolic link to {target!r}, which does not exist"
