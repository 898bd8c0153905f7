"""Write one of the tiny seeded models the tests check against llama.cpp:
the same bytes as tests/infer_helpers.py makes, so the llama.cpp logits
stored under tests/data (tools/llama_ref.py, tools/arm_ref.py) hold for the
file this writes.

    python tools/make_tiny_model.py ARCH OUT [--seed N]
    python tools/make_tiny_model.py --list

ARCH: qwen3, gemma3 (`tiny_model`: 6 layers, n_embd 64, Q8_0) or one of
the MoE / hybrid / newer dense architectures of `MOE_LAYERS` (qwen3moe,
gpt-oss, qwen3next, qwen35moe, qwen35, phi3, glm4moe, deepseek2,
deepseek2-lite (a deepseek2 file in DeepSeek-V2-Lite's layout),
deepseek2-v3 (deepseek2 with DeepSeek V3's group-limited routing and
YaRN RoPE), deepseek2-kvb (deepseek2 as older converters wrote it:
`attn_kv_b`, no MLA head lengths), gemma4
(Gemma 4 E2B's layout: per-layer embeddings, shared-KV layers),
gemma4-moe (a gemma4 file in 26B-A4B's layout): `tiny_moe_model`,
n_embd 256, mixed weight types). The default seed is the one the stored
data was made with (`MOE_SEEDS`, chosen so that no greedy step is a
near-tie). Every model has the 259-token byte-level vocabulary of the
tests; `strata-ref generate OUT "Hello"` runs it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from infer_helpers import MOE_LAYERS, moe_seed, tiny_model, tiny_moe_model  # noqa: E402

#: the architectures of `tiny_model` (the others are `MOE_LAYERS`')
DENSE = ("qwen3", "gemma3")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arch", nargs="?", help=f"one of {', '.join(DENSE + tuple(MOE_LAYERS))}")
    ap.add_argument("out", nargs="?", help="the .gguf file to write")
    ap.add_argument("--seed", type=int, default=None,
                    help="weights seed, 0 .. 2^32 - 1 (default: the stored data's)")
    ap.add_argument("--list", action="store_true", help="list the architectures and their seeds")
    ap.add_argument("--force", action="store_true", help="replace an existing OUT that is not a GGUF")
    a = ap.parse_args(argv)
    archs = DENSE + tuple(MOE_LAYERS)
    if a.list:
        for arch in archs:
            print(f"{arch}: seed {0 if arch in DENSE else moe_seed(arch)}")
        return 0
    if not a.arch or not a.out:
        ap.error("give ARCH and OUT (or --list)")
    if a.arch not in archs:
        ap.error(f"unknown architecture {a.arch!r} (one of {', '.join(archs)})")
    if a.seed is not None and not 0 <= a.seed < 2 ** 32:
        ap.error("--seed must be from 0 to 2^32 - 1")
    out = Path(a.out)
    if out.is_dir() or not out.parent.is_dir():
        ap.error(f"OUT {a.out!r} must be a file in an existing folder")
    if out.is_file() and not a.force:
        with open(out, "rb") as f:
            if f.read(4) != b"GGUF":
                ap.error(f"OUT {a.out!r} exists and is not a GGUF file (--force replaces it)")
    if a.arch in DENSE:
        tiny_model(a.arch, out, seed=0 if a.seed is None else a.seed)
    else:
        tiny_moe_model(a.arch, out, seed=moe_seed(a.arch) if a.seed is None else a.seed)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
