"""Summarise an Nsight Compute raw CSV (`ncu --csv --page raw` with the
SpeedOfLight, Occupancy, WarpStateStats and LaunchStats sections; the
command is in tools/profile_kernels.py) as one Markdown row per kernel:
time, DRAM bytes moved and achieved bandwidth, DRAM and SM throughput,
registers, theoretical and achieved occupancy, issue-slot use, and the
largest warp stall reasons (cycles a warp waited per issued instruction).

Usage: python tools/ncu_summary.py NCU.csv [--names 'label,label,...']
Lines before the CSV header (the profiled program's own output) are skipped.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys

STALL = "smsp__average_warps_issue_stalled_"


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return float("nan")


def short_name(name: str) -> str:
    """`strata::dequant_wide_kernel<strata::WideQ4_K, 1>(...)` -> `dequant_wide Q4_K 1`."""
    name = name.split("(")[0]
    name = re.sub(r"strata::|smv::|\(anonymous namespace\)::", "", name)
    return name.replace("_kernel", "").replace("Wide", "")


def rows(path: str) -> list[dict]:
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    rd = list(csv.reader(lines[start:]))
    hdr, units = rd[0], rd[1]
    out = []
    for r in rd[2:]:
        if len(r) != len(hdr):
            continue
        d = dict(zip(hdr, r))
        d["_units"] = dict(zip(hdr, units))
        out.append(d)
    return out


def summary(d: dict) -> dict:
    u = d["_units"]
    dur = _num(d["gpu__time_duration.sum"])
    dur_s = dur * {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3}.get(u["gpu__time_duration.sum"], 1e-9)
    bw = _num(d["dram__bytes.sum.per_second"])
    bw *= {"byte/second": 1, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9,
           "Tbyte/second": 1e12}.get(u["dram__bytes.sum.per_second"], 1)
    stalls = {k[len(STALL):].replace("_per_issue_active.ratio", ""): _num(v)
              for k, v in d.items() if k.startswith(STALL) and k.endswith("_per_issue_active.ratio")}
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
    return {
        "kernel": short_name(d["Kernel Name"]),
        "grid": d["Grid Size"], "block": d["Block Size"],
        "us": dur_s * 1e6, "MB": bw * dur_s / 1e6, "GBps": bw / 1e9,
        "dram_pct": _num(d["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]),
        "sm_pct": _num(d["sm__throughput.avg.pct_of_peak_sustained_elapsed"]),
        "regs": d["launch__registers_per_thread"],
        "occ_theory": _num(d["sm__maximum_warps_per_active_cycle_pct"]),
        "occ": _num(d["sm__warps_active.avg.pct_of_peak_sustained_active"]),
        "issue_pct": _num(d["smsp__issue_active.avg.pct_of_peak_sustained_active"]),
        "stalls": ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in top),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--names", default="", help="labels for the kernels, in order")
    a = ap.parse_args(argv)
    labels = [s for s in a.names.split(",") if s]
    print("| kernel | µs | DRAM MB | GB/s | DRAM % peak | SM % peak | regs | occupancy theor. / "
          "achieved % | issue slots busy % | top stalls (cycles per issued instruction) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for i, d in enumerate(rows(a.csv)):
        s = summary(d)
        name = labels[i] if i < len(labels) else s["kernel"]
        print(f"| {name} | {s['us']:.1f} | {s['MB']:.0f} | {s['GBps']:.0f} | {s['dram_pct']:.1f} | "
              f"{s['sm_pct']:.1f} | {s['regs']} | {s['occ_theory']:.0f} / {s['occ']:.0f} | "
              f"{s['issue_pct']:.1f} | {s['stalls']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
