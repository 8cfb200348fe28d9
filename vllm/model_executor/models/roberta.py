"""XLM-RoBERTa encoders for the pooling runner: `XLMRobertaModel` (embeddings, e.g.
BGE-M3 style) and `XLMRobertaForSequenceClassification` (rerankers, e.g. BGE-reranker).

The BERT encoder (bert.py) with RoBERTa's two differences: positions are numbered
from `padding_idx + 1` (the Hugging Face model counts non-padding tokens from there;
prompts here carry no padding), and the classifier head is dense -> tanh -> out_proj on
the CLS row, without BERT's pooler. Checkpoint tensors may carry the `roberta.` prefix.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.models.bert import (BertEmbeddings, BertEncoderModel, BertModel,
                                             BertPoolingBase, check_single_rank)


class RobertaEmbeddings(BertEmbeddings):

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.position_offset = (getattr(config, "pad_token_id", 1) or 0) + 1


class RobertaEncoderModel(BertEncoderModel):
    embeddings_cls = RobertaEmbeddings


class XLMRobertaModel(BertModel):
    """Embedding model; CLS pooling unless the model's sentence-transformers files say
    otherwise."""
    encoder_cls = RobertaEncoderModel
    checkpoint_prefixes = ("roberta.",)
    ignored_prefixes = ("lm_head.", "pooler.", "roberta.pooler.")


class RobertaClassificationHead(nn.Module):
    """dense -> tanh -> out_proj on the CLS row (Hugging Face's names)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, cls_rows: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(cls_rows)))


class XLMRobertaForSequenceClassification(BertPoolingBase):
    """Cross-encoder reranker: CLS row -> classification head."""
    checkpoint_prefixes = ("roberta.",)
    ignored_prefixes = ("lm_head.", "roberta.pooler.")
    _own_prefixes = ("classifier.",)

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        check_single_rank(vllm_config, type(self).__name__)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = RobertaEncoderModel(config, prefix="model.")
        self.classifier = RobertaClassificationHead(config)
        self.pooler = Pooler.from_config(vllm_config.model_config, "classify", "CLS",
                                         head=self.classifier)
