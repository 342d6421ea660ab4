"""TP=2 against TP=1: decode replay latency per batch size, from two `cgtool capture` runs.

    python benchmarks/bench_tp.py --model llama-3.1-8b --out gpu-out/tp

runs `cgtool capture --kind decode` at TP=1 and `cgtool capture --tp 2 --kind both` (every
replay verified against eager on every rank) with random weights, then prints one table.
With --reuse, reports already in the output folder are read instead of captured again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from cgtool.units import GIB


def capture(model: str, tp: int, kind: str, bs: str, tokens: str, out: Path, reuse: bool) -> dict:
    report = out / "report.json"
    if not (reuse and report.is_file()):
        args = ["cgtool", "capture", "--model", model, "--tp", str(tp), "--kind", kind,
                "--bs", bs, "--tokens", tokens, "--out", str(out)]
        with open(out.with_suffix(".log"), "w") as log:
            code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        print(f"{' '.join(args)}: exit {code}", file=sys.stderr)
        if not report.is_file():
            sys.exit(f"no report from TP={tp}; see {out.with_suffix('.log')}")
    return json.loads(report.read_text())


def rows_by_rank(report: dict, kind: str) -> dict[int, dict[int, dict]]:
    """size -> rank -> row."""
    rows: dict[int, dict[int, dict]] = {}
    for row in report["sizes"]:
        if row["kind"] == kind:
            rows.setdefault(row["size"], {})[row.get("rank", 0)] = row
    return rows


def decode_table(tp1: dict, tpn: dict, tp: int) -> list[str]:
    one, many = rows_by_rank(tp1, "decode"), rows_by_rank(tpn, "decode")
    lines = [(f"| bs | TP=1 replay ms | TP={tp} replay ms (slowest rank) | TP={tp} speedup | "
              f"TP=1 eager ms | TP={tp} eager ms | TP={tp} verified ranks |"),
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for bs in sorted(set(one) & set(many)):
        single, ranks = one[bs][0], many[bs]
        replay = max(r["replay_ms"] or 0.0 for r in ranks.values())
        eager = max(r["eager_ms"] or 0.0 for r in ranks.values())
        ok = sum(r["status"] == "ok" for r in ranks.values())
        speedup = single["replay_ms"] / replay if replay and single["replay_ms"] else 0.0
        lines.append(f"| {bs} | {single['replay_ms']:.3f} | {replay:.3f} | {speedup:.2f}x | "
                     f"{single['eager_ms']:.3f} | {eager:.3f} | {ok}/{len(ranks)} |")
    return lines


def summary(tp1: dict, tpn: dict, tp: int) -> list[str]:
    lines = [(f"GPU {tpn['environment']['gpu_name']}, torch {tpn['environment']['torch']}, "
              f"{tpn['created'][:10]}; model {tpn['model']['name']} (random weights, bf16)")]
    t1 = tp1["totals"]
    lines.append(f"TP=1: weights {t1['weights_bytes'] / GIB:.2f} GiB, KV {t1['kv_tokens']:,} tokens, "
                 f"decode graph pool {t1['graph_pool_bytes'] / GIB:.3f} GiB, capture {t1['capture_s']:.1f} s")
    for rank, t in enumerate(tpn.get("rank_totals") or [tpn["totals"]]):
        lines.append(f"TP={tp} rank {rank}: weights {t['weights_bytes'] / GIB:.2f} GiB, KV "
                     f"{t['kv_tokens']:,} tokens, graph pool {t['graph_pool_bytes'] / GIB:.3f} GiB, "
                     f"capture {t['capture_s']:.1f} s")
    pieces = rows_by_rank(tpn, "piecewise")
    for n in sorted(pieces):
        ranks = pieces[n]
        ok = sum(r["status"] == "ok" for r in ranks.values())
        replay = max(r["replay_ms"] or 0.0 for r in ranks.values())
        eager = max(r["eager_ms"] or 0.0 for r in ranks.values())
        lines.append(f"TP={tp} piecewise {n} tokens: eager {eager:.2f} ms, replay {replay:.2f} ms, "
                     f"verified on {ok}/{len(ranks)} ranks")
    bad = [r for r in tpn["sizes"] if r["status"] != "ok"]
    lines.append(f"TP={tp}: {len(tpn['sizes']) - len(bad)}/{len(tpn['sizes'])} rows verified ok")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--bs", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--tokens", default="256,1024")
    parser.add_argument("--out", type=Path, default=Path("gpu-out/tp"))
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tp1 = capture(args.model, 1, "decode", args.bs, args.tokens, args.out / "tp1-decode", args.reuse)
    tpn = capture(args.model, args.tp, "both", args.bs, args.tokens, args.out / f"tp{args.tp}-both",
                  args.reuse)
    lines = summary(tp1, tpn, args.tp) + [""] + decode_table(tp1, tpn, args.tp)
    print("\n".join(lines))
    (args.out / "bench-tp.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
