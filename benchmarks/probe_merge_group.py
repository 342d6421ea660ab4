"""Issue 33: gluon_mla_wgmma's merge group sizes (argv[1], default 8,4,8,4), timed in turn in one
process with bench_mla_floor's graphs of layers.

    python3 benchmarks/probe_merge_group.py 4,2,1,4,2,1
"""

import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import bench_mla_floor as floor
import bench_moe_mla as bench

from cgtool.attention import gluon_mla_wgmma

GROUPS = tuple(int(g) for g in (sys.argv[1] if len(sys.argv) > 1 else "8,4,8,4").split(","))
copy_bs = bench.copy_bandwidth()
for bs, ctx, real in ((24, 1024, None), (32, 1024, None), (48, 1024, None), (71, 14725, 41)):
    for group in GROUPS:
        gluon_mla_wgmma.MERGE_GROUP = group
        row = floor.floor_case(bs, ctx, copy_bs, (), (64,), (), (), (), True, False, real)
        bench.log(f"bs {bs} x {ctx} real {real}: group {group}: {row['mla_us']:.2f} us ({row['mla_share']:.1%})")
