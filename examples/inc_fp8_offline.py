"""FP8 with INC (Intel Neural Compressor): calibrate, then serve quantized.

Step 1 (mode MEASURE) runs the model in its float dtype over calibration prompts and
writes INC's max-abs statistics when the engine shuts down. Step 2 (mode QUANTIZE)
loads them and runs every decoder linear layer in fp8 with static scales. On a Gaudi
the fp8 ops are Gaudi's; off it (VLLM_USE_FAKE_HPU=1, or the CPU) they are emulated.

    VLLM_TARGET_DEVICE=hpu VLLM_USE_FAKE_HPU=1 python examples/inc_fp8_offline.py \
        [--model PATH] [--workdir ./inc_output]

On a Gaudi, leave out VLLM_USE_FAKE_HPU. The two json files this script writes are
ordinary INC configs: the same files work with `QUANT_CONFIG=... vllm serve MODEL
--quantization inc`.
"""
import argparse
import json
import os

from vllm import LLM, SamplingParams

CALIBRATION = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "List three benefits of regular exercise:",
    "Water boils at a temperature of",
    "Translate to French: Good morning, how are you?",
]


def write_config(path: str, **fields) -> str:
    with open(path, "w") as f:
        json.dump(fields, f, indent=1)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF directory (default: the embedded "
                        "SmolLM2-135M-Instruct)")
    parser.add_argument("--workdir", default="./inc_output")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    model = {"model": args.model} if args.model else {}
    dump = os.path.join(args.workdir, "measure")

    # 1. Calibration: statistics are written at shutdown, to <dump>_hooks_maxabs.json.
    os.environ["QUANT_CONFIG"] = write_config(
        os.path.join(args.workdir, "maxabs_measure.json"),
        mode="MEASURE", observer="maxabs", dump_stats_path=dump)
    llm = LLM(**model, quantization="inc", max_model_len=512, max_num_seqs=8)
    llm.generate(CALIBRATION, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    llm.llm_engine.shutdown()
    del llm
    print(f"statistics: {dump}_hooks_maxabs.json")

    # 2. Quantized run with hardware-aligned (power-of-two) per-tensor scales.
    os.environ["QUANT_CONFIG"] = write_config(
        os.path.join(args.workdir, "maxabs_quant.json"),
        mode="QUANTIZE", observer="maxabs", scale_method="maxabs_hw",
        blocklist={"types": [], "names": ["lm_head"]}, dump_stats_path=dump)
    llm = LLM(**model, quantization="inc", max_model_len=512, max_num_seqs=8)
    for out in llm.generate(CALIBRATION[:3], SamplingParams(temperature=0, max_tokens=24),
                            use_tqdm=False):
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
    stats = llm.llm_engine.get_compile_stats()
    if stats is not None:
        print(f"compiles after warmup: {stats['num_compiles_after_warmup']}")
    llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
