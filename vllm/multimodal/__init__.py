"""Multimodal inputs (images): what the frontend prepares and the engine core consumes.

Frontend (API process): `media.py` loads images (PIL, data URLs, http(s), file://),
`processing.py` runs the model's own transformers processor (resizing,
normalization, prompt placeholder expansion) and cuts its output into one
`MultiModalFeature` per image (`inputs.py`), each named by a content hash
(`hasher.py`). Core: the scheduler budgets encoder work and mirrors the runner's
encoder cache (`encoder_cache.py`); prefix-cache block keys include the hashes of
the images a block covers (vllm/core/kv_cache_manager.py); the model runner runs the
vision encoder once per image and merges its output at the placeholder positions
(ModelRunnerBase.gather_mm_embeddings). Models with multimodal rotary positions
(Qwen2.5-VL) get 3-row positions from `mrope.py`; `qwen_vl_processor.py` is the
image half of Qwen-VL's processor for installs without torchvision.
"""
from vllm.multimodal.inputs import MultiModalFeature

__all__ = ["MultiModalFeature"]
