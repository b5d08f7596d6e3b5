"""One prompt builder for every subcommand (generate, bench, benchmark, check-greedy, the study, training).

A conversation becomes token ids the way EAGLE's and Spec-Bench's scripts build it:

1. fastchat's conversation template where fastchat knows the model (vicuna, llama-2, qwen, ...; its
   catch-all `one_shot` does not count), with Llama-2-chat's default system prompt, as EAGLE's
   llama-2-chat script sets it;
2. otherwise the tokenizer's chat template (the embedded default, Llama-3, ...), for Llama-3 after the same
   system prompt, as EAGLE's Llama-3 script sets it;
3. bare text, the messages joined by blank lines, only when neither exists, with a one-line warning.

The model is named by its hub id or path (`model_spec`), else by the tokenizer's `name_or_path`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .embedded import EMBEDDED

# Llama-2-chat's default system prompt, which EAGLE's llama-2-chat answers use.
LLAMA2_SYSTEM = ("You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while "
                 "being safe.  Your answers should not include any harmful, unethical, racist, sexist, toxic, "
                 "dangerous, or illegal content. Please ensure that your responses are socially unbiased and "
                 "positive in nature.\n\nIf a question does not make any sense, or is not factually coherent, "
                 "explain why instead of answering something not correct. If you don't know the answer to a "
                 "question, please don't share false information.")

_warned: set[str] = set()


def fastchat_template(model_spec):
    """fastchat's conversation template for the model (a fresh copy), or None where fastchat has none of its own."""
    if model_spec in (None, "", EMBEDDED):
        return None
    from fastchat.model import get_conversation_template

    name = str(model_spec)
    if Path(name).exists():  # a local folder or file: its own name, not the folders above it (a tmp or cache path)
        name = Path(name).name
    template = get_conversation_template(name)
    if template.name == "one_shot":  # fastchat's catch-all
        return None
    if template.name.startswith("llama-2") and not template.system_message:
        template.set_system_message(LLAMA2_SYSTEM)
    return template


def message_ids(tokenizer, messages: list[dict], model_spec=None, template=None) -> list[int]:
    """Token ids of a conversation ({"role", "content"} messages ending with a user message), up to where the
    assistant's answer starts.  `template`: a fastchat template already looked up (else looked up here)."""
    if template is None:
        template = fastchat_template(model_spec or getattr(tokenizer, "name_or_path", None))
    if template is not None:
        conversation = template.copy()
        for message in messages:
            if message["role"] == "system":
                conversation.set_system_message(message["content"])
            else:
                conversation.append_message(conversation.roles[message["role"] != "user"], message["content"])
        conversation.append_message(conversation.roles[1], None)
        return tokenizer(conversation.get_prompt())["input_ids"]
    if getattr(tokenizer, "chat_template", None):
        name = str(model_spec or getattr(tokenizer, "name_or_path", "")).lower()
        if re.search(r"llama-?3(?![0-9])", name) and not any(message["role"] == "system" for message in messages):
            messages = [{"role": "system", "content": LLAMA2_SYSTEM}, *messages]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
    name = str(model_spec or getattr(tokenizer, "name_or_path", "") or "this model")
    if name not in _warned:
        _warned.add(name)
        print(f"warning: neither fastchat nor the tokenizer has a conversation template for {name}: prompts are "
              f"the bare messages joined by blank lines", file=sys.stderr)
    return tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]


def conversation_ids(tokenizer, turns: list[str], answers=(), model_spec=None, template=None) -> list[int]:
    """The user turns so far and the assistant's answers to all but the last, as `message_ids` builds them."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return message_ids(tokenizer, messages, model_spec, template)
