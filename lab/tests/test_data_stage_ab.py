"""lab/data_stage_ab.py: every arm answers every prompt, in the prompts' order, as the data stage would."""

from __future__ import annotations

import evaluation_scripts
from eagle_mdsd import training
from tiny import tiny_target

script = evaluation_scripts.load("data_stage_ab")


def test_every_arm_answers_each_prompt_as_the_data_stage_does(monkeypatch):
    target = tiny_target(vocab=16, hidden=32).float()
    target.generation_config.eos_token_id = 15
    prompts = [[3, 4, 5, 6, 7], [8], [9, 10, 11], [2, 2], [1, 5, 9, 13]]
    results = script.compare(target, prompts, batch_size=2, max_new_tokens=4, pad_id=0, rounds=2)
    assert list(results) == list(script.ARMS) and all(len(r["seconds"]) == 2 for r in results.values())
    assert script.padding(prompts, [0, 1, 2, 3, 4], 2) == (2 * 5 + 2 * 3 + 4) / 15
    alone = [training._generate(target, [prompt], 4, 0)[0] for prompt in prompts]  # one a batch: no padding
    for arm in script.ARMS:
        answers, seconds = script.answer(target, prompts, arm, 2, 4, 0)
        assert seconds > 0 and answers == alone  # float32: the batch a prompt is in does not change its answer
        assert results[arm]["identical"] == len(prompts) and results[arm]["tokens"] == sum(map(len, answers))
    batches = []  # the sorted arms batch by prompt length, the data stage's arm in the prompts' order
    real = training._generate
    monkeypatch.setattr(training, "_generate", lambda target, batch, *args: batches.append([len(p) for p in batch])
                        or real(target, batch, *args))
    for arm in ("data stage", "sorted"):
        script.answer(target, prompts, arm, 2, 4, 0)
    assert batches == [[5, 1], [3, 2], [4], [1, 2], [3, 4], [5]]
