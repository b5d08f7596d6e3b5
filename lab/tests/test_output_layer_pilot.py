"""lab/output_layer_pilot.py: its top-1 is the draft-row argmax against the target's token, and training the
output layer lowers its loss on the positions it trains on."""

from __future__ import annotations

import torch

from eagle_mdsd import head, training

import evaluation_scripts
from tiny import tiny_target

pilot = evaluation_scripts.load("output_layer_pilot")


def test_top1_takes_the_argmax_over_the_draft_rows_only():
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # three draft rows
    rows = torch.tensor([5, 2, 9])
    predicted = torch.tensor([[3.0, 0.0], [0.0, 3.0], [1.0, 1.0], [-1.0, -2.0]])
    # logits over the rows: [3, 0, 3] -> row 0 (token 5); [0, 3, 3] -> row 1 (2); [1, 1, 2] -> row 2 (9);
    # [-1, -2, -3] -> row 0 (5)
    assert pilot.top1(weight, rows, predicted, torch.tensor([5, 2, 9, 5])) == 1.0
    assert pilot.top1(weight, rows, predicted, torch.tensor([5, 2, 9, 9])) == 0.75
    assert pilot.top1(weight, rows, predicted, torch.tensor([0, 1, 2, 0])) == 0.0  # row indices are not tokens


def test_predictions_are_the_unrolled_passes_at_answer_positions_and_training_lowers_the_loss():
    target = tiny_target(vocab=32, hidden=32).float()
    draft = head.random_head(target, seed=1).float()
    generator = torch.Generator().manual_seed(0)
    samples = []
    for length in (12, 9, 15):
        ids = torch.randint(32, (length,), generator=generator)
        with torch.no_grad():
            features = target.get_decoder()(ids[None]).last_hidden_state[0]
        samples.append({"ids": ids.int(), "start": 4, "features": features})
    found = pilot.predictions(draft, target, samples)
    answer_positions = sum(len(s["ids"]) - s["start"] for s in samples)  # inputs from start - 1 to the last but one
    assert len(found["depth1"]) == len(found["truth"]) == answer_positions
    assert int(found["has_depth2"].sum()) == answer_positions  # start >= 2: no answer position is a first input
    features, tokens, targets, mask = training._collate(samples[:1], 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = training.unrolled_predictions(draft, features, target.get_input_embeddings()(tokens), 2)[0][mask]
    assert torch.equal(found["depth1"][: int(mask.sum())], expected.bfloat16())
    weight = target.get_output_embeddings().weight.detach()
    rows = torch.arange(0, 32, 2)
    start = weight[rows].clone()

    def loss(layer):
        p = torch.softmax(found["truth"].float() @ start.T, -1)
        return float(training.TOKEN_LOSSES["ce"](p, torch.log_softmax(found["depth1"].float() @ layer.T, -1)).mean())

    trained = [layer for _, layer, _ in pilot.train_layer(start, found["depth1"], found["truth"], "ce", 5e-2, 30)]
    assert len(trained) == 30
    assert loss(trained[-1]) < loss(trained[0]) < loss(start)
    assert loss(trained[-1]) < loss(start) - 0.2
