"""GET /v1/models and the served-name check every route makes."""
from __future__ import annotations

from typing import Optional

from vllm.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission


class OpenAIServingModels:
    """The names this server answers to (--served-model-name, default --model)."""

    def __init__(self, served_model_names: list[str], model_path: str,
                 max_model_len: int) -> None:
        if not served_model_names:
            raise ValueError("served_model_names must name at least one model.")
        self.served_model_names = list(served_model_names)
        self.model_path = model_path
        self.max_model_len = max_model_len

    @property
    def default_name(self) -> str:
        return self.served_model_names[0]

    def is_served(self, name: Optional[str]) -> bool:
        return name in self.served_model_names

    def show_available_models(self) -> ModelList:
        return ModelList(data=[
            ModelCard(id=name, root=self.model_path, max_model_len=self.max_model_len,
                      permission=[ModelPermission()])
            for name in self.served_model_names])
