"""Tensor and pipeline parallel runs in 2 gloo processes match the 1-process logits."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from _model_helpers import full_prompt_logits, make_vllm_config, prompt_ids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, init_method: str, cases: list, out_dir: str) -> None:
    """Runs every case in one process group; writes this rank's logits per case."""
    torch.set_num_threads(1)
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  get_pp_group, init_distributed_environment,
                                  initialize_model_parallel)
    from vllm.model_executor.model_loader import get_model
    from vllm.sequence import IntermediateTensors

    init_distributed_environment(world, rank, init_method, rank, "gloo")
    try:
        for name, path, tp, pp, ids in cases:
            initialize_model_parallel(tp, pp)
            model = get_model(make_vllm_config(path, tp=tp, pp=pp))
            pp_group = get_pp_group()
            with torch.no_grad():
                if pp_group.is_first_rank and pp_group.is_last_rank:
                    logits = full_prompt_logits(model, ids)
                elif pp_group.is_first_rank:
                    out = model(ids, torch.arange(len(ids)))
                    assert isinstance(out, IntermediateTensors)
                    pp_group.send_tensor_dict(out.tensors)
                    logits = None
                else:
                    received = IntermediateTensors(pp_group.recv_tensor_dict())
                    hidden = model(ids, torch.arange(len(ids)), received)
                    logits = model.compute_logits(hidden)
            torch.save({"logits": logits, "layers": (model.start_layer, model.end_layer)},
                       os.path.join(out_dir, f"{name}-{rank}.pt"))
            destroy_model_parallel()
    finally:
        destroy_distributed_environment()


@pytest.mark.timeout(300)
def test_tp2_and_pp2_match_single_process(tiny_model_factory, tmp_path):
    ids = prompt_ids(24)
    cases = [
        # name, model, tp, pp
        ("tp2-gqa", tiny_model_factory("qwen2"), 2, 1),  # 2 kv heads: one per rank
        # 1 kv head replicated on both ranks; odd vocab padded to a multiple of 2; tied head.
        ("tp2-mqa", tiny_model_factory("qwen2", num_key_value_heads=1, vocab_size=49153,
                                       tie_word_embeddings=True), 2, 1),
        # 3 layers split 2 + 1; tied embeddings loaded into the last stage's LM head.
        ("pp2-tied", tiny_model_factory("llama", num_hidden_layers=3,
                                        tie_word_embeddings=True), 1, 2),
        # Experts' intermediate dim split over ranks; shared expert reduced with them.
        ("tp2-moe", tiny_model_factory("qwen2_moe"), 2, 1),
        # Soft-capped attention and logits, a window shorter than the prompt, tied head.
        ("tp2-gemma2", tiny_model_factory("gemma2", sliding_window=8), 2, 1),
        # ALiBi, 6 heads: each rank takes 3 of the non-power-of-2 slopes; fused per-head qkv.
        ("tp2-bloom", tiny_model_factory("bloom", n_head=6, hidden_size=96), 2, 1),
        # 3 blocks split 2 + 1; the embedding LayerNorm on the first stage, tied LM head last.
        ("pp2-bloom", tiny_model_factory("bloom", n_layer=3), 1, 2),
    ]
    expected = {name: full_prompt_logits(get_model_tp1(path), ids) for name, path, _, _ in cases}
    mp.spawn(_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                            [(n, p, tp, pp, ids) for n, p, tp, pp in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _, tp, pp in cases:
        results = [torch.load(tmp_path / f"{name}-{r}.pt") for r in range(2)]
        with_logits = [r["logits"] for r in results if r["logits"] is not None]
        assert len(with_logits) == (2 if tp == 2 else 1), name
        for logits in with_logits:
            torch.testing.assert_close(logits, expected[name], atol=1e-4, rtol=1e-4)
        if pp == 2:
            assert [r["layers"] for r in results] == [(0, 2), (2, 3)]


def get_model_tp1(path: str):
    from vllm.model_executor.model_loader import get_model
    return get_model(make_vllm_config(path))


def test_pp_layer_split():
    from vllm.model_executor.models.utils import get_pp_indices
    assert [get_pp_indices(30, r, 4) for r in range(4)] == [(0, 7), (7, 15), (15, 23), (23, 30)]
    assert [get_pp_indices(4, r, 2) for r in range(2)] == [(0, 2), (2, 4)]
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        get_pp_indices(2, 0, 3)


def test_uninitialized_groups_act_as_one_rank():
    from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size,
                                  model_parallel_is_initialized,
                                  tensor_model_parallel_all_gather,
                                  tensor_model_parallel_all_reduce)
    assert not model_parallel_is_initialized()
    assert (get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()) == (1, 0)
    pp = get_pp_group()
    assert pp.is_first_rank and pp.is_last_rank and pp.world_size == 1
    x = torch.randn(3, 4)
    assert tensor_model_parallel_all_reduce(x) is x
    assert tensor_model_parallel_all_gather(x) is x


def test_model_parallel_sizes_must_match_world():
    from vllm.distributed import initialize_model_parallel
    with pytest.raises(ValueError, match="world size"):
        initialize_model_parallel(2, 1)
