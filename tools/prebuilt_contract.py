"""Where two GCC versions fuse multiply-adds differently in ggml-cpu.

node-llama-cpp 3.21.1's libraries (llama.cpp v0.4.0) were compiled by GCC
11.4, this project's llama-cpp-python peer builds by the machine's GCC 12.2.
ggml builds C as gnu11 and C++ as gnu++17, where GCC's default is
`-ffp-contract=fast`: the compiler may fuse any `a*b + c` it sees, plain C
or intrinsic `_mm*_mul_ps` + `_mm*_add_ps` (GCC writes those as vector
operators), and which ones it fuses depends on its version. This tool
compiles the ggml-cpu sources of one CPU variant with both compilers and
`-g`, maps every floating-point multiply, add, subtract and fused
multiply-add instruction to its source line (`objdump -dl`, inlined code
included), and lists the source lines whose fused and unfused counts differ
between the two:

    apt-get install g++-11                     # Debian 12: GCC 11.3
    python tools/prebuilt_contract.py [--variant zen4] [--a g++-11] [--b g++]
        [--files ops.cpp,vec.cpp,...] [--json OUT]

It needs `python tools/prebuilt_ref.py fetch` (the llama.cpp v0.4.0 source),
cmake and the two compilers. The compile commands are CMake's for the
variant's target (`compile_commands.json`, `-DGGML_CPU_ALL_VARIANTS=ON
-DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF`, Release), with
the compiler swapped and `-g` added (debug information does not change
code generation). Objects go to a temporary folder.

Listed are groups of adjacent source lines where the share of multiplies
and adds left apart differs between the two compilers (`differing`): places
where the two builds can round differently. Both compilers can also fuse
the same number of operations but pair them differently (rare), and a
listed group can be harmless (a product by a power of two, a loop whose
copies differ); the listed lines are where to look, the bits are the judge
(tools/prebuilt_ref.py `compare`).
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

FUSED = re.compile(r"^v?f(n?m(add|sub)|madd|msub)[0-9]*[ps][sdh]$")
UNFUSED = re.compile(r"^v?(mul|add|sub)[ps][sdh]$")


def compile_commands(src: Path, variant: str, build: Path) -> list:
    """[(source file, argv)] of the variant's ggml-cpu target, from CMake."""
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                    "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_NATIVE=OFF",
                    "-DGGML_OPENMP=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_COMMON=OFF"], check=True, capture_output=True)
    out = []
    for e in json.loads((build / "compile_commands.json").read_text()):
        if f"ggml-cpu-{variant}.dir/" in e.get("output", e["command"]):
            out.append((e["file"], shlex.split(e["command"])))
    return out


def counts(obj: Path) -> dict:
    """{"file:line": Counter(fused=..., unfused=...)} of one object file."""
    text = subprocess.run(["objdump", "-dl", "--inlines", "--no-show-raw-insn", str(obj)],
                          check=True, capture_output=True, text=True).stdout
    where, chain, out = None, [], {}
    for line in text.splitlines():
        m = re.match(r"^(?:inlined by )?([^\s:][^\s:]*):(\d+)", line)
        if m:
            # a location, innermost first, then the "inlined by" callers:
            # the innermost one in ggml's own source (not a compiler header)
            if not line.startswith("inlined by "):
                chain = []
            chain.append(f"{m.group(1)}:{m.group(2)}")
            own = [c for c in chain if not c.startswith("/usr/")]
            where = own[0] if own else chain[0]
            continue
        parts = line.split("\t")
        if len(parts) < 2 or where is None:
            continue
        op = parts[1].split()[0] if parts[1].split() else ""
        if FUSED.match(op):
            out.setdefault(where, Counter())["fused"] += 1
        elif UNFUSED.match(op):
            out.setdefault(where, Counter())["unfused"] += 1
    return out


def build(cmds, compiler: str, files, outdir: Path) -> dict:
    total = {}
    for src, argv in cmds:
        if files and Path(src).name not in files:
            continue
        cxx = src.endswith((".cpp", ".cc"))
        comp = compiler if cxx else compiler.replace("g++", "gcc")
        # drop the original -o target and the dependency outputs
        clean, skip = [comp], False
        for a in argv[1:]:
            if skip:
                skip = False
                continue
            if a in ("-MF", "-MT", "-o"):
                skip = True
                continue
            if a == "-MD":
                continue
            clean.append(a)
        obj = outdir / (Path(src).name + ".o")
        subprocess.run(clean + ["-g", "-o", str(obj)], check=True)
        for k, v in counts(obj).items():
            total.setdefault(k, Counter()).update(v)
    return total


def differing(ca: dict, cb: dict) -> list:
    """[(file, [lines], counts a, counts b)] of the places where one
    compiler leaves a multiply and an add apart and the other does not.

    Per source line the two compilers can attribute instructions to
    neighbouring lines and keep a different number of inlined or unrolled
    copies, so lines whose counts differ are merged with adjacent differing
    lines (gaps of one line) and a group is kept only if its share of unfused
    operations differs: a group whose operations are all fused (explicit
    FMA intrinsics) in both, or whose fused / unfused ratio is the same,
    is not a contraction difference."""
    diff = {}
    for k in set(ca) | set(cb):
        x, y = ca.get(k, Counter()), cb.get(k, Counter())
        if (x["fused"], x["unfused"]) != (y["fused"], y["unfused"]):
            path, line = k.rsplit(":", 1)
            diff.setdefault(path, []).append(int(line))
    out = []
    for path, lines in sorted(diff.items()):
        lines.sort()
        groups = [[lines[0]]]
        for ln in lines[1:]:
            if ln - groups[-1][-1] <= 2:
                groups[-1].append(ln)
            else:
                groups.append([ln])
        for g in groups:
            x, y = Counter(), Counter()
            for ln in g:
                x.update(ca.get(f"{path}:{ln}", Counter()))
                y.update(cb.get(f"{path}:{ln}", Counter()))
            # unfused share: a*b+c left apart counts 2 unfused, fused 1
            ra = x["unfused"] * (y["fused"] + y["unfused"])
            rb = y["unfused"] * (x["fused"] + x["unfused"])
            if ra != rb:
                out.append((path, g, x, y))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="zen4")
    ap.add_argument("--a", default="g++-11", help="first C++ compiler (its gcc is used for C)")
    ap.add_argument("--b", default="g++", help="second C++ compiler")
    ap.add_argument("--files", help="comma-separated source file names (default: all)")
    ap.add_argument("--json", help="also write the table and every line's counts as JSON")
    ap.add_argument("--load", help="recompute the table from a --json file's counts")
    a = ap.parse_args(argv)
    if a.load:
        saved = json.loads(Path(a.load).read_text())
        ca = {k: Counter(v) for k, v in saved["a"].items()}
        cb = {k: Counter(v) for k, v in saved["b"].items()}
    else:
        from prebuilt_ref import root
        src = root() / "llama.cpp"
        if not (src / "ggml").is_dir():
            raise SystemExit("no llama.cpp source: run python tools/prebuilt_ref.py fetch")
        files = set(a.files.split(",")) if a.files else None
        with tempfile.TemporaryDirectory(prefix="contract_") as t:
            t = Path(t)
            cmds = compile_commands(src, a.variant, t / "cmake")
            if not cmds:
                raise SystemExit(f"no compile commands for ggml-cpu-{a.variant}")
            (t / "a").mkdir()
            (t / "b").mkdir()
            ca = build(cmds, a.a, files, t / "a")
            cb = build(cmds, a.b, files, t / "b")
    rows = []
    for path, lines, x, y in differing(ca, cb):
        try:
            code = " / ".join(Path(path).read_text().splitlines()[i - 1].strip() for i in lines)
        except (OSError, IndexError):
            code = ""
        rel = path.split("/ggml/src/")[-1]
        span = f"{lines[0]}" if len(lines) == 1 else f"{lines[0]}-{lines[-1]}"
        rows.append({"where": f"{rel}:{span}", "a_fused": x["fused"], "a_unfused": x["unfused"],
                     "b_fused": y["fused"], "b_unfused": y["unfused"], "code": code})
    print(f"| source line | {a.a}: fused / unfused | {a.b}: fused / unfused | code |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['where']} | {r['a_fused']} / {r['a_unfused']} | {r['b_fused']} / "
              f"{r['b_unfused']} | `{r['code'][:90]}` |")
    if a.json:
        Path(a.json).write_text(json.dumps({"variant": a.variant, "a_compiler": a.a, "b_compiler": a.b,
                                            "rows": rows, "a": ca, "b": cb}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
