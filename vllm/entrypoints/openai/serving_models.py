"""GET /v1/models, the served-name check every route makes, and the LoRA adapters.

The server answers to its base names (--served-model-name, default --model) and to
one name per LoRA adapter: those of --lora-modules, loaded at startup, and those
loaded at runtime through POST /v1/load_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING).
A request whose `model` is an adapter's name runs with that adapter.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Optional

from vllm.entrypoints.openai.errors import BadRequestError, NotFoundError
from vllm.entrypoints.openai.protocol import (LoadLoRAAdapterRequest, ModelCard, ModelList,
                                              ModelPermission, UnloadLoRAAdapterRequest)
from vllm.lora.peft_loader import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)


@dataclass
class LoRAModulePath:
    """One --lora-modules entry."""
    name: str
    path: str
    base_model_name: Optional[str] = None


class OpenAIServingModels:
    """The names this server answers to, and the adapter behind each LoRA name."""

    def __init__(self, served_model_names: list[str], model_path: str, max_model_len: int,
                 engine: Any = None,
                 lora_modules: Optional[list[LoRAModulePath]] = None) -> None:
        if not served_model_names:
            raise ValueError("served_model_names must name at least one model.")
        self.served_model_names = list(served_model_names)
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.engine = engine
        self.static_lora_modules = list(lora_modules or [])
        self.lora_requests: dict[str, LoRARequest] = {}
        self._lora_ids = itertools.count(1)

    @property
    def default_name(self) -> str:
        return self.served_model_names[0]

    def is_served(self, name: Optional[str]) -> bool:
        return name in self.served_model_names or name in self.lora_requests

    def lora_request_for(self, name: Optional[str]) -> Optional[LoRARequest]:
        """The adapter a request's `model` names (None: the base model)."""
        return self.lora_requests.get(name) if name else None

    def show_available_models(self) -> ModelList:
        cards = [ModelCard(id=name, root=self.model_path, max_model_len=self.max_model_len,
                           permission=[ModelPermission()])
                 for name in self.served_model_names]
        cards += [ModelCard(id=lora.lora_name, root=lora.lora_path,
                            parent=lora.base_model_name or self.default_name,
                            permission=[ModelPermission()])
                  for lora in self.lora_requests.values()]
        return ModelList(data=cards)

    # ----------------------------------------------------------------- LoRA
    async def init_static_loras(self) -> None:
        """Load every --lora-modules adapter; a bad one stops the server from starting."""
        for module in self.static_lora_modules:
            try:
                await self.load_lora_adapter(
                    LoadLoRAAdapterRequest(lora_name=module.name, lora_path=module.path),
                    base_model_name=module.base_model_name)
            except (BadRequestError, NotFoundError) as e:
                raise ValueError(f"--lora-modules {module.name}={module.path}: {e.message}"
                                 ) from e

    async def load_lora_adapter(self, request: LoadLoRAAdapterRequest,
                                base_model_name: Optional[str] = None) -> str:
        name, path = request.lora_name, request.lora_path
        if not name or not path:
            raise BadRequestError("Both 'lora_name' and 'lora_path' must be provided.",
                                  err_type="InvalidUserInput")
        known = self.lora_requests.get(name)
        inplace = bool(getattr(request, "load_inplace", False))
        if known is not None and not inplace:
            raise BadRequestError(f"The lora adapter '{name}' has already been loaded.",
                                  err_type="InvalidUserInput")
        # load_inplace on a known name: the same id, its weights read again (vLLM's RL
        # hot-swap); the engine spends the flag, so later requests do not reload.
        lora = LoRARequest(lora_name=name,
                           lora_int_id=known.lora_int_id if known else next(self._lora_ids),
                           lora_path=path, base_model_name=base_model_name or (
                               known.base_model_name if known else None),
                           load_inplace=inplace)
        try:
            await self.engine.add_lora(lora)
        except LoRAAdapterNotFoundError as e:
            raise NotFoundError(str(e), param="lora_path") from e
        except ValueError as e:
            raise BadRequestError(str(e), param="lora_path") from e
        self.lora_requests[name] = dataclasses.replace(lora, load_inplace=False)
        logger.info("Loaded %s LoRA adapter: name '%s', path '%s'",
                    "(in place) the" if known else "new", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> str:
        name = request.lora_name
        if not name and not request.lora_int_id:
            raise BadRequestError("either 'lora_name' and 'lora_int_id' needs to be provided.",
                                  err_type="InvalidUserInput")
        lora = self.lora_requests.get(name)
        if lora is None:
            raise NotFoundError(f"The lora adapter '{name}' cannot be found.",
                                param="lora_name")
        del self.lora_requests[name]
        await self.engine.remove_lora(lora.lora_int_id)
        logger.info("Removed LoRA adapter: name '%s'", name)
        return f"Success: LoRA adapter '{name}' removed successfully."
