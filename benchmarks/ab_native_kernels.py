"""Two builds of the native CPU kernels (`vllm/cpu/cpu_ops.cpp`) side by side in ONE
engine process: decode steps of the default (fused) path, rounds alternating A B A B.

Why one process: on a shared or frequency-shifting VM the same decode step takes 10-20%
more in one process than in the next (the machine changes phase, see benchmarks/README.md,
"Roofline"), so a build measured in its own process measures the phase, not the change.
Here both libraries are loaded into the same engine; each round points the engine at one
of them (the kernel loader's library and the fused decode runner rebuilt from it: the
packed weights are the same layout in every build) and times the decode steps of a fresh
batch of random prompts.

    python benchmarks/ab_native_kernels.py --a HEAD~1 --b . --batch-sizes 1 16 64
    python benchmarks/ab_native_kernels.py --a HEAD~1 --b . --extra-cflags=-mno-avx512f

`--a` / `--b`: a git revision (its `vllm/cpu/*.cpp` and `*.h`) or a folder holding
`cpu_ops.cpp` (`.`: this checkout). The engine is single-process (the default executor).
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a file: see benchmark_throughput.py.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import ctypes
import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.benchmark_roofline import StepTimes
from benchmarks.compare_vllm_cpu import cpu_model_name

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = "vllm/cpu"


def kernel_sources(spec: str, into: Path) -> Path:
    """The folder holding the `cpu_ops.cpp` of `spec`: a folder as it is (`.` is this
    checkout's kernel folder), or a git revision's kernel files written under `into`."""
    folder = Path(spec)
    if folder.is_dir():
        for candidate in (folder / KERNEL_DIR, folder):
            if (candidate / "cpu_ops.cpp").is_file():
                return candidate
        raise SystemExit(f"{spec}: no cpu_ops.cpp in this folder or its {KERNEL_DIR}/")
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{spec}:{KERNEL_DIR}"],
                           capture_output=True, text=True)
    if names.returncode != 0:
        raise SystemExit(f"{spec}: neither a folder nor a git revision "
                         f"({names.stderr.strip()})")
    out = into / spec.replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    for name in names.stdout.split():
        if name.endswith((".cpp", ".h")):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{spec}:{KERNEL_DIR}/{name}"],
                                  capture_output=True, check=True).stdout
            (out / name).write_bytes(text)
    return out


def load_build(folder: Path, extra_flags: list[str], into: Path) -> ctypes.CDLL:
    """cpu_ops of `folder`, built (or found in the cache) as the engine builds its own;
    with `extra_flags` (e.g. -mno-avx512f: the AVX2 kernels on an AVX-512 machine)
    compiled into `into` with the engine's flags plus those."""
    from vllm.cpu import loader
    source = folder / "cpu_ops.cpp"
    if extra_flags:
        path = into / f"cpu_ops-{abs(hash((str(folder), *extra_flags)))}.so"
        proc = subprocess.run([loader._compiler(), *loader.CXX_FLAGS, *extra_flags, "-o",
                               str(path), str(source)], capture_output=True, text=True,
                              timeout=loader.BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise SystemExit(f"building {source} with {' '.join(extra_flags)} failed:\n"
                             f"{proc.stderr.strip()[-2000:]}")
    else:
        path = loader.build_library(source)
    lib = ctypes.CDLL(str(path))
    loader._declare(lib)
    return lib


def use_library(llm: Any, lib: ctypes.CDLL) -> None:
    """Point the engine at `lib`: the loader hands it out from now on and every decoder
    stack rebuilds its fused runner (which holds the library's functions) at its next
    step."""
    from vllm.cpu import loader
    from vllm.model_executor.layers.decoder_stack import DecoderStack
    loader._state["lib"] = lib
    for module in _model(llm).modules():
        if isinstance(module, DecoderStack):
            module.state.clear()


def _model(llm: Any) -> Any:
    worker = getattr(llm.llm_engine.engine_core.executor, "worker", None)
    if worker is None:
        raise SystemExit("ab_native_kernels.py needs the single-process executor.")
    return worker.model_runner.model


def decode_step_ms(llm: Any, batch: int, input_len: int, output_len: int,
                   rng: np.random.Generator) -> float:
    """Median wall time of the pure decode steps of `batch` fresh random prompts."""
    from vllm import SamplingParams
    prompts = [{"prompt_token_ids": rng.integers(0, 10000, input_len).tolist()}
               for _ in range(batch)]
    with StepTimes() as timer:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=output_len,
                                             ignore_eos=True), use_tqdm=False)
    times = [t for t, tokens, requests in timer.steps if tokens == requests == batch]
    if not times:
        raise RuntimeError(f"no decode step of all {batch} requests was scheduled")
    return 1000 * float(np.median(times))


def main(args: argparse.Namespace) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    with tempfile.TemporaryDirectory() as tmp:
        folders = {"a": kernel_sources(args.a, Path(tmp)), "b": kernel_sources(args.b, Path(tmp))}
        libs = {k: load_build(f, args.extra_cflags.split(), Path(tmp))
                for k, f in folders.items()}   # before the engine: a bad build fails fast
        llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    rng = np.random.default_rng(args.seed or 0)
    load_before = list(os.getloadavg())
    rounds: dict[str, dict[int, list[float]]] = {k: {b: [] for b in args.batch_sizes}
                                                 for k in libs}
    for _ in range(args.rounds):
        for batch in args.batch_sizes:
            for key, lib in libs.items():
                use_library(llm, lib)
                llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                             use_tqdm=False)  # builds the fused runner outside the timing
                rounds[key][batch].append(decode_step_ms(llm, batch, args.input_len,
                                                         args.output_len, rng))
    rows = []
    for batch in args.batch_sizes:
        a, b = (float(np.median(rounds[k][batch])) for k in ("a", "b"))
        rows.append({"batch": batch, "a_ms": a, "b_ms": b, "speedup": a / b,
                     "a_rounds": rounds["a"][batch], "b_rounds": rounds["b"][batch]})
    result = {"cpu": cpu_model_name(), "load_avg": [load_before, list(os.getloadavg())],
              "a": args.a, "b": args.b, "extra_cflags": args.extra_cflags, "model": args.model, "input_len": args.input_len,
              "output_len": args.output_len, "rounds": args.rounds, "rows": rows}
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def print_report(r: dict) -> None:
    print(f"{r['cpu']}; load average {r['load_avg'][0][0]:.2f} -> {r['load_avg'][1][0]:.2f}; "
          f"A = {r['a']}, B = {r['b']}{' (' + r['extra_cflags'] + ')' if r['extra_cflags'] else ''}; "
          f"decode step medians of {r['rounds']} alternating rounds")
    print("| batch | A ms | B ms | A / B | A rounds | B rounds |")
    print("|---|---|---|---|---|---|")
    for row in r["rows"]:
        print(f"| {row['batch']} | {row['a_ms']:.2f} | {row['b_ms']:.2f} | "
              f"{row['speedup']:.2f}x | "
              f"{' '.join(f'{v:.2f}' for v in row['a_rounds'])} | "
              f"{' '.join(f'{v:.2f}' for v in row['b_rounds'])} |")


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import EngineArgs
    parser = argparse.ArgumentParser(description="A/B two builds of the native CPU kernels "
                                                 "in one engine process.")
    parser.add_argument("--a", default="HEAD", help="git revision or folder (default HEAD)")
    parser.add_argument("--b", default=".", help="git revision or folder (default: this "
                                                 "checkout)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--extra-cflags", default="",
                        help="compiler flags added to both builds, e.g. '-mno-avx512f' to "
                             "compare the AVX2 kernels on an AVX-512 machine")
    parser.add_argument("--json", type=str, default=None, help="write the result here")
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(build_parser().parse_args())
