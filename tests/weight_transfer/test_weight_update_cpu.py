"""In-place weight updates offline on the CPU (engine core in this process): vLLM's
LLM surface, both backends, prefix-cache invalidation, and the errors of bad input."""
from __future__ import annotations

import gc

import pytest

from _wt_helpers import checkpoint_tensors, greedy, update_by_shm

ENGINE = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20,
              max_num_seqs=8, enable_prefix_caching=True)


def _release(llm) -> None:
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def fresh_b(ckpt_b) -> list[list[int]]:
    """What a new engine on checkpoint B answers; also checks that weight updates need
    a weight_transfer_config."""
    from vllm import LLM
    llm = LLM(ckpt_b, **ENGINE)
    try:
        with pytest.raises(ValueError, match="Weight transfer is not configured"):
            llm.init_weight_transfer_engine({"init_info": {}})
        return greedy(llm)
    finally:
        _release(llm)


@pytest.mark.timeout(180)
def test_update_to_other_checkpoint_equals_fresh_engine(ckpt_a, ckpt_b, fresh_b):
    from vllm import LLM
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.base import (WeightTransferInitRequest,
                                                       WeightTransferUpdateRequest)
    llm = LLM(ckpt_a, weight_transfer_config=WeightTransferConfig(backend="shm"), **ENGINE)
    try:
        before = greedy(llm)
        assert before != fresh_b  # the checkpoints answer differently
        assert greedy(llm) == before  # ... and the second run hits the prefix cache
        assert llm.get_weight_version() is None

        llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
        update_by_shm(llm, checkpoint_tensors(ckpt_b), batches=3)
        llm.finish_weight_update(weight_version="step-1")
        # The cached prefixes of A's KV must not serve these prompts again.
        assert greedy(llm) == fresh_b
        assert llm.get_weight_version() == "step-1"
        llm.update_weight_version("relabelled")
        assert llm.get_weight_version() == "relabelled"

        # A second session takes the engine back to A (vLLM's request object this time).
        from vllm.distributed.weight_transfer import pack_into_shared_memory
        llm.start_weight_update()
        shm, info = pack_into_shared_memory(checkpoint_tensors(ckpt_a).items())
        try:
            llm.update_weights(WeightTransferUpdateRequest(update_info=info))
        finally:
            shm.close()
            shm.unlink()
        llm.finish_weight_update()
        assert greedy(llm) == before
    finally:
        _release(llm)


@pytest.mark.timeout(120)
def test_bad_input_gives_clear_errors(ckpt_a, ckpt_b):
    from vllm import LLM
    from vllm.distributed.weight_transfer import pack_into_shared_memory
    llm = LLM(ckpt_a, weight_transfer_config={"backend": "shm"}, **ENGINE)
    try:
        reference = greedy(llm)
        with pytest.raises(ValueError, match="init_weight_transfer_engine first"):
            llm.start_weight_update()
        with pytest.raises(ValueError, match="unknown key.*rank"):
            llm.init_weight_transfer_engine({"init_info": {"rank": 0}})
        with pytest.raises(ValueError, match="'init_info'"):
            llm.init_weight_transfer_engine({"info": {}})
        llm.init_weight_transfer_engine({"init_info": {}})
        name = "model.layers.0.mlp.down_proj.weight"
        good = checkpoint_tensors(ckpt_b)[name]
        shm, info = pack_into_shared_memory([(name, good)])
        try:
            with pytest.raises(ValueError, match="start_weight_update first"):
                llm.update_weights({"update_info": info})
            with pytest.raises(ValueError, match="start_weight_update first"):
                llm.finish_weight_update()
            llm.start_weight_update()
            with pytest.raises(ValueError, match="already in progress"):
                llm.start_weight_update()
        finally:
            shm.close()
            shm.unlink()
        bad = [
            ([("model.layers.0.mlp.no_such_proj.weight", good)], "Unknown weight name"),
            ([(name, good[:, :-1])], "does not fit this model"),
        ]
        for tensors, message in bad:
            shm, info = pack_into_shared_memory(tensors)
            try:
                with pytest.raises(ValueError, match=message):
                    llm.update_weights({"update_info": info})
            finally:
                shm.close()
                shm.unlink()
        with pytest.raises(ValueError, match="no shared-memory segment"):
            llm.update_weights({"update_info": dict(info, shm_name="vllm-test-missing")})
        with pytest.raises(ValueError, match="Unknown dtype name 'float7'"):
            llm.update_weights({"update_info": dict(info, dtype_names=["float7"])})
        with pytest.raises(ValueError, match="same length"):
            llm.update_weights({"update_info": dict(info, shapes=[])})
        with pytest.raises(ValueError, match="unknown key.*path"):
            llm.update_weights({"update_info": dict(info, path="/x")})
        with pytest.raises(ValueError, match="weight_version must be a string"):
            llm.update_weight_version(3)
        llm.finish_weight_update()
        assert greedy(llm) == reference  # nothing was written by the refused batches
    finally:
        _release(llm)


def test_weight_transfer_config_is_checked():
    from vllm.config import WeightTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    with pytest.raises(ValueError, match="nccl and ipc need CUDA"):
        WeightTransferConfig(backend="nccl")
    with pytest.raises(ValueError, match="unknown key"):
        WeightTransferConfig.from_cli({"backend": "shm", "packed": True})
    import argparse
    args = EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(
        ["--weight-transfer-config", '{"backend": "disk"}'])
    assert WeightTransferConfig.from_cli(args.weight_transfer_config).backend == "disk"


@pytest.mark.timeout(180)
def test_bf16_packed_linears_are_repacked_after_update(ckpt_a, ckpt_b):
    """bf16 on the CPU runs linears from packed copies of the weights: an update drops
    them with the old values and finish_weight_update packs the new ones."""
    from vllm import LLM
    args = dict(ENGINE, dtype="bfloat16")
    fresh = LLM(ckpt_b, **args)
    try:
        expected = greedy(fresh)
    finally:
        _release(fresh)
    llm = LLM(ckpt_a, weight_transfer_config={"backend": "disk"}, **args)
    try:
        def packed(worker) -> int:
            from vllm.cpu.gemm import PACKS_ATTR
            return sum(PACKS_ATTR in m.__dict__ for m in worker.model_runner.model.modules())

        packs = llm.collective_rpc(packed)[0]
        llm.init_weight_transfer_engine({"init_info": {}})
        llm.start_weight_update()
        llm.update_weights({"update_info": {"path": ckpt_b}})
        assert llm.collective_rpc(packed)[0] == 0  # the copies of the old values are gone
        llm.finish_weight_update()
        assert llm.collective_rpc(packed)[0] == packs
        assert greedy(llm) == expected
    finally:
        _release(llm)
