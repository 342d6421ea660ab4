"""Predictions of recorded `verify` runs made again with the cost model of this checkout.

    .venv/bin/python benchmarks/repredict_verify.py FOLDER [--efficiency-then 0.5]
        [--profile-from self|other-trace]

FOLDER holds one sub-folder per run with `plan.json` and `verify.json` (as gpu-check.sh's
`memory` stage leaves them), either as `NAME.xz` where scripts/compact_results.py --pack
packed it. With --profile-from the "now" column is predicted as `cgtool plan
--profile verify.json` would, from the run's own verify.json (`self`) or from the other trace's
run of the same model (`other-trace`). Per run, set and kind: the measured step mean, the prediction
recorded then, and the roofline's prediction now, each weighted as verify weights its sampled
steps (by size: the recorded rows carry each size's mean context, and a step's predicted time
is linear in it). With --efficiency-then the dense extend attention efficiency the runs were
made with is put back first: the "then" column must then come out as recorded, which checks
the method.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import tempfile
from pathlib import Path

import numpy as np

import cgtool.planner.cost as cost_module
from cgtool.documents.results import load_plan
from cgtool.verify.population import plan_cost, predicted_ms
from cgtool.verify.steps import Step


def _verify_json(run: Path) -> Path:
    """Where the run's verify.json is, or its packed copy (verify.json.xz) beside that name."""
    for path in (run / "verify.json", run / "verify" / "verify.json"):
        if path.exists() or path.with_name("verify.json.xz").exists():
            return path
    return run / "verify" / "verify.json"


def _verify_text(run: Path) -> str:
    path = _verify_json(run)
    return path.read_text() if path.exists() else lzma.decompress(path.with_name("verify.json.xz").read_bytes()).decode()


# Packed verify.json files unpacked for `plan --profile`, which reads a path; removed at exit.
_UNPACKED = tempfile.TemporaryDirectory(prefix="repredict-")


def _profile_path(run: Path) -> str:
    """A path `plan --profile` can read: the run's verify.json, unpacked where it is packed."""
    path = _verify_json(run)
    if path.exists():
        return str(path)
    unpacked = Path(_UNPACKED.name) / hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16] / "verify.json"
    if not unpacked.exists():
        unpacked.parent.mkdir(parents=True)
        unpacked.write_text(_verify_text(run))
    return str(unpacked)


def _plan(run: Path):
    """The run's plan, from plan.json or its packed copy (unpacked into a temporary folder)."""
    for plan_json in (run / "plan.json", run / "plan" / "plan.json"):
        if plan_json.exists():
            return load_plan(plan_json)
        packed = plan_json.with_name("plan.json.xz")
        if packed.exists():
            with tempfile.TemporaryDirectory() as tmp:
                unpacked = Path(tmp) / "plan.json"
                unpacked.write_bytes(lzma.decompress(packed.read_bytes()))
                return load_plan(unpacked)
    return load_plan(run / "plan.json")  # names the file that is missing


def _profile_for(run: Path, runs: list[Path], profile_from: str | None) -> str | None:
    """The verify.json `plan --profile` is given: none (the roofline), the run's own, or that
    of the other run of the same model (another trace on the same GPU)."""
    if profile_from is None:
        return None
    if profile_from == "self":
        return _profile_path(run)
    model = json.loads(_verify_text(run))["model"]["name"]
    others = [r for r in runs if r != run and json.loads(_verify_text(r))["model"]["name"] == model]
    return _profile_path(others[0]) if others else None


def rows(folder: Path, profile_from: str | None = None) -> list[tuple[str, str, str, float, float, float]]:
    out = []
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and (
        _verify_json(p).exists() or _verify_json(p).with_name("verify.json.xz").exists()))
    for run in runs:
        verify, plan = json.loads(_verify_text(run)), _plan(run)
        # The roofline, or a verify.json here: the recorded profile path was the GPU machine's.
        plan.inputs.profile = _profile_for(run, runs, profile_from)
        if profile_from and plan.inputs.profile is None:
            continue  # no other run of this model to learn from
        inputs, decode, piecewise = plan.inputs, plan.decode, plan.piecewise
        for graph_set in verify["sets"]:
            sizes = [r["size"] for r in graph_set["sizes"]]
            max_bs = max([inputs.max_running_requests or 1] + sizes + decode.capture_bs + decode.default_capture_bs)
            max_tokens = max([inputs.chunked_prefill_size or 1] + sizes + piecewise.capture_num_tokens
                             + piecewise.default_capture_num_tokens)
            cost = plan_cost(plan, max_bs, max_tokens)
            for kind in ("decode", "extend"):
                kept = [r for r in graph_set["sizes"] if r["kind"] == kind]
                if not kept:
                    continue
                weights = np.array([r["weight"] for r in kept])
                captured = graph_set["capture_bs"] if kind == "decode" else graph_set["capture_num_tokens"]
                now = [predicted_ms(cost, Step(kind, r["size"], r["context"], r["weight"]), captured)[0] for r in kept]

                def mean(values: list[float], weights: np.ndarray = weights) -> float:
                    return float((np.array(values) * weights).sum() / weights.sum())

                out.append((run.name, graph_set["name"], kind, mean([r["measured_ms"] for r in kept]),
                            mean([r["predicted_ms"] for r in kept]), mean(now)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--efficiency-then", type=float, default=None)
    parser.add_argument("--profile-from", choices=("self", "other-trace"), default=None,
                        help="predict as `plan --profile verify.json` would: with the run's own verify.json, "
                             "or with the other trace's run of the same model")
    args = parser.parse_args()
    if args.efficiency_then is not None:
        cost_module.GQA_EXTEND_FLOPS_EFFICIENCY = args.efficiency_then
    print(f"# dense extend attention at {cost_module.GQA_EXTEND_FLOPS_EFFICIENCY} of peak; "
          "error = measured / predicted - 1")
    print("| run | set | kind | measured ms | predicted then | error then | predicted now | error now |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    if args.profile_from:
        print(f"# now: with --profile from {args.profile_from}")
    for name, graph_set, kind, measured, then, now in rows(args.folder, args.profile_from):
        print(f"| {name} | {graph_set} | {kind} | {measured:.2f} | {then:.2f} | {measured / then - 1:+.1%} "
              f"| {now:.2f} | {measured / now - 1:+.1%} |")


if __name__ == "__main__":
    main()
