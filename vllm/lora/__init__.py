"""LoRA adapters: requests, PEFT loading, device slots and batched application.

- `request.LoRARequest`: which adapter a request uses (name, id, path).
- `peft_loader`: reads a PEFT adapter directory into per-layer A/B tensors laid out
  for our fused projections (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
- `layers.LoRALinear`: wraps a linear layer; adds the adapter delta of each token.
- `punica`: the batched shrink/expand of many adapters in one step.
- `models.LoRAModelManager`: host cache (LRU, max_cpu_loras) and device slots (LRU,
  max_loras); turns a step's per-token adapter ids into slot indices.
"""
