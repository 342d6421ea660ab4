"""Replays of several trace slices and schedules in one process (issue 37), and their
predictions again from a capture report.

  run:     python benchmarks/bench_replay_trace.py run --out DIR --case NAME=TRACE,PLAN,plan|default,N,LOAD ...
           One model and KV pool serve every case; each distinct graph set is captured once
           (into a pool of its own, earlier sets kept alive), in the order the cases name them.
           Writes DIR/NAME.json (replay.json documents, roofline prediction) and a timestamped log.
           Cases that would not finish inside --budget-s are skipped and said so.
  merge:   python benchmarks/bench_replay_trace.py merge --out merged.json report.json report-16k.json ...
           One report for `cgtool plan --profile` / `cgtool replay --profile`: decode priced per context token.
  attention: python benchmarks/bench_replay_trace.py attention --profile report.json [...] --gpu H200 FILE...
           Each run's decode steps priced on the batches it ran, and fitted within graph sizes
           against the context read and the longest request's context.
  predict: python benchmarks/bench_replay_trace.py predict --profile report.json [--profile ctx2.json ...] --gpu H100-80GB FILE...
           Adds the profile's prediction to each replay.json, in place (not with --dry), and prints
           the errors. Several --profile reports (decode at other contexts) are merged into one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from cgtool.documents.provenance import collect_provenance
    from cgtool.replay.result import write_replay
    from cgtool.replay.run import context_width, prepare, resolve_gpu
    from cgtool.replay.session import build_bench, capture_graphs, replay_once

    gpu = resolve_gpu("auto", "cuda")
    cases = []
    for spec in args.case:
        name, rest = spec.split("=", 1)
        trace, plan, schedule, n, load = rest.split(",")
        inputs = prepare(Path(trace), plan=Path(plan), default=schedule == "default", requests=int(n),
                         load=float(load), gpu=gpu, mem_fraction_static=args.mem_fraction_static)
        cases.append((name, inputs))
    width = max(context_width(i.reqs, i.cfg) for _, i in cases)
    rows = max(i.max_running_requests for _, i in cases)
    started = time.time()
    bench = build_bench(cases[0][1], width=width, rows=rows)
    _log(f"bench: {cases[0][1].cfg.name}, KV {bench.kv_tokens:,} tokens, width {width}, "
         f"{torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free")
    graph_sets: dict[tuple, object] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, inputs in cases:
        key = (tuple(inputs.capture_bs), tuple(inputs.capture_num_tokens), inputs.prefill_backend)
        # Arrivals, a drain, and a capture (the compile cache makes one 2-17 s on an H200).
        expect_s = inputs.reqs.arrival_ms[-1] / 1e3 + 15 + (0 if key in graph_sets else 20)
        if time.time() - started + expect_s > args.budget_s:
            _log(f"{name}: skipped, about {expect_s:.0f} s would pass the {args.budget_s} s budget")
            continue
        try:
            if key not in graph_sets:
                graph_sets[key] = capture_graphs(bench, inputs.capture_bs, inputs.capture_num_tokens, _log,
                                                 inputs.prefill_backend)
                _log(f"{torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free after the capture")
            result = replay_once(inputs, bench, graph_sets[key], _log)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            _log(f"{name}: failed: {type(exc).__name__}: {exc}")
            continue
        result.provenance = collect_provenance()
        write_replay(result, args.out / f"{name}.json")
        _report(name, result)
    return 0


def _report(name: str, result) -> None:  # noqa: ANN001
    m = result.measured
    if m is None:
        _log(f"{name}: no step ran")
        return
    _log(f"{name}: {result.status}, {m.steps} steps, {m.duration_s:.1f} s, graph share {m.graph_share:.2f}")
    for metric in result.metrics:
        _log(f"  {metric.source:>10} {metric.name:<16} measured {metric.measured:10.3f} "
             f"predicted {metric.predicted:10.3f} error {metric.error:+.3f}")


def predict(args: argparse.Namespace) -> int:
    from cgtool.replay.profile import load_profiles
    from cgtool.replay.result import is_replay_document, load_replay, write_replay
    from cgtool.replay.run import resolve_gpu
    from cgtool.replay.session import predict_replay

    paths = args.profile or []
    profile, name = None, None
    if paths:
        # Several capture reports (one model and GPU, decode at different --context-len): one
        # profile whose decode rows price attention per context token.
        profile = load_profiles(paths)
        name = str(paths[0]) + (f" (+{len(paths) - 1} contexts)" if len(paths) > 1 else "")
    fed_back = len(paths) == 1 and is_replay_document(paths[0])
    results = []
    for path in args.files:
        result = load_replay(path)
        predict_replay(result, resolve_gpu(args.gpu, "cuda"), profile, name)
        if not fed_back and not args.dry:
            write_replay(result, path)
        _report(path.stem, result)
        results.append((path, result))
    if args.markdown:
        _markdown(results)
    return 0


def merge(args: argparse.Namespace) -> int:
    """One report.json from captures at several --context-len, for any --profile."""
    import json

    from cgtool.planner.profile_fit import merge_context_reports

    merged = merge_context_reports([json.loads(p.read_text()) for p in args.reports])
    args.out.write_text(json.dumps(merged, indent=1) + "\n")
    _log(f"wrote {args.out}: {len(merged['sizes'])} rows from {len(args.reports)} reports")
    return 0


def attention(args: argparse.Namespace) -> int:
    """Each run's decode steps against a capture report's prices on the batches the loop really
    ran (batch composition taken out), and what the steps' times follow: the context read in
    all (size x context) alone, or that and the longest request's context."""
    import json

    import numpy as np

    from cgtool.planner.profile_fit import merge_context_reports, profile_cost, within_slope
    from cgtool.replay.result import load_replay
    from cgtool.replay.run import resolve_gpu
    from cgtool.specs.config import load_model_config

    report = merge_context_reports([json.loads(p.read_text()) for p in args.profile])
    per_token = None  # ms per longest-request token, fitted on the first file, tried on all
    for path in args.files:
        result = load_replay(path)
        cost = profile_cost(report, load_model_config(result.model.name), resolve_gpu(args.gpu, "cuda"),
                            max_bs=max(result.settings.capture_bs + [result.settings.max_running_requests]),
                            max_tokens=8192, source="profile")
        s = result.steps
        dec = np.array([k == "decode" for k in s.kind])
        ms, pad = np.array(s.time_ms)[dec], np.array(s.padded)[dec]
        context = np.array(s.context, dtype=np.float64)[dec]
        longest = _longest_context(result, np.array(s.start_ms)[dec])
        priced = cost.decode_graph_ms[pad] + cost.kv_read_ms_per_token * context
        one = within_slope(pad, context, ms) or 0.0
        both = _within_fit(pad, np.c_[context, longest], ms)
        print(f"{path.stem}: decode {ms.mean():.3f} ms measured, {priced.mean():.3f} priced on its own batches "
              f"({ms.mean() / priced.mean() - 1:+.1%}; profile {cost.kv_read_ms_per_token:.3e} ms/token); "
              f"longest request {longest.mean():,.0f} tokens on average, its correlation with the rest "
              f"{np.corrcoef(ms - priced, longest)[0, 1]:.2f}")
        print(f"    within graph sizes: {one:.3e} ms per context token alone (residual rms "
              f"{_rms(pad, np.c_[context], ms, [one]):.3f} ms); with the longest request: {both[0]:.3e} per "
              f"context token + {both[1]:.3e} per longest-request token (rms {_rms(pad, np.c_[context, longest], ms, both):.3f} ms)")
        if per_token is None:
            per_token = float((ms - priced) @ longest / (longest @ longest))
            print(f"    what the profile leaves, fitted to the longest request's context alone: {per_token:.3e} ms a token")
        with_term = priced + per_token * longest
        print(f"    priced with that term ({per_token:.3e} ms a longest-request token, fitted on "
              f"{args.files[0].stem}): {with_term.mean():.3f} ms ({ms.mean() / with_term.mean() - 1:+.1%})")
    return 0


def _longest_context(result, starts):  # noqa: ANN001, ANN202
    """Per decode step, the longest context among the requests it decoded: those past their first
    token and not finished when it started, each at its prompt plus the tokens it had made."""
    import numpy as np

    r = result.requests
    longest = np.zeros(len(starts))
    for i, (first, finish) in enumerate(zip(r.first_token_ms, r.finish_ms)):
        if first is None or finish is None:
            continue
        inside = (starts >= first - 1e-6) & (starts < finish - 1e-6)
        context = r.input_len[i] + np.cumsum(inside)
        longest[inside] = np.maximum(longest[inside], context[inside])
    return longest


def _centred(group, x, y):  # noqa: ANN001, ANN202
    x, y = x.astype(float).copy(), y.astype(float).copy()
    for g in set(group.tolist()):
        inside = group == g
        x[inside] -= x[inside].mean(axis=0)
        y[inside] -= y[inside].mean()
    return x, y


def _within_fit(group, x, y):  # noqa: ANN001, ANN202
    import numpy as np

    xc, yc = _centred(group, x, y)
    return np.linalg.lstsq(xc, yc, rcond=None)[0].tolist()


def _rms(group, x, y, beta) -> float:  # noqa: ANN001
    import numpy as np

    xc, yc = _centred(group, x, y)
    return float(np.sqrt(np.mean((yc - xc @ np.array(beta)) ** 2)))


_COLUMNS = ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "TPOT mean", "throughput", "decode step",
            "extend step", "decode batch TVD")


def table(args: argparse.Namespace) -> int:
    from cgtool.replay.result import load_replay

    _markdown([(path, load_replay(path)) for path in args.files])
    return 0


def _markdown(results: list) -> None:
    print("| run | source | " + " | ".join(_COLUMNS) + " |")
    print("|" + " --- |" * (len(_COLUMNS) + 2))
    for path, result in results:
        first = {m.name: m for m in result.metrics if m.source == result.predictions[0].source}
        print(f"| {path.stem} | measured | " + " | ".join(
            "-" if c.endswith("TVD") else f"{first[c].measured:,.4g}" for c in _COLUMNS) + " |")
        for p in result.predictions:
            rows = {m.name: m for m in result.metrics if m.source == p.source}
            cells = [f"{rows[c].error:.3f}" if c.endswith("TVD") else f"{100 * rows[c].error:+.1f}%" for c in _COLUMNS]
            print(f"| | {Path(p.source).name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--case", action="append", required=True)
    r.add_argument("--mem-fraction-static", type=float, default=0.8)
    r.add_argument("--budget-s", type=float, default=420)
    p = sub.add_parser("predict")
    p.add_argument("--profile", type=Path, action="append",
                   help="A capture report (or replay.json); repeated: captures at other --context-len, merged.")
    p.add_argument("--dry", action="store_true", help="Print only: leave the replay.json files as they are.")
    p.add_argument("--gpu", required=True)
    p.add_argument("--markdown", action="store_true", help="Also print the table `table` prints.")
    p.add_argument("files", type=Path, nargs="+")
    a = sub.add_parser("attention")
    a.add_argument("--profile", type=Path, action="append", required=True,
                   help="Capture reports of decode at one or more --context-len, merged.")
    a.add_argument("--gpu", required=True)
    a.add_argument("files", type=Path, nargs="+")
    m = sub.add_parser("merge")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("reports", type=Path, nargs="+", help="Capture reports, the first whole, the others' decode rows.")
    t = sub.add_parser("table")
    t.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args()
    return {"run": run, "predict": predict, "table": table, "attention": attention, "merge": merge}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
