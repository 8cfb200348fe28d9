"""Speculative decoding: proposers guess the next tokens cheaply, the target model
verifies all of them in one forward, and the rejection sampler keeps the output
distribution exactly the target's.

- `config.py`: `SpeculativeConfig` (vLLM's `--speculative-config` fields);
- `ngram_proposer.py` / `draft_model_proposer.py`: where drafts come from;
- `rejection_sampler.py`: the accept / resample rule;
- `verification.py`: the runner's side (drafts in the batch, the verified tokens);
- `metrics.py`: acceptance counters (`vllm:spec_decode_*`) and the logged rate.
"""
