"""Context shift for conversations: when the rendered conversation (plus room for a reply) no longer fits the
context, the oldest half of the turns after the system prompt is dropped, as llama.cpp drops half of the tokens
after ``n_keep`` when a sequence fills its context, so a chat never ends on a full context. Whole messages are
dropped (the chat template renders messages, not token ranges)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]


def shift_messages(
    messages: Sequence[Message], n_tokens: Callable[[Sequence[Message]], int], n_ctx: int, room: int
) -> tuple[list[Message], int]:
    """``messages`` with the oldest half of the non-system turns dropped, again until the conversation's tokens
    (``n_tokens``) plus ``room`` fit ``n_ctx`` or only the last message is left; returns (messages, number dropped)."""
    kept = list(messages)
    dropped = 0
    while n_tokens(kept) + room > n_ctx:
        head = 1 if kept and kept[0].get("role") == "system" else 0
        turns = len(kept) - head - 1  # the newest message always stays
        if turns <= 0:
            break
        cut = max(1, turns // 2)
        del kept[head : head + cut]
        dropped += cut
    return kept, dropped
