"""One prompt builder for every subcommand: fastchat's template where fastchat knows the model (Llama-2-chat with
EAGLE's system prompt), else the tokenizer's chat template, else bare text with a one-line warning."""

import pytest
from transformers import AutoTokenizer

from eagle_mdsd import bench, models, prompts

from tiny import embedded_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


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


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"])
def test_llama_3_answers_after_llama_2_chat_s_system_prompt_as_eagle_s_do(tokenizer, name):
    # Llama-3's chat template (here the embedded model's stands in for it) with EAGLE's system message first
    text = tokenizer.decode(models.chat_prompt_ids(tokenizer, "Name a colour.", name))
    assert text.index(prompts.LLAMA2_SYSTEM) < text.index("Name a colour.")
    given = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    assert prompts.LLAMA2_SYSTEM not in tokenizer.decode(models.chat_prompt_ids(tokenizer, given, name))
    assert prompts.LLAMA2_SYSTEM not in tokenizer.decode(models.chat_prompt_ids(tokenizer, "Name a colour."))
    assert prompts.LLAMA2_SYSTEM not in tokenizer.decode(models.chat_prompt_ids(tokenizer, "Name a colour.",
                                                                                "someone/llama-30b-chat"))


def test_a_tokenizer_shipped_as_a_sentencepiece_model_alone_loads(tmp_path):
    """Vicuna's tokenizer is a tokenizer.model without tokenizer.json: transformers builds it through sentencepiece
    and protobuf, which the package depends on."""
    import json

    import sentencepiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"A chat between a curious user and an assistant, line {i}." for i in range(200)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "tok"), vocab_size=320,
                                             model_type="bpe", byte_fallback=True, minloglevel=2)
    folder = tmp_path / "vicuna-like"
    folder.mkdir()
    (tmp_path / "tok.model").rename(folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                                                              "eos_token": "</s>", "unk_token": "<unk>"}))
    loaded = AutoTokenizer.from_pretrained(folder)
    assert loaded.decode(loaded("A chat between", add_special_tokens=False)["input_ids"]) == "A chat between"


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


def test_an_answer_ends_at_any_eos_the_configs_or_the_tokenizer_name(tokenizer):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    target = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, eos_token_id=[1, 4]))
    target.generation_config = GenerationConfig(eos_token_id=1)  # as a snapshot naming <|end_of_text|> alone
    assert models.eos_token_ids(target) == [1, 4]
    assert models.eos_token_ids(target, tokenizer) == [1, 4, tokenizer.eos_token_id]
