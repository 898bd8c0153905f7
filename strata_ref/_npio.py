"""The .npy / .npz files a user names: read with one clear line for any
file that is not one (empty, cut short, damaged, text, a directory, a
device, a symbolic link loop), never unpickled; and output files written
under exactly the name given, through a temporary file of a unique name
beside it that is renamed into place (`atomic_output`).

Errors are `NpyError` (a ValueError): one line that starts with `what`
(the option and path, e.g. "--activations x.npy")."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import zipfile

import numpy as np

from ._paths import unreachable

__all__ = ["user_mode", "NpyError", "input_problem", "read_npy", "read_npz", "atomic_output"]

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


class NpyError(ValueError):
    """An input that is not the .npy / .npz file asked for (one line)."""


def input_problem(path) -> str | None:
    """Why `path` cannot be read as an input file, in words (no path), or
    None: no such file, a symbolic link loop or a link to nothing, a
    directory, not a regular file (a device, a FIFO: never read, they may
    be endless or block), or empty."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return unreachable(path) or "no such file"
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a device, pipe or socket)"
    if st.st_size == 0:
        return "an empty file (0 bytes)"
    return None


def _npy_header(f, where: str, ask: str):
    """(shape, dtype) of the .npy stream f, positioned at its data."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"version {version}")
    except (ValueError, EOFError, SyntaxError, OSError) as e:
        raise NpyError(f"{where}: a damaged .npy header ({str(e).splitlines()[0][:80]}); {ask}") from None
    if dtype.hasobject:
        raise NpyError(f"{where}: holds Python objects, not numbers; {ask}")
    return shape, dtype, fortran


def _read_data(f, shape, dtype, fortran, size, where: str, ask: str) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size is not None and size < n:
        raise NpyError(f"{where}: the header says {dtype} {tuple(shape)}, {n} bytes, the file holds "
                       f"{size}; is it cut short?")
    raw = f.read(n)
    if len(raw) != n:
        raise NpyError(f"{where}: truncated: {len(raw)} of {n} data bytes; {ask}")
    return np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran else "C").copy()


def read_npy(path, what: str, ask: str) -> np.ndarray:
    """The array of the .npy file `path`. what: the option naming it
    ("--activations"); ask: what to give instead ("give float32 (tokens,
    cols) saved with numpy.save"), appended to each error. Raises NpyError
    (one line) for a file that is not a regular, complete .npy file of
    numbers. what "" : the messages start with the path alone."""
    where = f"{what} {path}" if what else str(path)
    bad = input_problem(path)
    if bad:
        raise NpyError(f"{where}: {bad}")
    with open(path, "rb") as f:
        magic = f.read(6)
        if magic[:4] == ZIP_MAGIC:
            raise NpyError(f"{where}: a .npz archive, not a .npy array; {ask}")
        if magic != NPY_MAGIC:
            raise NpyError(f"{where}: not a .npy file (no NumPy header); {ask}")
        f.seek(0)
        shape, dtype, fortran = _npy_header(f, where, ask)
        size = os.fstat(f.fileno()).st_size - f.tell()
        return _read_data(f, shape, dtype, fortran, size, where, ask)


def read_npz(path, what: str) -> dict:
    """{name: array} of every member of the .npz archive `path` (names
    without `.npy`). Raises NpyError (one line) for a file that is not a
    regular, complete zip archive of .npy members: cut short, a member
    whose CRC or header is wrong (named), a member of Python objects."""
    where = f"{what} {path}" if what else str(path)
    ask = "give a .npz archive written by numpy.savez"
    bad = input_problem(path)
    if bad:
        raise NpyError(f"{where}: {bad}")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            zip_head = f.read(4) == ZIP_MAGIC
        raise NpyError(f"{where}: " + ("a zip archive cut short or damaged (no zip directory at its end)"
                                       if zip_head else "not a .npz archive (not a zip file)") + f"; {ask}") from None
    except OSError as e:
        raise NpyError(f"{where}: cannot be read ({e.strerror or e})") from None
    out = {}
    with zf:
        for info in zf.infolist():
            m = info.filename
            mw = f"{where}: member {m!r}"
            if not m.endswith(".npy"):
                raise NpyError(f"{mw} is not an .npy array; {ask}")
            try:
                with zf.open(info) as f:
                    shape, dtype, fortran = _npy_header(f, mw, ask)
                    out[m[:-4]] = _read_data(f, shape, dtype, fortran, None, mw, ask)
            except zipfile.BadZipFile as e:
                raise NpyError(f"{mw} is damaged ({e}); {ask}") from None
            except (OSError, EOFError, NotImplementedError) as e:
                raise NpyError(f"{mw} cannot be read ({e}); {ask}") from None
    return out


@contextlib.contextmanager
def atomic_output(path):
    """A binary file object whose content becomes the file `path` (exactly
    that name; through a symbolic link, its target; with the mode a new
    file gets under the umask, not mkstemp's 0600) when the `with` block
    ends without an error. Written to a temporary file of a unique name
    in the same directory (`NAME.<random>.part`, so that two runs never
    share one) and renamed over `path`; an error or Ctrl-C inside the
    block removes it and leaves the old `path`, if any, whole."""
    real = os.path.realpath(path)
    d, name = os.path.split(real)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=name + ".", suffix=".part")
    try:
        user_mode(fd)
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def user_mode(fd: int) -> None:
    """Give the file open as `fd` the mode `open()` would give a new file
    (0666 less the umask): `tempfile.mkstemp` makes it 0600, which a
    rename would keep, so another account could not read the output."""
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)
