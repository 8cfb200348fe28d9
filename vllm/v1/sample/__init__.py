"""`vllm.v1.sample`: see logits_processor/."""
