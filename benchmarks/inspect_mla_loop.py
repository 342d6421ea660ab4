"""Issue 33: MLA decode's stage 1 compiled for sm_90 without a GPU, and its loop as ptxas laid it out.

Two merge changes (bf16 partials; the log-sum-exps loaded once) lowered stage 1's registers and
slowed its unchanged 4-warp loop by 12-25% on the H100 (benchmarks/results/
h100-2026-11-26-mla-timeline, calls 7-8, in git history at 532ce70). This compiles the kernel for 4 chunks merged in the
last program, by default as the 4-warp launches do (`--tiles`: keys a step, warps, stages),
with Triton's NVIDIA backend, which needs no GPU, then reads the cubin with the backend's
cuobjdump. For this checkout's triton_mla.py and, with --against, an older copy, it prints the
shared memory and registers a launch takes, the loop's length in instructions, and where in
the loop its tensor-core MMAs (HMMA) and asynchronous copies (LDGSTS) fall
(`cgtool.runtime.offline_compile` builds the launch's signature).

    python3 benchmarks/inspect_mla_loop.py [--against OLD_triton_mla.py] [--partials bf16] [--sass-dir DIR]
        [--tiles '64,4,2;64,8,2;32,8,3']
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import triton

from cgtool.runtime.offline_compile import backend_tool, compile_for

POINTERS = {"Q": "*bf16", "Kv": "*bf16", "MidOut": "*fp32", "MidLse": "*fp32", "O": "*bf16", "Tickets": "*i32",
            "req_to_token": "*i32", "req_pool_indices": "*i32", "seq_lens": "*i32", "Trace": "*fp32"}
# deepseek-v2-lite's heads and latent; 64 keys a step, 4 chunks merged in the last program
CONSTANTS = {"NUM_HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_R": 512, "BLOCK_P": 64, "BLOCK_H": 16,
             "BLOCK_N": 64, "NUM_SPLITS": 4, "MIN_CHUNK": 256, "FUSED_MERGE": True, "MERGE_D": 128, "TRACE": False,
             "RELEASE": False}
INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_stage1(module, num_warps: int = 4, num_stages: int = 2, block_n: int = 64):
    return compile_for(module._mla_decode_stage1, {**CONSTANTS, "BLOCK_N": block_n}, POINTERS, num_warps, num_stages)


def loop_layout(cubin: bytes) -> dict:
    """Registers, and the MMA loop's length and op positions, from the cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([backend_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([backend_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in map(INSTRUCTION.match, sass.splitlines()) if m]
    ops = [(addr, re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]) for addr, text in code]
    loops = []
    for addr, text in code:
        target = re.search(r"BRA\b.*0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [op for a, op in ops if int(target.group(1), 16) <= a <= addr]
            if any(op.startswith("HMMA") for op in body):
                loops.append(body)
    body = max(loops, key=len)

    def where(prefix: str) -> list[int]:
        return [i for i, op in enumerate(body) if op.startswith(prefix)]

    mma, copies = where("HMMA"), where("LDGSTS")
    registers = re.search(r"REG:(\d+)", usage)
    return {
        "registers": int(registers.group(1)) if registers else None,
        "loop_instructions": len(body),
        "mma": len(mma), "mma_first_last": (mma[0], mma[-1]),
        "async_copies": len(copies), "copies_first_last": (copies[0], copies[-1]),
        "ops": dict(Counter(op.split(".")[0] for op in body).most_common(8)),
        "sass": sass,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", help="an older triton_mla.py, compiled the same way")
    parser.add_argument("--partials", choices=("fp32", "bf16"), default="fp32", help="the chunks' partial outputs")
    parser.add_argument("--sass-dir", help="write each kernel's SASS here")
    parser.add_argument("--tiles", default="64,4,2",
                        help="keys a step, warps, stages; ';' between settings (default: 4 chunks' launch)")
    args = parser.parse_args()
    POINTERS["MidOut"] = f"*{args.partials}"
    from cgtool.attention import triton_mla

    print(f"Triton {triton.__version__}, sm_90, {CONSTANTS['NUM_SPLITS']} chunks, fused merge, {args.partials} partials")
    kernels = {"this checkout": triton_mla}
    if args.against:
        kernels["against"] = load_module(args.against, "against_triton_mla")
    for tiles in args.tiles.split(";"):
        block_n, warps, stages = (int(v) for v in tiles.split(","))
        for name, module in kernels.items():
            compiled = compile_stage1(module, warps, stages, block_n)
            layout = loop_layout(compiled.asm["cubin"])
            label = f"{name}, {block_n} keys, {warps} warps, {stages} stages"
            if args.sass_dir:
                Path(args.sass_dir, f"{label.replace(', ', '_').replace(' ', '-')}.sass").write_text(layout["sass"])
            # Shared memory tells how many copies of the gathered tile the pipeline keeps.
            print(f"{label}: {compiled.metadata.shared} bytes of shared memory, {layout['registers']} registers a "
                  f"thread; loop of {layout['loop_instructions']} instructions, {layout['mma']} HMMA at positions "
                  f"{layout['mma_first_last'][0]}-{layout['mma_first_last'][1]}, {layout['async_copies']} LDGSTS at "
                  f"{layout['copies_first_last'][0]}-{layout['copies_first_last'][1]}; {layout['ops']}")


if __name__ == "__main__":
    main()
