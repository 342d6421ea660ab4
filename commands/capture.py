"""`cgtool capture`: capture, verify and measure decode and piecewise graphs on a GPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cgtool.commands.common import (
    DEFAULT_MODEL,
    check_out_folder,
    cli_errors,
    console,
    err_console,
    import_gpu_module,
)
from cgtool.commands.signals import exit_code, signal_name, terminate_as_interrupt
from cgtool.errors import CgtoolError

if TYPE_CHECKING:
    from cgtool.capture.options import CaptureOptions, SessionState
    from cgtool.documents.results import CaptureReport
    from cgtool.specs.hidden_states import HiddenMode


class Kind(str, Enum):
    decode = "decode"
    piecewise = "piecewise"
    both = "both"
    vit = "vit"


class MoeBackend(str, Enum):
    triton = "triton"
    torch = "torch"


class Compiler(str, Enum):
    eager = "eager"
    inductor = "inductor"


class PrefillBackend(str, Enum):
    piecewise = "piecewise"
    breakable = "breakable"


def parse_sizes(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    from cgtool.runners.sizes import capture_sizes

    try:
        sizes = [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise CgtoolError(f"{flag} '{text}' is not a list of integers", f"Write e.g. {flag} 1,2,4,8.") from None
    try:
        checked = capture_sizes(sizes)
    except ValueError:
        raise CgtoolError(f"{flag} '{text}' must list positive integers", f"Write e.g. {flag} 1,2,4,8.") from None
    from cgtool.capture.options import check_capture_size

    check_capture_size(flag, checked[-1])
    return checked


def sizes_from_plan(path: Path) -> tuple[list[int], list[int]]:
    from cgtool.documents.results import load_plan

    plan = load_plan(path)
    return list(plan.decode.capture_bs), list(plan.piecewise.capture_num_tokens)


def choose_fraction(flag: float | None, plan: Path | None) -> float:
    """--mem-fraction-static when given, else the plan's, else cgtool's default; says which
    on stderr."""
    from cgtool.capture.options import DEFAULT_MEM_FRACTION_STATIC

    if flag is not None or plan is None:
        value = DEFAULT_MEM_FRACTION_STATIC if flag is None else flag
        if plan is not None:
            err_console.print(f"--mem-fraction-static {value:g} from the flag (overrides the plan's)", highlight=False)
        return value
    from cgtool.documents.results import load_plan

    value = load_plan(plan).memory.mem_fraction_static
    err_console.print(f"--mem-fraction-static {value:g} from the plan {plan}", highlight=False, soft_wrap=True)
    return value


def choose_sizes(
    bs: str | None, max_bs: int, tokens: str | None, max_tokens: int, plan: Path | None
) -> tuple[list[int], list[int]]:
    from cgtool.capture.options import check_capture_size
    from cgtool.planner.schedules import default_schedule

    check_capture_size("--max-bs", max_bs)
    check_capture_size("--max-tokens", max_tokens)
    plan_bs, plan_tokens = sizes_from_plan(plan) if plan else (None, None)
    sglang = default_schedule("sglang", max_bs=max_bs, max_tokens=max_tokens)
    capture_bs = parse_sizes(bs, "--bs") or plan_bs or list(sglang.decode_bs)
    capture_tokens = parse_sizes(tokens, "--tokens") or plan_tokens or list(sglang.piecewise_tokens)
    return capture_bs, capture_tokens


@cli_errors
def capture(
    model: Annotated[str | None, typer.Option(help="Model preset (see `cgtool models`) or a Hugging Face folder with config.json (default: llama-3.1-8b; with --kind vit, a vision preset, default qwen2.5-vl-7b).")] = None,
    kind: Annotated[Kind, typer.Option(help="Which graphs to capture: the LM's decode and piecewise graphs (both), or a vision tower's (vit).")] = Kind.both,
    bs: Annotated[str | None, typer.Option(help="Decode batch sizes, e.g. 1,2,4,8 (default: SGLang's list up to --max-bs).")] = None,
    max_bs: Annotated[int, typer.Option(help="Largest decode batch size for SGLang's default list.")] = 256,
    tokens: Annotated[str | None, typer.Option(help="Piecewise token counts, e.g. 64,128,256.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Largest token count for SGLang's default piecewise list.")] = 4096,
    plan: Annotated[Path | None, typer.Option(help="Take the sizes from a plan.json written by `cgtool plan`.")] = None,
    mem_fraction_static: Annotated[float | None, typer.Option(help="Share of GPU memory for weights + KV pool, as SGLang's flag (default: the plan's with --plan, else 0.85, SGLang's usual start).")] = None,
    context_len: Annotated[int, typer.Option(help="Tokens already cached per decode request while timing.")] = 1024,
    max_total_tokens: Annotated[int | None, typer.Option(min=16, help="KV pool size in tokens, as SGLang's flag (default: from --mem-fraction-static).")] = None,
    compiler: Annotated[Compiler, typer.Option(help="Compiler for piecewise pieces.")] = Compiler.eager,
    prefill_backend: Annotated[PrefillBackend | None, typer.Option(help="Prefill graphs: piecewise (torch.compile, split at attention) or breakable (the eager forward recorded in segments broken at attention, no compile: SGLang's default on CUDA from 0.5.23); default piecewise.")] = None,
    compile_cache: Annotated[bool, typer.Option("--compile-cache/--no-compile-cache", help="Reuse the piecewise body an earlier run of the same model traced, kept in $CGTOOL_CACHE_DIR (default ~/.cache/cgtool/compile).")] = True,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="Random weights for a HF folder (presets always use them).")] = False,
    enable_cudagraph_gc: Annotated[bool, typer.Option("--enable-cudagraph-gc", help="Keep Python's GC on during capture.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Add kernel tables, a memory snapshot of each kind's first capture and Chrome traces.")] = False,
    profile_sizes: Annotated[str | None, typer.Option(help="With --profile, sizes that get a Chrome trace, e.g. decode:1,piecewise:512 (default: each kind's smallest and largest).")] = None,
    out: Annotated[Path, typer.Option(help="Folder for report.json, sizes.csv, figures and report.html.")] = Path("cgtool-capture"),
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size: start this many ranks, one GPU each (SGLang's --tp-size).")] = 1,
    hidden_states: Annotated[str, typer.Option("--hidden-states", help="Decode graphs' hidden-state mode: null, last or full; an upward list such as null,full recaptures at each, as SGLang does.")] = "null",
    moe_backend: Annotated[MoeBackend, typer.Option(help="MoE models' experts: the fused Triton kernel, which reads only the routed experts, or the torch reference, which runs every expert on every token.")] = MoeBackend.triton,
    image_sizes: Annotated[str | None, typer.Option(help="With --kind vit: image sizes in pixels, HEIGHTxWIDTH, each a size the processor produces (multiples of 28), one graph each (default: the --plan's, else 448x448,560x840,896x896,1344x1344).")] = None,
) -> None:
    """Capture and replay decode and piecewise CUDA graphs on a GPU and measure each size."""
    mem_fraction_static = choose_fraction(mem_fraction_static, plan)
    if not 0.0 < mem_fraction_static < 1.0:
        raise CgtoolError(f"--mem-fraction-static {mem_fraction_static} must be between 0 and 1", "Try 0.85, or leave it out.")
    from cgtool.capture.options import validate_tp
    from cgtool.specs.config import load_model_config

    # Every argument is checked before the GPU: a typo should not answer "needs a CUDA GPU".
    hidden_modes = parse_capture_modes(hidden_states, kind)
    from cgtool.capture.prefill_backend import choose_prefill_backend

    backend = PrefillBackend(choose_prefill_backend(prefill_backend and prefill_backend.value))
    check_prefill_backend(backend, compiler, tp)
    if kind == Kind.vit:
        model, sizes, patches = vit_inputs(model, image_sizes or plan_image_sizes(plan), tp)
        capture_bs, capture_tokens = [], []
    else:
        if image_sizes is not None:
            raise CgtoolError("--image-sizes applies to --kind vit", "Add --kind vit, or drop --image-sizes.")
        sizes, patches = (), []
        model = model or DEFAULT_MODEL
        load_model_config(model)
        validate_tp(model, tp, None)
        capture_bs, capture_tokens = choose_sizes(bs, max_bs, tokens, max_tokens, plan)
    profiled = parse_profile_sizes(profile_sizes, capture_bs, capture_tokens, patches)
    check_out_folder(out)
    import torch

    from cgtool.capture.options import CaptureOptions, require_cuda

    # The session's own reference: the CPU tests replace `session.require_cuda`.
    import_gpu_module("cgtool.capture.session", require_cuda).require_cuda()
    validate_tp(model, tp, torch.cuda.device_count())
    kinds = ("decode", "piecewise") if kind == Kind.both else (kind.value,)
    opts = CaptureOptions(
        model=model, kinds=kinds, capture_bs=capture_bs, capture_num_tokens=capture_tokens,
        mem_fraction_static=mem_fraction_static, context_len=context_len, compiler=compiler.value,
        enable_cudagraph_gc=enable_cudagraph_gc, random_weights=random_weights, profile=profile,
        out_dir=out, dtype=torch.bfloat16, max_total_tokens=max_total_tokens, tp_size=tp,
        profile_sizes=profiled, hidden_modes=hidden_modes, moe_backend=moe_backend.value,
        image_sizes=sizes, compile_cache=compile_cache, prefill_backend=backend.value,
    )
    _run_and_save(opts)


def check_prefill_backend(backend: PrefillBackend, compiler: Compiler, tp: int) -> None:
    if backend is not PrefillBackend.breakable:
        return
    if compiler is not Compiler.eager:
        raise CgtoolError(f"--compiler {compiler.value} applies to piecewise prefill graphs, and "
                          "--prefill-backend breakable compiles nothing",
                          "Drop --compiler, or use --prefill-backend piecewise.")
    if tp > 1:
        raise CgtoolError("--prefill-backend breakable runs on one GPU in cgtool, not --tp " + str(tp),
                          "Drop --tp, or use --prefill-backend piecewise.")


def parse_capture_modes(text: str, kind: Kind) -> tuple[HiddenMode, ...]:
    """--hidden-states as modes; only decode graphs return hidden states beside the logits."""
    from cgtool.specs.hidden_states import HiddenMode, parse_hidden_modes

    modes = parse_hidden_modes(text)
    if kind in (Kind.piecewise, Kind.vit) and modes != (HiddenMode.NULL,):
        raise CgtoolError(
            f"--hidden-states {text} applies to decode graphs, and --kind {kind.value} captures none",
            "Use --kind decode or both, or leave --hidden-states at null.",
        )
    return modes


def plan_image_sizes(plan: Path | None) -> str | None:
    """The image sizes of a plan's ViT graphs as --image-sizes text (None: no plan, or no images)."""
    if plan is None:
        return None
    from cgtool.documents.results import load_plan

    vit = load_plan(plan).vit
    return ",".join(f"{h}x{w}" for h, w in vit.image_sizes) if vit and vit.image_sizes else None


def vit_inputs(
    model: str | None, image_sizes: str | None, tp: int
) -> tuple[str, tuple[tuple[int, int], ...], list[int]]:
    """--kind vit's vision preset, image sizes and their patch counts, checked on the host.

    --model names a vision preset (cgtool/presets/vision/), not a language model: the ViT
    session loads the vision tower alone, as its graphs are separate from the LM's. Left at
    its default, it is the default vision preset."""
    from cgtool.specs.vision import (
        DEFAULT_VISION_PRESET,
        DEFAULT_VIT_IMAGE_SIZES,
        capture_grids,
        load_vision_preset,
        parse_image_sizes,
        vision_preset_names,
    )

    model = model or DEFAULT_VISION_PRESET
    if model not in vision_preset_names():
        raise CgtoolError(
            f"--kind vit captures a vision tower, and --model {model} is not a vision preset",
            f"Use one of {', '.join(vision_preset_names())} (see `cgtool models`).",
        )
    if tp != 1:
        raise CgtoolError("--kind vit runs on one GPU, not --tp " + str(tp), "Drop --tp.")
    preset = load_vision_preset(model)
    sizes = parse_image_sizes(image_sizes or DEFAULT_VIT_IMAGE_SIZES, preset)
    patches = [rows * cols for rows, cols in capture_grids(sizes, preset)]
    return model, tuple(sizes), patches


def _run_and_save(opts: CaptureOptions) -> None:
    """Run the session under a progress bar and save its report, or as much of it as was
    measured when a signal or an error stops it; exits with the report's code."""
    from cgtool.capture.options import SessionState
    from cgtool.capture.session import run_capture
    from cgtool.capture.tp import merge_rank_partials, run_capture_tp
    from cgtool.capture.vit import run_vit_capture
    from cgtool.reports.capture_view import CaptureProgressBar

    state, tp, out = SessionState(), opts.tp_size, opts.out_dir
    state.on_phase = _checkpointer(opts, state)
    try:
        with terminate_as_interrupt(), CaptureProgressBar(err_console) as bar:
            if opts.kinds == ("vit",):
                report = run_vit_capture(opts, bar.update, state)
            elif tp > 1:
                report = run_capture_tp(opts, bar.update)
            else:
                report = run_capture(opts, bar.update, state)
    except KeyboardInterrupt as interrupt:
        reason = f"interrupted by {signal_name(interrupt)}"
        if hasattr(interrupt, "rank_partials"):
            partial = merge_rank_partials(interrupt.rank_partials, tp, reason)  # type: ignore[attr-defined]
            if partial is not None:
                _save(partial, out, state)
        else:
            _keep_partial(opts, state, reason)
        raise typer.Exit(exit_code(interrupt)) from None
    except CgtoolError as error:
        # A pitfall found at one size must not throw away the sizes measured before it, nor
        # leave a checkpoint saying less than the error does (nothing is saved before a load).
        _keep_partial(opts, state, str(error))
        raise
    except Exception as error:  # noqa: BLE001 - a kernel or driver failure cgtool did not foresee
        _save_after_crash(error, opts, state)
        raise typer.Exit(1) from None
    _save(report, out, state)
    raise typer.Exit(capture_exit_code(report))


def _checkpointer(opts: CaptureOptions, state: SessionState) -> Callable[[str], None]:
    """Saves report.json as each phase begins (SessionState.on_phase); a failure to is said
    once and the capture goes on: its end or its signal handler saves again."""
    from cgtool.capture.session import checkpoint_report
    from cgtool.documents.results import REPORT_FILENAME, write_report

    failed: list[str] = []

    def save(phase: str) -> None:
        try:
            report = checkpoint_report(opts, state, phase)
            if report is not None:
                opts.out_dir.mkdir(parents=True, exist_ok=True)
                write_report(report, opts.out_dir / REPORT_FILENAME)
        except Exception as error:  # noqa: BLE001 - a checkpoint must never stop the capture
            if not failed:
                failed.append(phase)
                err_console.print(f"warning: report.json not saved before {phase} ({error}); "
                                  "it is saved at the end", highlight=False, soft_wrap=True)

    return save


def _keep_partial(opts: CaptureOptions, state: SessionState, reason: str) -> None:
    """Saves what was measured, marked incomplete; if even that fails, says so in one line
    and leaves the last checkpoint on disk."""
    from cgtool.capture.session import partial_report

    try:
        partial = partial_report(opts, state, reason)
        if partial is not None:
            _save(partial, opts.out_dir, state)
    except Exception as error:  # noqa: BLE001 - the exit code and the checkpoint still stand
        err_console.print(f"error: the partial report could not be saved ({type(error).__name__}: "
                          f"{error}); {opts.out_dir / 'report.json'} holds the last checkpoint",
                          highlight=False, soft_wrap=True)


def _save_after_crash(error: Exception, opts: CaptureOptions, state: SessionState) -> None:
    """Keeps what was measured and the traceback, and says so in one line: an unforeseen
    error (a kernel that does not fit the GPU, a driver fault) is a failed run, not bad input."""
    import traceback

    from cgtool.capture.session import partial_report

    first_line = (str(error).strip().splitlines() or [""])[0]
    reason = f"{type(error).__name__}: {first_line}".rstrip(": ")
    partial = partial_report(opts, state, f"stopped by {reason}")
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    log = opts.out_dir / "error.log"
    log.write_text("".join(traceback.format_exception(error)))
    if partial is not None:
        _save(partial, opts.out_dir, state)
    where = f" during {state.stopped_in}" if state.stopped_in else ""
    err_console.print(f"error: capture stopped{where} by {reason} (traceback in {log}); "
                      "please report it with that file.", highlight=False, soft_wrap=True)


def parse_profile_sizes(
    text: str | None, capture_bs: list[int], capture_tokens: list[int],
    vit_patches: list[int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """`decode:1,piecewise:512` into sizes by kind; each named size must be captured."""
    captured = {"decode": capture_bs, "piecewise": capture_tokens, "vit": vit_patches or []}
    if text is None:
        return {k: tuple(sorted({min(v), max(v)})) for k, v in captured.items() if v}
    chosen: dict[str, list[int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        kind, _, size = item.partition(":")
        if kind not in captured or not size.isdigit() or int(size) not in captured[kind]:
            raise CgtoolError(
                f"--profile-sizes: {item!r} is not a captured size",
                "Name sizes as decode:BS, piecewise:TOKENS or vit:PATCHES from --bs / --tokens / --image-sizes.",
            )
        chosen.setdefault(kind, []).append(int(size))
    return {k: tuple(v) for k, v in chosen.items()}


def capture_exit_code(report: CaptureReport) -> int:
    """1 when any size is missing (incomplete) or replays something else than eager (unsafe)."""
    return int(report.status == "incomplete" or any(s.status == "unsafe" for s in report.sizes))


def _save(report: CaptureReport, out: Path, state: SessionState) -> None:
    from cgtool.documents.results import REPORT_FILENAME, write_report
    from cgtool.reports.capture_view import print_capture_summary
    from cgtool.reports.render import render_report

    out.mkdir(parents=True, exist_ok=True)
    write_report(report, out / REPORT_FILENAME)  # first, so a signal while rendering loses nothing
    start = time.perf_counter()
    written = [out / REPORT_FILENAME, *render_report(report, out)]
    report.totals.phase_s["render"] = time.perf_counter() - start
    write_report(report, out / REPORT_FILENAME)
    print_capture_summary(console, report, state.failed, written)
