"""The acceptance study's arithmetic against the core's exact values, on tiny synthetic inputs."""

from __future__ import annotations

import re
import types

import pytest
import torch

from eagle_mdsd import study, theory, verification


def _pair(seed: int, vocab: int):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    return p, q


@pytest.mark.parametrize("seed, n", [(0, 2), (1, 3), (2, 3)])
def test_position_rates_match_the_exact_values(seed, n):
    p, q = _pair(seed, 5)
    rates = study.position_rates(p, q, n, torch.Generator().manual_seed(seed), draws=6000)
    for scheme in study.ALPHAS:
        assert rates[f"alpha*:{scheme}"] == pytest.approx(theory.optimal_acceptance(p, q, n, scheme), abs=1e-12)
    assert rates["kseq"] == pytest.approx(float(verification.kseq_acceptance(p, q, n)), abs=1e-12)
    for name, (scheme, _) in study.VERIFIERS.items():
        if name == "kseq":
            continue
        count = 2 if name == "spechub" else n
        exact = theory.acceptance_rate(scheme, name, p, q, count)  # enumeration at V = 5
        assert exact.half_width == 0.0
        assert rates[name] == pytest.approx(float(exact), abs=0.02), name


def test_truncation_keeps_everything_at_epsilon_zero_and_little_otherwise():
    p, q = _pair(3, 7)
    kept_p, kept_q = study.truncate(p, q, 3, epsilon=0.0, min_size=7)
    assert torch.allclose(kept_p[:-1], p, atol=1e-15) and kept_p[-1] < 1e-12 and len(kept_p) == 8
    # a peaked large vocabulary: truncated alpha* within (n + 1) epsilon of the full one
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(20000, generator=gen, dtype=torch.float64) * 2
    logits[:6] += 25  # language-model-like: a few tokens carry all but ~1e-7 of the mass
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(20000, generator=gen, dtype=torch.float64), -1)
    small_p, small_q = study.truncate(p, q, 3)
    assert len(small_p) < 2000
    for scheme in ("with_replacement", "without_replacement", "greedy"):
        full = theory.optimal_acceptance(p, q, 3, scheme)
        assert theory.optimal_acceptance(small_p, small_q, 3, scheme) == pytest.approx(full, abs=4 * study.EPSILON)
    # q on one token but 4e-11, as at a low temperature, and p elsewhere too: the later draws without replacement
    # and greedy drafting's sample see q's tail, which one bucket would stand for (off by 1.5e-3 and 2e-3)
    base = torch.randn(5000, generator=gen, dtype=torch.float64) * 2
    logits_q, logits_p = base + torch.randn(5000, generator=gen, dtype=torch.float64), base.clone()
    logits_q[0] += 24
    logits_p[0] += 20
    logits_p[1:4] += 19.5
    p, q = torch.softmax(logits_p / 0.7, -1), torch.softmax(logits_q / 0.7, -1)
    small_p, small_q = study.truncate(p, q, 3)
    for scheme in ("with_replacement", "without_replacement", "greedy"):
        full = theory.optimal_acceptance(p, q, 3, scheme)
        assert theory.optimal_acceptance(small_p, small_q, 3, scheme) == pytest.approx(full, abs=4 * study.EPSILON)
    assert len(study.truncate(p, q, 12)[0]) >= 13  # n drafts without replacement exist for any n


def test_summaries_are_means_with_paired_gaps():
    rates = {"alpha*:with_replacement": torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64),
             "rrs_w": torch.tensor([0.8, 0.8, 0.6, 0.6], dtype=torch.float64)}
    summary = study.summarise(rates)
    assert summary["rrs_w"]["mean"] == pytest.approx(0.7)
    assert summary["rrs_w"]["gap"] == pytest.approx(0.05)
    gaps = torch.tensor([0.1, 0.0, 0.1, 0.0], dtype=torch.float64)
    assert summary["rrs_w"]["gap_ci95"] == pytest.approx(1.96 * float(gaps.std()) / 2)
    assert "gap" not in summary["alpha*:with_replacement"]


def test_rates_over_logit_rows_use_the_temperature():
    logits_p = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).half()
    logits_q = torch.tensor([[0.0, 2.0, 1.0, -1.0]]).half()
    hot = study.rates_for(logits_p, logits_q, 1.0, 2, draws=2)
    cold = study.rates_for(logits_p, logits_q, 0.0, 2, draws=2)
    p = torch.softmax(logits_p[0].double(), -1)
    q = torch.softmax(logits_q[0].double(), -1)
    assert float(hot["alpha*:greedy"][0]) == pytest.approx(theory.optimal_acceptance(p, q, 2, "greedy"), abs=1e-3)
    # T = 0: one-hot p on token 0, q one-hot on token 1; greedy drafting's top-1 misses, its sample is the fill
    assert float(cold["alpha*:greedy"][0]) == pytest.approx(1.0)


@pytest.mark.parametrize("option, least", [("--positions", 1), ("--n", 1), ("--draws", 1), ("--sweep-positions", 2),
                                           ("--table-positions", 2)])
def test_study_counts_below_their_least_are_refused_by_the_parser(option, least, capsys):
    from eagle_mdsd import cli

    # a count of 0 would collect nothing to score; one position a task has no interval (its JSON was NaN)
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["study", "all", option, str(least - 1)])
    assert stop.value.code == 2 and f"argument {option}: must be at least {least}, got {least - 1}" in \
        capsys.readouterr().err


def _task_file(path, positions: int, settings: dict | None) -> None:
    """A task file as `study.collect` writes it: `positions` rows of logits over 5 tokens per draft."""
    data = {key: torch.zeros(positions, 5).half() for key in ("p", *study.DRAFTS)} | {"question_ids": [81],
                                                                                         "layers": 10}
    torch.save(data | ({"settings": settings} if settings is not None else {}), path)


def test_collect_reuses_only_task_files_collected_with_the_same_settings(tmp_path, monkeypatch):
    from eagle_mdsd import models
    from eagle_mdsd import checkpoint

    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    head = checkpoint.head_checksum(models.DEFAULT_HEAD)
    made = {"positions": 4, "max_new_tokens": 128, "dtype": "bfloat16", "head": head}
    _task_file(tmp_path / "qa.pt", 4, made)
    for options, changed in (({"positions": 8}, "positions 4 -> 8"), ({"positions": 4, "max_new_tokens": 16},
                                                                      "max_new_tokens 128 -> 16"),
                             ({"positions": 4, "dtype": "float32"}, "dtype bfloat16 -> float32")):
        with pytest.raises(study.UsageError, match=re.escape(f"task file {tmp_path / 'qa.pt'} was collected with "
                                                             f"other settings ({changed}): ")):
            study.collect(tmp_path, tasks=("qa",), **options)
    assert study.collect(tmp_path, positions=4, tasks=("qa",)) == [tmp_path / "qa.pt"]  # the same: reused
    _task_file(tmp_path / "qa.pt", 4, made | {"head": "0123"})  # collected with another head
    with pytest.raises(study.UsageError, match=f"head 0123 -> {head}"):
        study.collect(tmp_path, positions=4, tasks=("qa",))
    _task_file(tmp_path / "qa.pt", 4, None)  # written before task files recorded their settings: its rows show
    assert study.collect(tmp_path, positions=4, tasks=("qa",)) == [tmp_path / "qa.pt"]  # how many positions
    with pytest.raises(study.UsageError, match="positions 4 -> 8"):
        study.collect(tmp_path, positions=8, tasks=("qa",))


def test_a_corrupt_task_file_is_one_line_naming_it_and_the_fix(tmp_path, monkeypatch, capsys):
    from eagle_mdsd import cli, models

    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    _task_file(tmp_path / "mt_bench.pt", 4, None)
    whole = (tmp_path / "mt_bench.pt").read_bytes()
    (tmp_path / "mt_bench.pt").write_bytes(whole[: len(whole) // 2])  # cut short, as by a full disk or a copy
    assert cli.main(["study", "collect", "--run", str(tmp_path), "--positions", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"task file {tmp_path / 'mt_bench.pt'} cannot be read" in err and "delete it" in err
    torch.save([1, 2], tmp_path / "mt_bench.pt")  # torch's format, but no collected positions
    with pytest.raises(study.UsageError, match="holds no collected positions: delete it"):
        study.collect(tmp_path, positions=4, tasks=("mt_bench",))
    for task in ("translation", "summarization", "qa", "math_reasoning"):
        _task_file(tmp_path / f"{task}.pt", 4, None)
    with pytest.raises(study.UsageError, match="mt_bench.pt holds no collected positions"):  # analyse reads it too
        study.analyse(tmp_path, tmp_path / "out")


def test_collecting_a_task_anew_drops_the_rates_cached_from_its_old_file(tmp_path, monkeypatch):
    from eagle_mdsd import head, models

    target = types.SimpleNamespace(config=types.SimpleNamespace(num_hidden_layers=30))
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: (target, "tokenizer"))
    monkeypatch.setattr(head, "load_head", lambda *args: "head")
    monkeypatch.setattr(study, "_task_positions", lambda *args: {"p": torch.zeros(4, 5).half()})
    cached = [tmp_path / "rates" / f"qa_{draft}_t0.7_n3_all_d8.pt" for draft in study.DRAFTS]
    kept = tmp_path / "rates" / "math_reasoning_eagle_t0.7_n3_all_d8.pt"
    for path in (*cached, kept):
        path.parent.mkdir(exist_ok=True)
        torch.save({}, path)
    study.collect(tmp_path, positions=4, tasks=("qa",))
    assert [path.exists() for path in cached] == [False, False] and kept.exists()


def test_cached_rates_that_cannot_be_read_are_computed_anew(tmp_path):
    torch.manual_seed(0)
    torch.save({key: torch.randn(3, 5) for key in ("p", *study.DRAFTS)}, tmp_path / "qa.pt")
    rates = study._cached_rates(tmp_path, "qa", "eagle", 0.7, 3, None, 1)
    cache = tmp_path / "rates" / "qa_eagle_t0.7_n3_all_d1.pt"
    whole = cache.read_bytes()
    for damage in (lambda: cache.write_bytes(whole[:300]), lambda: cache.write_text("garbage"),
                   lambda: torch.save([1, 2], cache), lambda: torch.save({"kseq": torch.zeros(2, 2)}, cache)):
        damage()
        again = study._cached_rates(tmp_path, "qa", "eagle", 0.7, 3, None, 1)
        assert again.keys() == rates.keys() and all(torch.equal(again[k], rates[k]) for k in rates)
        assert cache.read_bytes() == whole  # and written again


@pytest.mark.parametrize("shapes", [{"eagle": (3, 4)}, {"p": (0, 5), "eagle": (0, 5), "truncated": (0, 5)},
                                    {"p": (5,), "eagle": (5,), "truncated": (5,)}])
def test_a_task_file_of_mismatched_or_empty_logits_is_one_line(tmp_path, shapes):
    torch.save({key: torch.zeros(shapes.get(key, (3, 5))) for key in ("p", *study.DRAFTS)}, tmp_path / "qa.pt")
    with pytest.raises(study.UsageError, match=r"qa.pt holds logits of shapes .*: delete it and run"):
        study.read_task(tmp_path / "qa.pt")
