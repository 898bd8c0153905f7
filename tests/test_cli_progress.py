"""Long jobs of the command line (issue 16, item 16): a progress bar on a
terminal, none off a terminal or with --json, and Ctrl-C (SIGINT) stops a
job at once with exit status 130 and no traceback."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from strata_ref.gguf import write_gguf
from strata_ref.types import GGMLType as T

CLI = [sys.executable, "-m", "strata_ref.cli"]


def _sigint_default():
    # a shell without job control starts background jobs with SIGINT
    # ignored, and Python then keeps it ignored: give the child the default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_on_pty(argv) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal: (status, stdout, what
    the terminal received)."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    # a terminal of 24 x 120 (a new one has no size, and tqdm draws no bar)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    p = subprocess.Popen(CLI + argv, stdout=subprocess.PIPE, stderr=slave,
                         preexec_fn=_sigint_default)
    os.close(slave)
    seen = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:        # the child closed the terminal (EIO)
            break
        if not chunk:
            break
        seen += chunk
    out = p.stdout.read().decode()
    p.wait(60)
    os.close(master)
    return p.returncode, out, seen.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def f16_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("prog") / "h.gguf"
    w = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float16)
    write_gguf(p, {}, [("w", T.F16, (256, 256), w)])
    return p


def test_hash_bar_only_on_a_terminal_and_never_with_json(f16_file):
    rc, out, tty = _run_on_pty(["hash", str(f16_file)])
    assert rc == 0 and out.startswith("name")
    assert "hash: 100%" in tty and "131k/131k" in tty
    rc, out, tty = _run_on_pty(["hash", str(f16_file), "--json"])
    assert rc == 0 and out.startswith("{") and tty == ""
    rc, out, tty = _run_on_pty(["hash", str(f16_file), "--no-progress"])
    assert rc == 0 and tty == ""
    r = subprocess.run(CLI + ["hash", str(f16_file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == ""          # a pipe: no bar


def test_golden_check_bar_on_a_terminal(tmp_path):
    from strata_ref import golden
    golden.make_corpus(tmp_path / "corpus.json", types=[T.F32])
    rc, out, tty = _run_on_pty(["golden", "check", "--dir", str(tmp_path)])
    # the other types' cases are "new" (not computed), so the check is quick
    assert rc == 1 and "FAIL" in out
    n = len(golden.corpus_cases())
    assert "check corpus: 100%" in tty and f"{n}/{n}" in tty


def test_ctrl_c_stops_golden_check_with_130():
    # the corpus check runs for minutes: interrupt it once it is under way
    p = subprocess.Popen(CLI + ["golden", "check"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    time.sleep(6)
    assert p.poll() is None, p.communicate()
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert time.monotonic() - t0 < 5
    assert "Traceback" not in err and err == ""


def test_generate_reports_prompt_progress_by_chunk(tmp_path):
    from infer_helpers import TINY_IDS, tiny_model
    from strata_ref.infer import generate
    from strata_ref.infer.model import load
    from strata_ref.infer.sampling import greedy
    path = tmp_path / "t.gguf"
    tiny_model("qwen3", path)
    m = load(path)
    ids = TINY_IDS * 3                     # 36 tokens
    ref = generate(m, ids, 4, greedy)[0]
    m.CHUNK = 10                           # as forward itself splits the prompt
    seen = []
    got = generate(m, ids, 4, greedy, progress=seen.append)[0]
    assert seen == [10, 10, 10, 6] and got == ref
