"""The per-tensor tasks on dask.distributed: a LocalCluster of 2 worker
processes gives the hashes of the in-process run (`strata-ref[dask]`; the
test extra installs it, so CI runs these)."""
from __future__ import annotations

import logging
import multiprocessing

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from strata_ref import gguf  # noqa: E402
from strata_ref.cli import main  # noqa: E402
from strata_ref.hashing import hash_model  # noqa: E402
from strata_ref.types import GGMLType as T  # noqa: E402


@pytest.fixture(scope="module")
def split_model(tmp_path_factory):
    """Three shards of Q8_0 / F32 tensors (few types: the workers compile
    little)."""
    rng = np.random.default_rng(11)
    ts = []
    for i in range(3):
        q = rng.integers(0, 256, (16 * (i + 1), 34), dtype=np.uint8)
        q[:, 1] &= 0x3B
        ts += [(f"blk.{i}.w", T.Q8_0, (512, i + 1), q.reshape(-1)),
               (f"blk.{i}.norm", T.F32, (64,), rng.standard_normal(64).astype(np.float32))]
    d = tmp_path_factory.mktemp("dask")
    gguf.write_gguf(d / "m.gguf", {}, ts, split_max_tensors=2)
    return d / "m-00002-of-00003.gguf"


def _has_hashed() -> bool:
    import sys
    return "strata_ref.hashing" in sys.modules


def test_scheduler_address_gives_the_local_hashes(split_model, capsys):
    assert main(["hash", str(split_model), "--no-progress", "--jobs", "1"]) == 0
    ref = capsys.readouterr().out
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as client:
        assert main(["hash", str(split_model), "--no-progress",
                     "--scheduler", cluster.scheduler_address]) == 0
        got = capsys.readouterr().out
        # the tasks ran in the cluster's worker processes (which read the shards)
        ran = client.run(_has_hashed)
    assert got == ref
    assert len(ran) == 2 and any(ran.values())
    assert multiprocessing.active_children() == []


def test_local_cluster_of_two_workers(split_model):
    f = gguf.read(split_model)
    ref = hash_model(f, jobs=1)
    got = hash_model(f, ("f32", "bf16"), jobs=2, scheduler="local")
    assert [t.name for t in got.tensors] == [t.name for t in ref.tensors]
    assert [t.hashes for t in got.tensors] == [{d: t.hashes[d] for d in ("f32", "bf16")}
                                               for t in ref.tensors]
    assert got.chained == {d: ref.chained[d] for d in ("f32", "bf16")}
    assert multiprocessing.active_children() == []
