"""BERT encoders for the pooling runner: `BertModel` (embeddings) and
`BertForSequenceClassification` (cross-encoder rerankers).

Post-LayerNorm transformer encoder with learned absolute positions and token-type
embeddings; attention is bidirectional over each prompt (`attn_type="encoder_only"`:
no KV cache). Modules carry the Hugging Face names, so checkpoint tensors load by
name (with or without the `bert.` prefix of the task models). A cross-encoder's second
segment arrives as token type 1 encoded in the ids (pooler.TOKEN_TYPE_SHIFT). The
XLM-RoBERTa variants (roberta.py) reuse these layers with RoBERTa's positions and head.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention import Attention
from vllm.model_executor.layers.pooler import TOKEN_TYPE_SHIFT, Pooler
from vllm.model_executor.models.utils import check_loaded


_BUFFERS = ("position_ids", "token_type_ids")
"""Index buffers some checkpoints store; recomputed here."""

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def get_activation(name: str):
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act={name!r} is not supported; supported: "
                         f"{', '.join(_ACTIVATIONS)}.")
    return _ACTIVATIONS[name]


def check_single_rank(vllm_config: Any, arch: str) -> None:
    """The encoders here are not sharded: refuse tensor/pipeline parallelism clearly."""
    pc = vllm_config.parallel_config
    if pc.tensor_parallel_size > 1 or pc.pipeline_parallel_size > 1:
        raise ValueError(f"{arch} runs on one rank: tensor_parallel_size and "
                         "pipeline_parallel_size must be 1.")


class BertEmbeddings(nn.Module):
    """word + position + token type (0) embeddings, then LayerNorm."""

    position_offset = 0
    """Added to each position (RoBERTa numbers them from padding_idx + 1)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings,
                                                config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        token_types = input_ids >> TOKEN_TYPE_SHIFT  # see pooler.TOKEN_TYPE_SHIFT
        x = self.word_embeddings(input_ids & ((1 << TOKEN_TYPE_SHIFT) - 1))
        x = x + self.position_embeddings(positions + self.position_offset)
        x = x + self.token_type_embeddings(token_types)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // self.num_heads
        h = config.hidden_size
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.attn = Attention(self.num_heads, self.head_size, self.head_size ** -0.5,
                              prefix=f"{prefix}.attn", attn_type="encoder_only")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.query(x), self.key(x), self.value(x))


class BertAddNorm(nn.Module):
    """dense, then LayerNorm(result + residual): BertSelfOutput and BertOutput."""

    def __init__(self, in_size: int, out_size: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(in_size, out_size)
        self.LayerNorm = nn.LayerNorm(out_size, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.self = BertSelfAttention(config, prefix=f"{prefix}.self")
        self.output = BertAddNorm(config.hidden_size, config.hidden_size,
                                  config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.attention = BertAttention(config, prefix=f"{prefix}.attention")
        self.intermediate = BertIntermediate(config)
        self.output = BertAddNorm(config.intermediate_size, config.hidden_size,
                                  config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, prefix=f"{prefix}.layer.{i}")
                                   for i in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertPooler(nn.Module):
    """BERT's pooler: dense + tanh on the CLS row (the classifier's input)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_rows: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls_rows))


class BertEncoderModel(nn.Module):
    """Embeddings + encoder: the hidden states every BERT-family model pools."""
    embeddings_cls = BertEmbeddings

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.embeddings = self.embeddings_cls(config)
        self.encoder = BertEncoder(config, prefix=f"{prefix}encoder")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, positions))


class BertPoolingBase(nn.Module):
    """What the runner sees of an encoder pooling model: forward -> hidden states,
    `pooler`; weights loaded by Hugging Face name (task-model prefix stripped)."""
    is_pooling_model = True
    checkpoint_prefixes = ("bert.",)
    """Prefixes of the encoder's tensors in task checkpoints (BertFor...)."""
    ignored_prefixes = ("cls.", "lm_head.")
    """Pre-training heads some checkpoints carry; unused by pooling."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[Any] = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        if inputs_embeds is not None:
            raise ValueError("input embeddings are not supported by encoder models.")
        return self.model(input_ids, positions)

    _own_prefixes: tuple[str, ...] = ()
    """Names that belong to this class itself, not the encoder (heads)."""

    def _rename(self, name: str) -> str:
        """A checkpoint name -> this model's parameter name (the encoder under `model.`)."""
        for prefix in self.checkpoint_prefixes:
            if name.startswith(prefix):
                return "model." + name[len(prefix):]
        return name if name.startswith(self._own_prefixes) else "model." + name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            target = self._rename(name)
            if target not in params:
                if not name.startswith(self.ignored_prefixes) and not name.endswith(_BUFFERS):
                    ignored.append(name)
                continue
            param = params[target]
            if param.shape != tensor.shape:
                raise ValueError(f"shape mismatch for {name}: checkpoint "
                                 f"{tuple(tensor.shape)}, parameter {tuple(param.shape)}.")
            param.data.copy_(tensor)
            loaded.add(target)
        return check_loaded(params, loaded, ignored)


class BertModel(BertPoolingBase):
    """BertModel as an embedding model (CLS pooling unless the model says otherwise)."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        check_single_rank(vllm_config, type(self).__name__)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = self.encoder_cls(config, prefix="model.")
        self.pooler = Pooler.from_config(vllm_config.model_config, "embed", "CLS")

    encoder_cls = BertEncoderModel
    ignored_prefixes = ("cls.", "lm_head.", "pooler.", "bert.pooler.")
    """BERT's tanh pooler is not part of the embedding (as sentence-transformers)."""


class BertForSequenceClassification(BertPoolingBase):
    """Cross-encoder: CLS row -> BERT pooler (dense, tanh) -> classifier."""
    _own_prefixes = ("classifier.", "bert_pooler.")

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        check_single_rank(vllm_config, type(self).__name__)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = BertEncoderModel(config, prefix="model.")
        self.bert_pooler = BertPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.pooler = Pooler.from_config(vllm_config.model_config, "classify", "CLS",
                                         head=self._head)

    def _head(self, cls_rows: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.bert_pooler(cls_rows))

    def _rename(self, name: str) -> str:
        if name.startswith("bert.pooler."):
            return "bert_pooler." + name[len("bert.pooler."):]
        return super()._rename(name)
