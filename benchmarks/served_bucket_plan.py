"""Served check of an HPU bucket plan (issue 27): default buckets, then the planned ones.

    VLLM_TARGET_DEVICE=hpu VLLM_USE_FAKE_HPU=1 python benchmarks/served_bucket_plan.py

Phase 1 starts the OpenAI server (HPU graph mode: `PT_HPU_LAZY_MODE=1`) with the
default exponential buckets and `VLLM_BUCKET_TRACE`, sends the workload, reads
`/metrics` and stops the server. The planner then makes a plan from that trace with as
many buckets as the default (`python -m vllm.hpu.bucket_planner`), and phase 2 serves
the same workload with `VLLM_BUCKET_PLAN`. Each phase's row: the padding waste the
server measured beside the planner's prediction (its replay of the trace through the
runner's own split and bucket lookup), graph compilations after warmup, passes in
fallback buckets and the warmup's seconds. The planned run records a trace too: its
replay through the plan shows how much of a gap between prediction and measurement
comes from the steps themselves (which prompts of a request had reached the engine
when a step was scheduled) rather than from the model of the padding.

The workload: `--num-requests` completions requests of `--prompts-per-request` prompts
of `--min-words`..`--max-words` random words (seeded), one request after the other,
greedy, `--max-tokens` tokens each. Both phases see the same prompts; the server adds
a request's prompts one by one, so a step may start before all of them arrived, and
the two runs' steps can differ a little.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from typing import Optional

from benchmarks.served_compare import free_port, start_server, stop_server, wait_ready

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl "
         "guy moment air teacher force education").split()

ENGINE_FLAGS = ("--max-model-len", "1024", "--max-num-seqs", "8",
                "--max-num-batched-tokens", "1024", "--block-size", "128",
                "--num-gpu-blocks-override", "64", "--no-enable-prefix-caching")
"""The served check's engine limits (benchmarks/README.md, "HPU bucket plan")."""

PHASES = ("prompt", "decode")


@dataclass
class PhaseResult:
    """One table row: what `/metrics` said after the workload, the prediction, and
    the planner's replay of this run's own trace with this run's buckets."""
    name: str
    measured_waste: dict[str, float]
    predicted_waste: dict[str, float]
    replayed_waste: dict[str, float]
    compiles_after_warmup: float
    fallback_passes: float
    warmup_s: float

    def row(self) -> str:
        waste = " | ".join(f"{self.measured_waste[p]:.2%} ({self.predicted_waste[p]:.2%}; "
                           f"{self.replayed_waste[p]:.2%})" for p in PHASES)
        return (f"| {self.name} | {waste} | {self.compiles_after_warmup:g} | "
                f"{self.fallback_passes:g} | {self.warmup_s:.0f} s |")


def make_prompts(num_requests: int, per_request: int, min_words: int, max_words: int,
                 seed: int = 0) -> list[list[str]]:
    """Each request's prompts: a random number of random words, the same for a seed."""
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
             for _ in range(per_request)] for _ in range(num_requests)]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format samples as (name, labels, value); comments skipped."""
    samples = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric(samples: list[tuple[str, dict[str, str], float]], name: str,
           **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (KeyError if none)."""
    found = [v for n, lab, v in samples
             if n == name and all(lab.get(k) == want for k, want in labels.items())]
    if not found:
        raise KeyError(f"{name}{labels or ''} not in /metrics")
    return sum(found)


def phase_result(name: str, samples: list, predicted: dict[str, float],
                 replayed: dict[str, float]) -> PhaseResult:
    return PhaseResult(
        name=name,
        measured_waste={p: metric(samples, "vllm:hpu_padding_waste_ratio", phase=p)
                        for p in PHASES},
        predicted_waste={p: float(predicted[p]) for p in PHASES},
        replayed_waste={p: float(replayed[p]) for p in PHASES},
        compiles_after_warmup=metric(samples, "vllm:hpu_graph_compilations_total"),
        fallback_passes=metric(samples, "vllm:hpu_fallback_bucket_passes_total"),
        warmup_s=metric(samples, "vllm:hpu_warmup_seconds"))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read().decode()


def _complete(port: int, model: str, prompts: list[str], max_tokens: int) -> None:
    body = json.dumps({"model": model, "prompt": prompts, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as resp:
        out = json.loads(resp.read())
    if len(out.get("choices", [])) != len(prompts):
        raise RuntimeError(f"expected {len(prompts)} choices, got {out}")


def serve_phase(args: argparse.Namespace, env: dict[str, str], log_path: str,
                requests: list[list[str]]) -> list:
    """Start the server, send the requests one after the other, return /metrics."""
    port = free_port()
    proc = start_server(sys.executable, args.model, args.dtype, 1024, port, env,
                        os.getcwd(), log_path, ENGINE_FLAGS[2:])
    try:
        wait_ready(proc, port, args.timeout, log_path)
        model = json.loads(_get(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
        for prompts in requests:
            _complete(port, model, prompts, args.max_tokens)
        return parse_metrics(_get(f"http://127.0.0.1:{port}/metrics"))
    finally:
        stop_server(proc)


def replay(trace: str, plan: Optional[str] = None) -> dict[str, float]:
    """The planner's replay of a trace with the default (exponential) buckets, or with
    a plan's."""
    from vllm.hpu.bucket_planner import default_context, evaluate, load_plan, plan_context
    from vllm.hpu.bucket_trace import read_trace
    limits, passes = read_trace(trace)
    if plan is None:
        return evaluate(default_context(limits), passes).waste
    bucket_plan = load_plan(plan)
    return evaluate(plan_context(bucket_plan, limits), passes,
                    bucket_plan.decode_row_weight).waste


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="hpu", VLLM_USE_FAKE_HPU="1",
               PT_HPU_LAZY_MODE="1", VLLM_HPU_LOG_STEP_GRAPH_COMPILATION="1")
    for name in ("VLLM_BUCKET_TRACE", "VLLM_BUCKET_PLAN", "VLLM_BUCKETING_STRATEGY"):
        env.pop(name, None)
    env.update(extra)
    return env


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-requests", type=int, default=4)
    p.add_argument("--prompts-per-request", type=int, default=12)
    p.add_argument("--min-words", type=int, default=4)
    p.add_argument("--max-words", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for "
                   "each server (the warmup)")
    p.add_argument("--work-dir", default=None, help="trace, plan and server logs "
                   "(default: a new temporary directory)")
    args = p.parse_args(argv)
    if args.model is None:
        from vllm.transformers_utils.config import embedded_default_model_path
        args.model = embedded_default_model_path()
    work = args.work_dir or tempfile.mkdtemp(prefix="served-bucket-plan-")
    os.makedirs(work, exist_ok=True)
    trace, plan = os.path.join(work, "trace.jsonl"), os.path.join(work, "plan.json")
    requests = make_prompts(args.num_requests, args.prompts_per_request, args.min_words,
                            args.max_words, args.seed)
    samples = serve_phase(args, _env(VLLM_BUCKET_TRACE=trace),
                          os.path.join(work, "default.log"), requests)
    default_waste = replay(trace)
    rows = [phase_result("default exponential (planner's replay of the trace)", samples,
                         default_waste, default_waste)]
    print(rows[0].row(), flush=True)
    subprocess.run([sys.executable, "-m", "vllm.hpu.bucket_planner", "--trace", trace,
                    "--output", plan], check=True)
    with open(plan) as f:
        predicted = json.load(f)["predicted_waste"]
    plan_trace = os.path.join(work, "trace-plan.jsonl")
    samples = serve_phase(args, _env(VLLM_BUCKET_PLAN=plan, VLLM_BUCKET_TRACE=plan_trace),
                          os.path.join(work, "plan.log"), requests)
    rows.append(phase_result("plan (planner's prediction)", samples, predicted,
                             replay(plan_trace, plan)))
    print("| run | prompt waste, measured (predicted; replay of this run) | decode waste, "
          "measured (predicted; replay of this run) | compiles after warmup | fallback "
          "passes | warmup |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row.row())
    print(f"trace, plan and server logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
