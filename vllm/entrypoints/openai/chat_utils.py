"""Chat messages -> prompt text through a Jinja chat template.

The template is the request's `chat_template`, else the server's --chat-template, else the
tokenizer's own. Message content may be a string or a list of {"type": "text"} parts,
and, for multimodal models, {"type": "image_url"} parts: each image becomes the
model's placeholder text in the message (the processor expands it) and its URL is
collected in order (`conversation_and_images`). Other part types are refused.
"""
from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any, Optional

from vllm.entrypoints.openai.errors import BadRequestError

if TYPE_CHECKING:  # annotations only: validate_parsed_serve_args imports this module early
    from vllm.entrypoints.openai.protocol import ChatMessage

logger = logging.getLogger(__name__)
_JINJA_MARKERS = ("{{", "{%", "{#")
# Keyword arguments apply_chat_template controls itself: a request may not override them.
_RESERVED_TEMPLATE_KWARGS = {"conversation", "messages", "chat_template", "tokenize",
                             "add_generation_prompt", "continue_final_message", "tools",
                             "documents", "return_dict", "return_tensors", "padding",
                             "truncation", "max_length", "tokenizer_kwargs",
                             "return_assistant_tokens_mask"}


def load_chat_template(value: Optional[str]) -> Optional[str]:
    """--chat-template: a file path, or the template itself (recognised by Jinja markers)."""
    if value is None:
        return None
    if any(marker in value for marker in _JINJA_MARKERS):
        return value
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    raise ValueError(f"--chat-template: {value!r} is neither a readable file nor a Jinja "
                     "template.")


def check_request_chat_template(request: Any, trusted: bool) -> None:
    """A request may bring its own template only when the server trusts request templates
    (--trust-request-chat-template, as in vLLM): a template is code the server runs."""
    kwargs = getattr(request, "chat_template_kwargs", None) or {}
    if trusted or (request.chat_template is None and kwargs.get("chat_template") is None):
        return
    raise BadRequestError("The request passes its own chat_template, but the server was not "
                          "started with --trust-request-chat-template: request-supplied chat "
                          "templates are refused.", param="chat_template")


def conversation_from_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the template; list content is joined into one string (text-only:
    image parts are refused)."""
    return conversation_and_images(messages, None)[0]


CONTENT_FORMATS = ("auto", "string", "openai")
"""vLLM's chat_template_content_format: how a message's content reaches the template.
"string" joins text parts into one string; "openai" keeps the list of parts
({"type": "text", "text": ...}) for templates that loop over them; "auto" is "openai"
when the template loops over a message's content, else "string"."""

_CONTENT_LOOP = re.compile(r"\bfor\s+\w+\s+in\s+\w+(\[['\"]content['\"]\]|\.content)")


def resolve_content_format(content_format: str, template: Optional[str],
                           multimodal: bool = False) -> str:
    """"string" or "openai" for `content_format`, "auto" decided from the template text
    (a `for part in message['content']` loop means the template expects parts). A
    multimodal model's "auto" is "string": its processor finds the image placeholders
    in the rendered text."""
    if content_format not in CONTENT_FORMATS:
        raise BadRequestError(f"chat_template_content_format must be one of "
                              f"{', '.join(CONTENT_FORMATS)}, got {content_format!r}.",
                              param="chat_template_content_format")
    if content_format != "auto":
        return content_format
    if multimodal:
        return "string"
    looping = isinstance(template, str) and _CONTENT_LOOP.search(template) is not None
    return "openai" if looping else "string"


def conversation_and_images(messages: list[Any], image_placeholder: Optional[str],
                            content_format: str = "string"
                            ) -> tuple[list[dict[str, Any]], list[Any]]:
    """(conversation dicts, image references in order). `messages` are ChatMessage
    models or plain dicts (the offline LLM.chat); an image reference is an image_url's
    URL or, offline, a PIL image (`image_pil` parts). Image parts are refused when
    `image_placeholder` is None (a text-only model). `content_format` "openai" gives
    each message's content as a list of text parts."""
    if not messages:
        raise BadRequestError("messages must contain at least one message.", param="messages")
    if content_format == "openai" and image_placeholder is not None:
        raise BadRequestError("chat_template_content_format 'openai' is not supported for "
                              "multimodal models here (their image placeholders are found "
                              "in the rendered text): use 'auto' or 'string'.",
                              param="chat_template_content_format")
    conversation, images = [], []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) and not hasattr(message, "role"):
            raise BadRequestError(f"Each message must be a dict with 'role' and 'content', "
                                  f"got {type(message).__name__}.", param=f"messages.{i}")
        if isinstance(message, dict):
            if not isinstance(message.get("role"), str):
                raise BadRequestError("Each message needs a 'role' string.",
                                      param=f"messages.{i}.role")
            entry = {k: v for k, v in message.items() if k != "content"}
            content = message.get("content")
        else:
            entry = dict(message.model_extra or {})
            entry["role"] = message.role
            if message.name is not None:
                entry["name"] = message.name
            content = message.content
        texts = _content_texts(content, i, image_placeholder, images)
        entry["content"] = ([{"type": "text", "text": t} for t in texts]
                            if content_format == "openai" else "\n".join(texts))
        conversation.append(entry)
    return conversation, images


def content_chars(content: Any) -> int:
    """Characters of a conversation entry's content (a string, or "openai" text parts)."""
    if isinstance(content, str):
        return len(content)
    return sum(len(part.get("text") or "") for part in content)


def _part_field(part: Any, name: str) -> Any:
    return part.get(name) if isinstance(part, dict) else getattr(part, name, None)


def _content_texts(content: Any, index: int, image_placeholder: Optional[str] = None,
                   images: Optional[list[Any]] = None) -> list[str]:
    """A message's text parts; null content (e.g. an assistant turn) is one empty string,
    which every text template can render. Image parts become `image_placeholder`."""
    if content is None:
        return [""]
    if isinstance(content, str):
        return [content]
    if not isinstance(content, (list, tuple)):
        raise BadRequestError(f"Message content must be a string or a list of parts, got "
                              f"{type(content).__name__}.", param=f"messages.{index}.content")
    texts = []
    for j, part in enumerate(content):
        kind = _part_field(part, "type")
        param = f"messages.{index}.content.{j}"
        if kind in ("image_url", "image_pil") and image_placeholder is not None:
            texts.append(image_placeholder)
            images.append(_image_ref(part, kind, param))
            continue
        if kind != "text":
            allowed = ("'text' and 'image_url' parts are" if image_placeholder is not None
                       else "'text' parts are (this model takes no images)")
            raise BadRequestError(f"Content part type {kind!r} is not supported; only "
                                  f"{allowed}.", param=param)
        text = _part_field(part, "text")
        if not isinstance(text, str):
            raise BadRequestError("A 'text' content part needs a 'text' string.",
                                  param=f"{param}.text")
        texts.append(text)
    return texts


def _image_ref(part: Any, kind: str, param: str) -> Any:
    value = _part_field(part, kind)
    if kind == "image_pil":
        return value
    url = _part_field(value, "url") if value is not None else None
    if not isinstance(url, str) or not url:
        raise BadRequestError("An 'image_url' content part needs image_url.url.",
                              param=f"{param}.image_url")
    return url


def render_mistral_chat(tokenizer: Any, conversation: list[dict[str, Any]], *,
                        chat_template: Optional[str], add_generation_prompt: bool,
                        continue_final_message: bool,
                        chat_template_kwargs: Optional[dict[str, Any]] = None,
                        tools: Optional[list[dict[str, Any]]] = None
                        ) -> tuple[list[int], str]:
    """(token ids, text) of the conversation from mistral-common (--tokenizer-mode
    mistral): no template, and the ids are the prompt (control tokens are ids, never text
    re-encoded); a chat the format cannot express is the client's 400."""
    if chat_template:
        logger.warning("--tokenizer-mode mistral: chat_template is ignored; mistral-common "
                       "renders the chat.")
    try:
        return tokenizer.encode_chat(conversation, tools, add_generation_prompt,
                                     continue_final_message)
    except ValueError as e:
        raise BadRequestError(str(e), param="messages") from e


def apply_chat_template(tokenizer: Any, conversation: list[dict[str, Any]], *,
                        chat_template: Optional[str], add_generation_prompt: bool,
                        continue_final_message: bool,
                        chat_template_kwargs: Optional[dict[str, Any]] = None,
                        tools: Optional[list[dict[str, Any]]] = None) -> str:
    """Render the conversation to prompt text; a template failure is the client's 400.

    `tools` (OpenAI tool definitions) go to the template, which lists them for the model.
    """
    kwargs = dict(chat_template_kwargs or {})
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise BadRequestError(f"chat_template_kwargs may not set {', '.join(reserved)}.",
                              param="chat_template_kwargs")
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise BadRequestError(
            "The model's tokenizer has no chat template; start the server with "
            "--chat-template or pass chat_template in the request.", param="chat_template")
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools or None, **kwargs)
    except Exception as e:  # noqa: BLE001 - jinja errors come from the client's input
        raise BadRequestError(f"Could not apply the chat template: {type(e).__name__}: {e}",
                              param="messages") from e
    if not isinstance(text, str):
        raise BadRequestError("The chat template did not render to text.",
                              param="chat_template")
    return text
