"""llama.cpp's logits of the tiny I-quant model (tests/iq_model.py) for one
CPU profile, stored for tests/test_cpu_iquants_model.py.

    python tools/llama_ref_iq.py --profile P [--out FILE]

Builds `tiny_iq_model` (seed 5), runs it in llama.cpp (llama-cpp-python of
the peer build for P, tools/peer_build.py; n_ctx 256, n_batch 256, 2
threads) over `PASSES` one after the other, and writes
tests/data/P/llama_ref_tiny_iq.npz: the logits of every position (float32
(20, 259)), the model's sha256, and the provenance keys of
tools/peer_env.py.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))


def main(argv=None) -> int:
    from peer_env import data_dir, ensure_profile, provenance
    ensure_profile(__file__)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    from iq_model import PASSES, tiny_iq_model
    from llama_cpp import Llama
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tiny_iq.gguf"
        tiny_iq_model(path)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        llm = Llama(model_path=str(path), n_ctx=256, n_batch=256, n_threads=2, n_threads_batch=2,
                    seed=0, logits_all=True, verbose=False)
        llm.reset()
        for ids in PASSES:
            llm.eval(ids)
        logits = np.array(llm.scores[:sum(map(len, PASSES))], np.float32)
        del llm
    out = Path(a.out or data_dir() / "llama_ref_tiny_iq.npz")
    np.savez_compressed(out, logits=logits, sha256=np.array(sha), **provenance("tools/llama_ref_iq.py"))
    print(out, logits.shape)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
