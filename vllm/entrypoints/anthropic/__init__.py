"""The Anthropic Messages API (`/v1/messages`), served through the chat completions code."""
