"""lab/tau_ceiling.py: its replay of the decoder's T = 0 tree walks must be the decoder's own."""

import json

import pytest
import torch

from eagle_mdsd import engine, head, tree
from evaluation_scripts import load
from tiny import tiny_target

tau_ceiling = load("tau_ceiling")


def test_a_walk_follows_the_ranks_while_the_node_has_that_child():
    topology = tree.compile_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    big = tau_ceiling.UNRANKED
    # rank[d - 1, i]: depth d of the cycle whose root is at s reads position s + d - 2
    rank = torch.tensor([[9, 0, 1, 0, 0, 2, 0, 0, 0],
                         [9, 9, 1, 0, 1, 0, 0, 0, 0],
                         [9, 9, 9, 0, 0, 0, big, 0, 0]])
    # answer ids[2:10]; cycle at s = 2: depth 1 rank[0, 1] = 0 -> [0], depth 2 rank[1, 2] = 1 -> [0, 1],
    # which has no children: 3 tokens.  s = 5: rank[0, 4] = 0, rank[1, 5] = 0, rank[2, 6] = UNRANKED: 3 tokens.
    # s = 8: the answer's last token is at 9, room for depth 1 only: rank[0, 7] = 0: 2 tokens.
    assert tau_ceiling.walk(topology, rank, 2, 10, own_features=True) == [3, 3, 2]
    # the target's features: every depth reads rank[0]; s = 2: rank[0, 1] = 0, rank[0, 2] = 1 -> [0, 1]: 3 tokens;
    # s = 5: rank[0, 4] = 0, rank[0, 5] = 2 (no third child): 2 tokens; s = 7: rank[0, 6] = 0, rank[0, 7] = 0,
    # and depth 3 would pass the end: 3 tokens
    assert tau_ceiling.walk(topology, rank, 2, 10, own_features=False) == [3, 2, 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_own_features_replay_gives_the_decoders_accept_lengths(seed):
    target = tiny_target(vocab=4, seed=seed, sharpness=2.0)
    draft_head = head.random_head(target, seed=seed)
    # weights of std 0.06 instead of 0.02: the head's ranking moves with its inputs, while its q stays above
    # float32's underflow (the decoder fills children of q = 0 in its own order; the replay ranks by logits)
    with torch.no_grad():
        for weight in draft_head.parameters():
            weight.mul_(3.0)
    topology = tree.compile_tree([[0], [1], [2], [0, 0], [0, 1], [0, 2], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 2],
                                  [0, 0, 0, 0], [0, 0, 0, 1]])
    decoder = engine.Decoder(target, draft_head, topology)
    prompt = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
    result = decoder.generate(prompt, 40, 0.0)
    ids = torch.tensor(prompt + result.token_ids)
    rank = tau_ceiling.ranks(draft_head, target, ids, torch.arange(4), topology.max_depth)
    lengths = tau_ceiling.walk(topology, rank, len(prompt), len(ids), own_features=True)
    assert len(lengths) == result.cycles
    assert lengths[:-1] == result.accept_lengths[:-1]
    assert max(result.accept_lengths) > 2  # the walks went past depth 1, so the own predictions were read
    ceiling = tau_ceiling.walk(topology, rank, len(prompt), len(ids), own_features=False)
    # every answer token after the prefill's is in exactly one cycle of either replay (a last cycle that
    # accepts the answer's last token also counts the bonus token past it, as the decoder's does)
    for replay in (lengths, ceiling):
        assert sum(replay) - (len(result.token_ids) - 1) in (0, 1)


def test_replaying_on_answers_that_do_not_exist_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "decoded.jsonl"
    monkeypatch.setattr("sys.argv", ["tau_ceiling.py", "--answers-of", str(missing)])
    with pytest.raises(SystemExit):
        tau_ceiling.main()
    assert f"--answers-of {missing} does not exist: run this script once without it" in capsys.readouterr().err


@pytest.mark.parametrize("arguments, message", [
    (["--tree", "no_such_tree"], "unknown tree 'no_such_tree'"),
    (["--answers-of", "{answers}"], "is not a file of decoded answers from this script"),
    (["--questions", "0"], "--questions is 0: pass 1 to 80")])
def test_bad_input_is_a_one_line_error_before_any_model_loads(tmp_path, monkeypatch, capsys, arguments, message):
    answers = tmp_path / "answers.jsonl"  # a benchmark answer file, not this script's decoded answers
    answers.write_text(json.dumps({"question_id": 81, "choices": [{"turns": ["text"]}]}) + "\n")
    monkeypatch.setattr("sys.argv", ["tau_ceiling.py", *(a.format(answers=answers) for a in arguments)])
    monkeypatch.setattr(tau_ceiling.models, "load_target", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit):
        tau_ceiling.main()
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
