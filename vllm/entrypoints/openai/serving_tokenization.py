"""POST /tokenize ({prompt} or {messages}), POST /detokenize ({tokens}) and, behind
--enable-tokenizer-info-endpoint, GET /tokenizer_info (the tokenizer's configuration)."""
from __future__ import annotations

from typing import Any

from vllm.entrypoints.openai.protocol import (DetokenizeRequest, DetokenizeResponse,
                                              TokenizeChatRequest, TokenizeRequest,
                                              TokenizeResponse)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):

    def __init__(self, *args: Any, chat: OpenAIServingChat, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat = chat  # renders messages exactly as /v1/chat/completions does

    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            self.check_supported(request)
            prompt = await self.chat.render_prompt(request)
            token_ids = prompt.token_ids
            if prompt.multi_modal_data:  # the engine's view: image placeholders expanded
                token_ids = await self.run_blocking(
                    self.chat.chat_images.expanded_ids, prompt.text,
                    prompt.multi_modal_data["image"])
        else:
            token_ids = await self.tokenize_text(request.prompt, request.add_special_tokens)
        token_strs = None
        if request.return_token_strs:
            token_strs = self.tokenizer.convert_ids_to_tokens(token_ids)
        return TokenizeResponse(count=len(token_ids), max_model_len=self.max_model_len,
                                tokens=token_ids, token_strs=token_strs)

    async def create_detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        self.check_token_ids(request.tokens, "tokens")
        text = await self.run_blocking(self.decode, request.tokens)
        return DetokenizeResponse(prompt=text)

    def get_tokenizer_info(self) -> dict[str, Any]:
        """vLLM's /tokenizer_info: the tokenizer's init arguments (tokenizer_config.json's
        content, without file paths) plus its class and the server's --chat-template."""
        config = dict(getattr(self.tokenizer, "init_kwargs", None) or {})
        config.pop("vocab_file", None)
        config.pop("merges_file", None)
        config = _json_value(config)
        config["tokenizer_class"] = type(self.tokenizer).__name__
        if self.chat.chat_template:
            config["chat_template"] = self.chat.chat_template
        return config


def _json_value(value: Any) -> Any:
    """A tokenizer config value as JSON: special tokens (AddedToken) as their text,
    anything else JSON cannot hold as its string form."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
