"""`strata-ref kl`, `layers` and `rotate`: what a quantization costs,
measured with the CPU arithmetic (docs/quality.md)."""
from __future__ import annotations

import sys

from .._text import count, printable
from .._npio import atomic_output
from .common import (Help, below_minimum, decimal, real, cpu_problem, err, json_out, native_note, out_problem,
                     plot_problem, sampling_problem, seed_problem, write_charts)


def cmd_kl(a) -> int:
    from .._progress import progress_bar
    from ..infer.sampling import Sampler
    from ..quality import kl, prompts, report, variants
    if a.max_tokens < 1:
        return err(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.limit is not None and a.limit < 1:
        return err(f"--limit must be >= 1, got {a.limit}")
    bad = (below_minimum("--ctx", a.ctx, 1, "one token") or sampling_problem(a.temperature, a.top_k, a.top_p)
           or seed_problem(a.seed))
    if bad:
        return err(bad)
    bad_cpu = cpu_problem(a.cpu)
    if bad_cpu:
        return err(bad_cpu)
    bad_plot = plot_problem(a.plot)
    if bad_plot:
        return err(bad_plot)
    if sum(map(bool, (a.test, a.test_logits, a.tokens_out))) != 1:
        return err("kl takes TEST models, --test-logits FILE or --tokens-out FILE (one of them)")
    if a.tokens_out is not None:
        bad_out = out_problem(a.tokens_out, "--tokens-out", "tokens", "tokens.npz", inputs=(a.ref, a.prompts))
        if bad_out:
            return err(bad_out)
    plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
    if a.limit:
        plist = plist[:a.limit]
    sampler = Sampler(a.temperature, a.top_k, a.top_p, a.seed)
    ref = variants.load_variant(a.ref, a.cpu)
    if a.tokens_out or a.test_logits:
        return _kl_external(a, ref, plist, sampler)
    tests = [variants.load_variant(t, a.cpu) for t in a.test]
    for spec, m in zip([a.ref] + a.test, [ref] + tests):
        # `@Q4_K` of a model whose rows do not fit its blocks is mostly another type
        note = variants.fallback_note(spec, m)
        if note:
            print(f"strata-ref: note: {note}", file=sys.stderr)
    with progress_bar(len(plist), "kl", "prompt", enabled=not a.json) as bar:
        results, sts, fl = kl.run_kl_many(ref, tests, plist, a.max_tokens, sampler, a.chat, bar.update,
                                          a.ctx)
    meta = {"ref": a.ref, "cpu": ref.cpu.name, "prompts_file": a.prompts, "n_ctx": a.ctx,
            "max_tokens": a.max_tokens, "temperature": a.temperature, "top_k": a.top_k,
            "top_p": a.top_p, "seed": a.seed, "chat": a.chat}
    if a.json:
        def fallback(m):
            fb = getattr(m, "fallback", None)
            return {"matrices": fb["matrices"], "types": fb["types"]} if fb else None
        docs = [report.kl_json({**meta, "test_spec": spec, "fallback": fallback(m)}, res, st, fl)
                for spec, m, res, st in zip(a.test, tests, results, sts)]
        json_out(docs[0] if len(docs) == 1 else {**meta, "floor": fl, "tests": docs})
    else:
        mode = "greedy" if a.temperature <= 0 else f"temperature {a.temperature}, seed {a.seed}"
        for i, (spec, res, st) in enumerate(zip(a.test, results, sts)):
            header = (f"KL(REF || TEST)  REF={printable(a.ref)}  TEST={printable(spec)}  cpu {ref.cpu.name}, "
                      f"{count(len(plist), 'prompt')}, {count(st.get('n', 0), 'generated position')}, "
                      f"{mode}"
                      + (", chat" if a.chat else ""))
            print(("\n" if i else "") + report.kl_text(header, res, st, fl))
    native_note(a.cpu)
    if not a.plot:
        return 0
    sys.stdout.flush()
    from ..quality import charts
    return write_charts(a.plot, *(
        lambda spec=spec, res=res: charts.kl_distribution(
            a.plot, res, f"{spec} vs {a.ref}",
            name=None if len(a.test) == 1 else f"kl_{charts.slug(spec)}.png")
        for spec, res in zip(a.test, results)))


def _kl_external(a, ref, plist, sampler) -> int:
    """`kl REF --tokens-out FILE` (REF's generations for another engine) and
    `kl REF --test-logits FILE` (that engine's logits measured)."""
    from .._progress import progress_bar
    from ..quality import kl, report
    if a.tokens_out:
        with progress_bar(len(plist), "kl", "prompt", enabled=not a.json) as bar:
            with atomic_output(a.tokens_out) as f:
                n = kl.write_reference_tokens(f, ref, plist, a.max_tokens, sampler, a.chat, bar.update,
                                              a.ctx)
        print(f"{printable(a.tokens_out)}: REF's tokens for {count(n, 'prompt')} (tokens:<i>, n_prompt:<i>, "
              f"n_ctx:<i>, prompt:<i>); add logits:<i> from the engine, run at n_ctx:<i>, and run "
              f"`strata-ref kl REF --test-logits FILE`")
        return 0
    seqs = kl.load_test_logits(a.test_logits, ref.n_vocab)
    with progress_bar(len(seqs), "kl", "sequence", enabled=not a.json) as bar:
        res, st, fl = kl.run_kl_external(ref, seqs, sampler, bar.update, a.ctx)
    meta = {"ref": a.ref, "cpu": ref.cpu.name, "test_logits": a.test_logits, "temperature": a.temperature,
            "seed": a.seed}
    if a.json:
        json_out(report.kl_json(meta, res, st, fl))
        return 0
    header = (f"KL(REF || TEST)  REF={printable(a.ref)}  TEST={printable(a.test_logits)} (another engine's "
              f"logits)  cpu {ref.cpu.name}, {len(seqs)} sequences, {st.get('n', 0)} generated positions")
    print(report.kl_text(header, res, st, fl))
    return 0


def cmd_layers(a) -> int:
    from .._progress import progress_bar
    from ..quality import layers, prompts, report, variants
    if "@" in a.model and variants.parse_spec(a.model)[1] is not None:
        return err(f"layers: give the model without a variant suffix ({a.model!r}); "
                    f"the study compares it with its own @float baseline")
    if a.max_tokens < 1:
        return err(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.jobs is not None and a.jobs < 1:
        return err(f"--jobs must be >= 1, got {a.jobs}")
    if a.limit is not None and a.limit < 1:
        return err(f"--limit must be >= 1, got {a.limit}")
    bad_cpu = cpu_problem(a.cpu)
    if bad_cpu:
        return err(bad_cpu)
    from ..types import parse_type
    target = parse_type(a.type)
    bad_plot = plot_problem(a.plot)
    if bad_plot:
        return err(bad_plot)
    plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
    if a.limit:
        plist = plist[:a.limit]
    with progress_bar(None, "layers", "task", enabled=not a.json) as bar:
        study = layers.run_layers(a.model, target, plist, a.max_tokens, a.cpu,
                                  jobs=a.jobs or 1, scheduler=a.scheduler, progress=bar.update)
    if a.json:
        json_out(study)
    else:
        print(report.layers_text(study))
    if not a.plot:
        return 0
    sys.stdout.flush()
    from ..quality import charts
    return write_charts(a.plot, lambda: charts.layer_kl(a.plot, study),
                         lambda: charts.crest(a.plot, study))


def cmd_rotate(a) -> int:
    from .._progress import progress_bar
    from ..models import resolve
    from ..quality.rotate import rotate_gguf
    bad_seed = seed_problem(a.seed)
    if bad_seed:
        return err(bad_seed)
    from ..gguf import read
    src = resolve(a.input)
    bad_out = out_problem(a.output, "OUT", "gguf", "rotated.gguf", [f.path for f in read(src).shards],
                          "--force", a.force, prefix="rotate: ")
    if bad_out:
        return err(bad_out)
    if not a.measure and (a.plot or a.types or a.prompts or a.limit is not None):
        return err("rotate: --types, --prompts, --limit and --plot go with --measure")
    if a.measure:
        from ..types import parse_type
        if a.max_tokens < 1:
            return err(f"--max-tokens must be >= 1, got {a.max_tokens}")
        if a.limit is not None and a.limit < 1:
            return err(f"--limit must be >= 1, got {a.limit}")
        bad_cpu = cpu_problem(a.cpu)
        if bad_cpu:
            return err(bad_cpu)
        for t in (a.types or "Q8_0,Q4_0").split(","):
            if t:
                parse_type(t)
        bad_plot = plot_problem(a.plot)
        if bad_plot:
            return err(bad_plot)
    with progress_bar(None, "rotate", "layer", enabled=not a.json) as bar:
        summary = rotate_gguf(src, a.output, a.type, a.seed, bar.update)
    if a.measure:
        from ..quality import prompts, report
        from ..quality.rotate import rotation_study
        plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
        plist = plist[:a.limit or 12]
        types = [t for t in (a.types or "Q8_0,Q4_0").split(",") if t]
        with progress_bar(None, "measure", "step", enabled=not a.json) as bar:
            study = rotation_study(src, a.output, plist, a.max_tokens, types, a.cpu, bar.update)
        summary["study"] = study
        if not a.json:
            print(report.rotation_text(study))
    if a.json:
        json_out(summary)
    else:
        types = {}
        for _, t in summary["tensors"]:
            types[t] = types.get(t, 0) + 1
        print(f"{printable(a.output)}: {summary['arch']}, residual stream {summary['n_embd']} rotated by "
              f"a randomized Hadamard ({' x '.join(map(str, summary['hadamard']))}, seed {summary['seed']}), "
              f"heads of {summary['head_dim']} ({' x '.join(map(str, summary['head_hadamard']))}); "
              f"tensors: " + ", ".join(f"{t} x{n}" for t, n in sorted(types.items())))
    if not a.plot:
        return 0
    sys.stdout.flush()
    from ..quality import charts
    return write_charts(a.plot, *(lambda fn=fn: fn(a.plot, summary["study"])
                                   for fn in (charts.rotation_crest, charts.rotation_a8,
                                              charts.rotation_kl)))


def add_kl(sub) -> None:
    kq = sub.add_parser(
        "kl", help="KL divergence of TEST from REF at the positions REF generates",
        description="REF generates from each prompt; TEST is teacher-forced on REF's tokens; "
                    "KL(REF || TEST) over the whole vocabulary at the generated positions, with "
                    "the noise floor (REF's incremental pass against its own batched pass). "
                    "A model is a registry name or .gguf path, optionally with a variant: "
                    "@float (dequantized weights, float activations), @TYPE (every matrix "
                    "requantized to a ggml type, e.g. @Q4_K), @a8token (float weights, "
                    "per-token int8 activations).",
        formatter_class=Help)
    kq.add_argument("ref", metavar="REF", help="the reference model[@variant]")
    kq.add_argument("test", metavar="TEST", nargs="*",
                    help="the model[@variant] measured against REF (several: one REF generation for all)")
    kq.add_argument("--test-logits", default=None, metavar="FILE",
                    help="instead of TEST: another engine's logits at REF's tokens (.npz of tokens:<i>, "
                         "n_prompt:<i>, logits:<i>; docs/trace.md); REF's generation must give its ids")
    kq.add_argument("--tokens-out", default=None, metavar="FILE",
                    help="write REF's generation per prompt (tokens:<i>, n_prompt:<i>, prompt:<i>) for "
                         "another engine to be teacher-forced on, and stop")
    kq.add_argument("--prompts", default=None, metavar="FILE",
                    help="prompts, one per line or JSON lines with \"prompt\" (default: the "
                         "built-in set of strata_ref.quality.prompts)")
    kq.add_argument("--limit", type=decimal, default=None, metavar="N", help="only the first N prompts")
    kq.add_argument("--max-tokens", type=decimal, default=32, metavar="N",
                    help="tokens REF generates per prompt")
    kq.add_argument("--temperature", type=real, default=0.0, metavar="T",
                    help="REF's sampling temperature; 0 is greedy")
    kq.add_argument("--top-k", type=decimal, default=0, metavar="K",
                    help="REF samples among the K most likely (0: all)")
    kq.add_argument("--top-p", type=real, default=1.0, metavar="P", help="REF's top-p, in (0, 1]")
    kq.add_argument("--seed", type=decimal, default=0, metavar="S",
                    help="REF's sampling seed, 0 .. 2^32 - 1")
    kq.add_argument("--chat", action="store_true",
                    help="each prompt is a user message in the model's chat template")
    kq.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="CPU profile of both models (default: $STRATA_REF_CPU, else native)")
    kq.add_argument("--ctx", type=decimal, default=None, metavar="N",
                    help="context length of every pass (default: the prompt plus --max-tokens plus one; "
                         "with --test-logits, the file's n_ctx:<i>); phi3's LongRoPE factors depend on it")
    kq.add_argument("--json", action="store_true", help="machine-readable output, every position's KL")
    kq.add_argument("--plot", default=None, metavar="DIR",
                    help="write the KL distribution chart (PNG, needs matplotlib) into DIR")
    kq.set_defaults(func=cmd_kl)


def add_layers(sub) -> None:
    ly = sub.add_parser(
        "layers", help="per-layer study of a quantization: crest factors, errors, sensitivity",
        description="Against MODEL@float on a calibration set: the crest factor of every "
                    "layer's attention and FFN input, each linear's weight and output errors "
                    "when requantized to TYPE (weights, ggml's activation blocks, per-token "
                    "int8), and the KL when only one layer is requantized (weight part and "
                    "activation part), beside the whole model's (docs/quality.md).",
        formatter_class=Help)
    ly.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    ly.add_argument("--type", default="Q4_K", metavar="TYPE", help="the ggml type to requantize to")
    ly.add_argument("--prompts", default=None, metavar="FILE", help="calibration prompts (default: the built-in set)")
    ly.add_argument("--limit", type=decimal, default=16, metavar="N", help="use the first N prompts")
    ly.add_argument("--max-tokens", type=decimal, default=24, metavar="N", help="tokens generated per prompt")
    ly.add_argument("--cpu", default=None, metavar="PROFILE", help="CPU profile (default: $STRATA_REF_CPU, else native)")
    ly.add_argument("--jobs", type=decimal, default=None, metavar="N",
                    help="worker processes for the per-layer tasks (default 1: in this process)")
    ly.add_argument("--scheduler", default=None, metavar="ADDR",
                    help="run the tasks on dask.distributed: 'local' or a scheduler address")
    ly.add_argument("--json", action="store_true", help="machine-readable output")
    ly.add_argument("--plot", default=None, metavar="DIR", help="write layer_kl.png and crest.png into DIR")
    ly.set_defaults(func=cmd_layers)


def add_rotate(sub) -> None:
    ro = sub.add_parser(
        "rotate", help="rotate a model's residual stream offline (QuaRot style)",
        description="Fold every RMSNorm weight into the linears that read it, rotate the "
                    "embedding and every linear that reads or writes the residual stream by a "
                    "seeded randomized Hadamard matrix (and V / attn_output per head), "
                    "re-quantize with the reference quantizers and write a GGUF of the same "
                    "architecture (docs/quality.md, \"Rotation\").",
        formatter_class=Help)
    ro.add_argument("input", metavar="IN", help="registry model or .gguf path (llama, qwen2, qwen3)")
    ro.add_argument("output", metavar="OUT", help="the rotated .gguf to write")
    ro.add_argument("--type", default=None, metavar="TYPE",
                    help="ggml type of every 2-D weight (default: each tensor keeps its type)")
    ro.add_argument("--seed", type=decimal, default=0, metavar="S",
                    help="seed of the Hadamard signs, 0 .. 2^32 - 1")
    ro.add_argument("--force", action="store_true",
                    help="replace OUT even when it exists and is not a GGUF file (an earlier "
                         "GGUF is replaced without it)")
    ro.add_argument("--json", action="store_true", help="machine-readable summary")
    ro.add_argument("--measure", action="store_true",
                    help="then compare OUT with IN (crest factors, per-linear int8 errors, KL "
                         "against IN@float; give --type F32 so that each weight type starts from "
                         "the same float weights)")
    ro.add_argument("--types", default=None, metavar="T1,T2",
                    help="weight types the measurement requantizes both to (default Q8_0,Q4_0)")
    ro.add_argument("--prompts", default=None, metavar="FILE", help="prompts (default: the built-in set)")
    ro.add_argument("--limit", type=decimal, default=None, metavar="N", help="the first N prompts (default 12)")
    ro.add_argument("--max-tokens", type=decimal, default=24, metavar="N", help="tokens generated per prompt")
    ro.add_argument("--cpu", default=None, metavar="PROFILE", help="CPU profile (default: $STRATA_REF_CPU, else native)")
    ro.add_argument("--plot", default=None, metavar="DIR",
                    help="write rotation_crest.png, rotation_a8.png and rotation_kl.png into DIR")
    ro.set_defaults(func=cmd_rotate)
