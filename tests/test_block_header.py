"""native/strata_blocks.h is generated from strata_ref/types.py (tools/gen_block_header.py):
the committed file must be what the tool makes now, and its structs must
compile with the declared sizes and offsets."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from strata_ref.formats import oracle_types
from strata_ref.types import all_formats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gen_block_header  # noqa: E402


def test_committed_header_is_current():
    assert (ROOT / "native" / "strata_blocks.h").read_text() == gen_block_header.render_header(), (
        "native/strata_blocks.h is stale: run python tools/gen_block_header.py")


def test_check_mode_reports_a_stale_header(tmp_path, capsys):
    out = tmp_path / "strata_blocks.h"
    out.write_text("// an old header\n")
    assert gen_block_header.main(["--check", "-o", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
    assert gen_block_header.main(["-o", str(out)]) == 0
    assert gen_block_header.main(["--check", "-o", str(out)]) == 0


def test_header_lists_every_format_and_the_oracle_types():
    text = gen_block_header.render_header()
    for f in all_formats():
        assert f"    T_{f.name} = {int(f.type)}," in text
        assert f"static_assert(sizeof(block_{f.name.lower()}) == {f.block_bytes}," in text
    macro = text.split("#define STRATA_GENERIC_TYPES(X)", 1)[1].split("\n\n", 1)[0]
    assert macro.count("X(") == len(oracle_types())


def test_structs_compile_with_their_offsets(tmp_path):
    # A C++ program that prints sizeof and offsetof of every field, from the
    # header's structs, checked against strata_ref.types (the header's own
    # static_asserts stop the build first if one disagrees).
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    lines = ['#include <cstdio>', '#include "strata_blocks.h"', "using namespace strata;", "int main() {"]
    want = []
    for f in all_formats():
        s = f"block_{f.name.lower()}"
        lines.append(f'    printf("%zu %d %d\\n", sizeof({s}), Block<T_{f.name}>::B, Block<T_{f.name}>::QK);')
        want.append(f"{f.block_bytes} {f.block_bytes} {f.block_values}")
        for fld in f.fields:
            lines.append(f'    printf("%zu %d\\n", offsetof({s}, {fld.name}), Block<T_{f.name}>::o_{fld.name});')
            want.append(f"{fld.offset} {fld.offset}")
    lines += ["    return 0;", "}"]
    (tmp_path / "sizes.cpp").write_text("\n".join(lines) + "\n")
    exe = tmp_path / "sizes"
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", "-I", str(ROOT / "native"),
                    str(tmp_path / "sizes.cpp"), "-o", str(exe)], check=True, capture_output=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert got[:-1] == want
