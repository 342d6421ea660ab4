"""Replays of several trace slices and schedules in one process (issue 37), and their
predictions again from a capture report.

  run:     python benchmarks/bench_replay_trace.py run --out DIR --case NAME=TRACE,PLAN,plan|default,N,LOAD ...
           One model and KV pool serve every case; each distinct graph set is captured once
           (into a pool of its own, earlier sets kept alive), in the order the cases name them.
           Writes DIR/NAME.json (replay.json documents, roofline prediction) and a timestamped log.
           Cases that would not finish inside --budget-s are skipped and said so.
  predict: python benchmarks/bench_replay_trace.py predict --profile report.json --gpu H100-80GB FILE...
           Adds the profile's prediction to each replay.json, in place, and prints the errors.
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
    from cgtool.replay.run import context_width, prepare
    from cgtool.replay.session import build_bench, capture_graphs, replay_once
    from cgtool.replay.run import resolve_gpu

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
    from cgtool.replay.profile import load_profile
    from cgtool.replay.result import load_replay, write_replay
    from cgtool.replay.session import predict_replay
    from cgtool.replay.run import resolve_gpu

    from cgtool.replay.result import is_replay_document

    profile = load_profile(args.profile) if args.profile else None
    fed_back = args.profile is not None and is_replay_document(args.profile)
    results = []
    for path in args.files:
        result = load_replay(path)
        predict_replay(result, resolve_gpu(args.gpu, "cuda"), profile, str(args.profile) if args.profile else None)
        if not fed_back:
            write_replay(result, path)
        _report(path.stem, result)
        results.append((path, result))
    if args.markdown:
        _markdown(results)
    return 0


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
    p.add_argument("--profile", type=Path)
    p.add_argument("--gpu", required=True)
    p.add_argument("--markdown", action="store_true", help="Also print the table `table` prints.")
    p.add_argument("files", type=Path, nargs="+")
    t = sub.add_parser("table")
    t.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args()
    return {"run": run, "predict": predict, "table": table}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
