"""One prompt builder for every subcommand: fastchat's template where fastchat knows the model (Llama-2-chat with
EAGLE's system prompt), else the tokenizer's chat template, else bare text with a one-line warning."""

import pytest
from transformers import AutoTokenizer

from eagle_mdsd import bench, models, prompts


@pytest.fixture(scope="module")
def tokenizer():
    models.load_target()  # makes sure the converted embedded model (and its tokenizer) exists
    return AutoTokenizer.from_pretrained(models.cache_dir() / "smollm2-135m-instruct")


def test_the_embedded_model_keeps_its_chat_template(tokenizer):
    messages = [{"role": "user", "content": "Name a colour."}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert models.chat_prompt_ids(tokenizer, "Name a colour.") == expected  # by its folder's name: no fastchat
    assert bench.conversation_ids(tokenizer, ["Name a colour."], []) == expected


def test_a_model_fastchat_knows_gets_fastchat_s_template_in_every_builder(tokenizer):
    vicuna = "lmsys/vicuna-7b-v1.3"
    text = tokenizer.decode(models.chat_prompt_ids(tokenizer, "Name a colour.", vicuna))
    assert text.startswith("A chat between a curious user and an artificial intelligence assistant.")
    assert text.rstrip().endswith("USER: Name a colour. ASSISTANT:")
    two_turns = bench.conversation_ids(tokenizer, ["Name a colour.", "Another."], ["Blue."],
                                       bench.fastchat_template(vicuna))
    assert two_turns == models.chat_prompt_ids(tokenizer, [
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another."}], vicuna)
    llama2 = tokenizer.decode(models.chat_prompt_ids(tokenizer, "Name a colour.", "meta-llama/Llama-2-7b-chat-hf"))
    assert "<<SYS>>" in llama2 and prompts.LLAMA2_SYSTEM.split("\n")[0] in llama2
    assert llama2.index("<</SYS>>") < llama2.index("Name a colour.") < llama2.index("[/INST]")


def test_a_local_folder_is_matched_by_its_own_name_only(tmp_path, tokenizer):
    deep = tmp_path / "vicuna-runs" / "model"  # a folder above that fastchat would take for vicuna
    deep.mkdir(parents=True)
    assert prompts.fastchat_template(str(deep)) is None
    named = tmp_path / "vicuna-7b-v1.3"
    named.mkdir()
    assert prompts.fastchat_template(str(named)).name.startswith("vicuna")


def test_bare_text_only_without_any_template_and_with_a_one_line_warning(tokenizer, capsys):
    bare = AutoTokenizer.from_pretrained(models.cache_dir() / "smollm2-135m-instruct")
    bare.chat_template = None
    bare.name_or_path = "someone/base-model"
    ids = models.chat_prompt_ids(bare, [{"role": "user", "content": "One."}, {"role": "assistant", "content": "Two."},
                                        {"role": "user", "content": "Three."}])
    assert bare.decode(ids) == "One.\n\nTwo.\n\nThree."
    models.chat_prompt_ids(bare, "Again.")
    warning = capsys.readouterr().err
    assert warning.startswith("warning: neither fastchat nor the tokenizer has a conversation template for "
                              "someone/base-model") and warning.count("\n") == 1  # once, in one line
