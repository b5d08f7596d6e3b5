"""The train stage: a head trained on the data shards by EAGLE's recipe (`loss.head_loss`), AdamW (0.9, 0.95),
gradient clipping 0.5, a warm-up and cosine learning-rate schedule.  Checkpoints every `save_every` steps and at
the end of a time budget; a rerun with the same recipe continues from the last one."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import eagle3, models
from .. import head as head_module
from ..errors import MissingFile, UsageError, deferred_interrupts
from ..checkpoint import load_saved
from .batching import CHECKPOINT_FIX, FeatureTargets, _batches, _training_batch, data_shards, rank_tokens
from .loss import TOKEN_LOSSES, draft_vocab_lm_head, head_loss

FORMATS = ("eagle1", "eagle3")
WARMUP_STEPS = 50
# Each pass keeps its activations and its attention over all earlier passes for the backward pass, so memory grows
# with the square of --unroll; past 16 passes a pass weighs under 4% of the first (0.8^(r-1)), and a pass beyond
# an answer's length has no position left to score (its mean loss is nan).
MAX_UNROLL = 16


@dataclasses.dataclass(frozen=True)
class TrainRecipe:
    """How `train` trains a head.  unroll > 1 adds the multi-step loss of `head_loss`; init_from starts from
    another run's checkpoint or an exported head instead of a random one; token_loss is the token term ("ce":
    EAGLE's cross-entropy; "tv": total variation, 1 - the acceptance rate of one sampled draft; "top1":
    cross-entropy against the target's most probable token) and token_weight weighs it against the feature term
    (EAGLE's 0.1); draft_vocab = N scores it over the N most frequent answer tokens of the data only (the ranking
    `export` ships; None: the full vocabulary); data_from: other runs whose shards are trained on too.
    format "eagle3" trains an EAGLE-3 head (eagle3.py) by `head_loss`: unroll passes of the token term alone
    (token_weight does not apply), over the draft_vocab most frequent answer tokens, which become its vocabulary."""

    epochs: float = 1.0
    lr: float = 5e-4
    tokens_per_batch: int = 4096
    seed: int = 0
    data_from: tuple = ()
    unroll: int = 1
    init_from: str | None = None
    token_weight: float = 0.1
    draft_vocab: int | None = None
    token_loss: str = "ce"
    bf16: bool = True
    format: str = "eagle1"

    # The options a resumed run must share with its checkpoint (`saved`), with the value a checkpoint that does
    # not record one was trained with (UNRECORDED: unknown, so not checked; a resumed epoch's batches are counted
    # in batches of tokens_per_batch, so another size would skip or repeat samples).
    UNRECORDED = "unrecorded"
    CHECKPOINT_DEFAULTS = {"seed": 0, "data_from": [], "unroll": 1, "init_from": None, "token_weight": 0.1,
                           "draft_vocab": "full", "token_loss": "ce", "format": "eagle1",
                           "tokens_per_batch": UNRECORDED}

    def __post_init__(self):
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise UsageError(f"--draft-vocab is {self.draft_vocab}: pass a token count of 1 or more, or 'full'")
        if not 1 <= self.unroll <= MAX_UNROLL:
            raise UsageError(f"--unroll is {self.unroll}: pass 1 (EAGLE-1's loss) up to {MAX_UNROLL} (draft depths "
                             f"trained)")
        if not (math.isfinite(self.token_weight) and self.token_weight >= 0):  # nan or inf: a nan loss, a nan head
            raise UsageError(f"--token-weight is {self.token_weight}: pass a finite number of 0 or more (EAGLE's "
                             f"recipe: 0.1)")
        if self.token_loss not in TOKEN_LOSSES:
            raise UsageError(f"--token-loss is {self.token_loss!r}: pass ce (EAGLE's cross-entropy), tv or top1")
        if self.format not in FORMATS:
            raise UsageError(f"--format is {self.format!r}: pass eagle1 or eagle3")
        if self.format == "eagle3" and self.token_weight != 0.1:
            raise UsageError(f"--token-weight {self.token_weight} weighs EAGLE-1's feature term, which an EAGLE-3 "
                             f"head does not have: leave it out with --format eagle3")
        object.__setattr__(self, "data_from", tuple(str(Path(run)) for run in self.data_from))
        object.__setattr__(self, "init_from", str(Path(self.init_from)) if self.init_from else None)

    def saved(self) -> dict:
        """The options a checkpoint records, as it records them."""
        return {"seed": self.seed, "data_from": list(self.data_from), "unroll": self.unroll,
                "init_from": self.init_from, "token_weight": self.token_weight,
                "draft_vocab": "full" if self.draft_vocab is None else self.draft_vocab,
                "token_loss": self.token_loss, "format": self.format, "tokens_per_batch": self.tokens_per_batch}


def schedule_position(step: int, total_steps: int, scheduled_s: float = 0.0,
                      schedule_minutes: float | None = None) -> float:
    """How far along its learning-rate schedule a run is (1 or more: at its end): the share of its steps done,
    or with `schedule_minutes` the share of those minutes spent (`scheduled_s`) where that is further."""
    along = step / total_steps
    if schedule_minutes:
        along = max(along, scheduled_s / (60 * schedule_minutes))
    return along


def learning_rate(peak: float, step: int, along: float) -> float:
    """The rate of step `step` (counted from 0) at `along` of the schedule: a linear warm-up over WARMUP_STEPS
    steps times a cosine decay from `peak` to 0 at along = 1."""
    return peak * min(1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * min(along, 1.0)))


def _option_text(value) -> str:
    """How a training option stored in a checkpoint reads on the command line."""
    if isinstance(value, list):
        return " ".join(value) or "(none)"
    return "(none)" if value is None else str(value)


def check_resumable(checkpoint: Path, saved_state: dict, recipe: TrainRecipe) -> None:
    """Refuse to resume `checkpoint` (its saved `state`) with a recipe whose recorded options differ from those it
    was trained with: the rerun would continue another run's head and schedule."""
    for name, value in recipe.saved().items():
        trained_with = saved_state.get(name, TrainRecipe.CHECKPOINT_DEFAULTS[name])
        if trained_with != value and trained_with != TrainRecipe.UNRECORDED:
            option = "--" + name.replace("_", "-")
            raise UsageError(f"{checkpoint} was trained with {option} {_option_text(trained_with)}, not "
                             f"{_option_text(value)}: pass the same to resume it, or use another --run")


def _init_source(source: Path) -> str:
    """What --init-from names: 'run' (a training run's checkpoint.pt) or 'head' (a head folder's config.json)."""
    if (source / "checkpoint.pt").exists():
        return "run"
    if (source / "config.json").exists():
        return "head"
    raise MissingFile(f"--init-from {source}: neither a run with checkpoint.pt nor a head folder with config.json")


def _trained_weights(source: Path, target) -> dict:
    """A head's weights from a training run (its checkpoint) or an exported head folder."""
    if _init_source(source) == "run":
        return load_saved(source / "checkpoint.pt", "--init-from checkpoint", "give another --init-from",
                          weights_only=False)["head"]
    return {k: v.float() if v.is_floating_point() else v
            for k, v in head_module.load_head(str(source), target).state_dict().items()}


def new_eagle3_head(target, rows: torch.Tensor, seed: int = 0) -> eagle3.Eagle3Head:
    """A float32 EAGLE-3 head to train for `target`, drafting over the target tokens `rows` (sorted): random
    layers (eagle3.random_head's), d2t/t2d for those tokens, and lm_head started from the target's output rows
    for them (its input is normed, as the target's final features are)."""
    draft_head = eagle3.random_head(target, len(rows), seed).float()
    rows = rows.to(draft_head.d2t.device)
    draft_head.d2t.copy_(rows - torch.arange(len(rows), device=rows.device))
    draft_head.t2d.zero_()
    draft_head.t2d[rows] = True
    with torch.no_grad():
        draft_head.lm_head.weight.copy_(target.get_output_embeddings().weight[rows].float())
    return draft_head.float()


def _start_head(target, rows: torch.Tensor, recipe: TrainRecipe):
    """(float32 head in training mode, the target layers it reads or None): random, or `recipe.init_from`'s."""
    layers = None
    if recipe.format == "eagle3":
        draft_head = new_eagle3_head(target, rows, recipe.seed).train()
        layers = draft_head.feature_layers
    else:
        draft_head = head_module.random_head(target, recipe.seed).float().train()
    if recipe.init_from:
        weights = _trained_weights(Path(recipe.init_from), target)
        d2t = weights.get("d2t")
        if layers is not None and (d2t is None or not torch.equal(torch.arange(len(d2t)) + d2t.cpu(), rows.cpu())):
            raise UsageError(f"--init-from {recipe.init_from} is no EAGLE-3 head that drafts over the --draft-vocab "
                             f"{recipe.draft_vocab or 'full'} of this data: pass the --draft-vocab and data it "
                             f"was trained with")
        draft_head.load_state_dict(weights)
    return draft_head, layers


def _epochs(shards: list[Path], recipe: TrainRecipe, state: dict):
    """(index in its epoch, batch) from where `state` stopped, epoch after epoch; state's epoch counts on as each
    one ends."""
    while True:
        batches = _batches(shards, recipe.tokens_per_batch, random.Random(recipe.seed + state["epoch"]))
        for index, batch in enumerate(batches):
            if index >= state["batch_in_epoch"]:
                yield index, batch
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def check_before_data(recipe: TrainRecipe, base_model=None) -> None:
    """What `train` would refuse of `recipe` without reading the run's data, checked before a data stage that
    runs first (`train-head all`; hours at its defaults): the runs it also trains on, the head it starts from,
    and what the target's config allows."""
    for run in recipe.data_from:
        data_shards(Path(run))
    if recipe.init_from:
        _init_source(Path(recipe.init_from))
    config = models.target_config(base_model)
    if config is not None:
        check_target_fit(recipe, config)


def check_target_fit(recipe: TrainRecipe, config) -> None:
    """One-line error unless the target of `config` takes the recipe's draft vocabulary and, for EAGLE-3, has
    the layers the head reads."""
    vocab, layers = config.vocab_size, config.num_hidden_layers
    if recipe.draft_vocab is not None and recipe.draft_vocab > vocab:
        raise UsageError(f"--draft-vocab {recipe.draft_vocab} is more than the target's vocabulary of {vocab} tokens: "
                         f"pass at most {vocab}, or 'full'")
    read = eagle3.feature_layers(layers)
    if recipe.format == "eagle3" and not (min(read) >= 1 and max(read) <= layers):
        raise UsageError(f"--format eagle3 reads the target's layers {read}; the base model has {layers}: EAGLE-3 "
                         f"needs a target of 4 layers or more")


def train(out_dir: Path, recipe: TrainRecipe = TrainRecipe(), base_model=None, device: str = "cpu",
          max_minutes: float | None = None, save_every: int = 100, schedule_minutes: float | None = None) -> dict:
    """Train (or resume) the run's head by `recipe`; checkpoints every `save_every` steps and when `max_minutes`
    have passed, so a rerun continues where this one stopped.  The learning rate follows `learning_rate` over the
    epochs; with `schedule_minutes`, over whichever ends first, the epochs or that many minutes of the run's calls
    (a run boxed in time still ends at a learning rate of 0, and stops there)."""
    out_dir = Path(out_dir)
    shards = data_shards(out_dir, recipe.data_from)
    out_dir.mkdir(parents=True, exist_ok=True)
    target, _ = models.load_target(base_model, torch.float32, device)
    target.requires_grad_(False)
    check_target_fit(recipe, target.config)
    rows, lm_head = _draft_rows(target, shards, recipe, device)
    draft_head, layers = _start_head(target, rows, recipe)
    checkpoint = out_dir / "checkpoint.pt"
    optimizer, state = _optimizer_and_state(checkpoint, recipe, draft_head, rows, layers)
    total_steps = _total_steps(shards, recipe, out_dir)
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    progress = tqdm(total=total_steps, initial=state["step"], desc="train head")
    started, tokens_seen, scheduled = time.monotonic(), 0, state.get("scheduled_s", 0.0)
    feature_target = FeatureTargets(target, base_model, device)
    try:
        for index, batch in _epochs(shards, recipe, state):
            if schedule_minutes:  # the minutes of the run's earlier calls count: a rerun continues the decay
                state["scheduled_s"] = scheduled + time.monotonic() - started
            along = schedule_position(state["step"], total_steps, state.get("scheduled_s", 0.0), schedule_minutes)
            if along >= 1 or (deadline and time.monotonic() > deadline):
                break
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(recipe.lr, state["step"], along)
            tokens_seen += sum(len(sample["ids"]) for sample in batch)
            training_batch = _training_batch(batch, feature_target, target.config.hidden_size, device, layers)
            with deferred_interrupts():  # a step and its count are saved together (the resumed head is the same)
                loss, accuracy = _step(draft_head, optimizer, (target.get_input_embeddings(), lm_head),
                                       training_batch, recipe, device)
                state["step"] += 1
                state["batch_in_epoch"] = index + 1
                state["log"].append({"step": state["step"], "loss": loss, "top1": accuracy})
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4f}", top1=f"{accuracy:.3f}")
            if state["step"] % save_every == 0:
                _save(checkpoint, draft_head, optimizer, state)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM between steps: the steps done are kept, and a rerun continues
        _save(checkpoint, draft_head, optimizer, state)
        raise
    progress.close()
    _report_rate(state, time.monotonic() - started, tokens_seen, recipe, device)
    _save(checkpoint, draft_head, optimizer, state)
    return state


def _optimizer_and_state(checkpoint: Path, recipe: TrainRecipe, draft_head, rows, layers) -> tuple:
    """(AdamW over the head, the run's state): fresh, or where the run's checkpoint left them."""
    optimizer = torch.optim.AdamW(draft_head.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if checkpoint.exists():
        return optimizer, _resume(checkpoint, recipe, draft_head, optimizer, rows, layers)
    return optimizer, {"step": 0, "epoch": 0, "batch_in_epoch": 0, **recipe.saved(), "log": []}


def _draft_rows(target, shards: list[Path], recipe: TrainRecipe, device: str):
    """(the vocabulary rows the head drafts over, the output layer over them): every row, or with
    recipe.draft_vocab the most frequent answer tokens of the data's shards."""
    lm_head, vocab = target.get_output_embeddings(), target.config.vocab_size
    rows = torch.arange(vocab, device=device)
    if recipe.draft_vocab is not None and recipe.draft_vocab < vocab:
        rows = torch.tensor(sorted(rank_tokens(shards, target.config.vocab_size)[: recipe.draft_vocab]),
                            device=device)
        lm_head = draft_vocab_lm_head(lm_head, rows)
    return rows, lm_head


def _resume(checkpoint: Path, recipe: TrainRecipe, draft_head, optimizer, rows: torch.Tensor, layers) -> dict:
    """The head, optimizer and random state of `checkpoint` restored in place; returns the run's saved state.
    A checkpoint made with another recipe, or over draft rows the shards no longer give, is a one-line error."""
    saved = load_saved(checkpoint, "checkpoint", CHECKPOINT_FIX, weights_only=False)
    check_resumable(checkpoint, saved["state"], recipe)
    draft_head.load_state_dict(saved["head"])
    if layers is not None and not torch.equal(draft_head.target_ids(), rows):
        raise UsageError(f"{checkpoint} drafts over the --draft-vocab most frequent answer tokens of its data "
                         f"then, which the data's shards no longer give: resume it on the same shards, or use "
                         f"another --run")
    optimizer.load_state_dict(saved["optimizer"])
    if "rng" in saved:  # the feature noise continues as if never interrupted
        torch.set_rng_state(saved["rng"])
    return saved["state"]


def _total_steps(shards: list[Path], recipe: TrainRecipe, out_dir: Path) -> int:
    """The steps of recipe.epochs over the shards' batches; shards without a trainable answer: a one-line error."""
    total_batches = sum(1 for _ in _batches(shards, recipe.tokens_per_batch, random.Random(recipe.seed)))
    if not total_batches:
        raise UsageError(f"no answer of 2 tokens or more in the data shards of {out_dir}: make the data with a "
                         f"larger --max-new-tokens")
    steps = total_batches * recipe.epochs
    if not math.isfinite(steps):
        raise UsageError(f"--epochs {recipe.epochs:g} of {total_batches} batches is more steps than can be counted: "
                         f"give a smaller --epochs (--max-minutes bounds a run by time)")
    return max(1, int(steps))


def _step(draft_head, optimizer, layers_of_target, training_batch, recipe: TrainRecipe,
          device: str) -> tuple[float, float]:
    """One optimizer step on one batch (features, tokens, targets, mask) through the target's (embedding,
    output layer); returns its (loss, top-1 accuracy)."""
    embed, lm_head = layers_of_target
    features, tokens, targets, mask = training_batch
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=recipe.bf16):
        loss, accuracy = head_loss(draft_head, embed, lm_head, features, tokens, targets, mask,
                                   unroll=recipe.unroll, token_weight=recipe.token_weight,
                                   token_loss=recipe.token_loss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft_head.parameters(), 0.5)
    optimizer.step()
    return loss.item(), accuracy


def _save(checkpoint: Path, draft_head, optimizer, state: dict) -> None:
    """The head, optimizer, state and random state into `checkpoint`, whole or not at all."""
    staging = checkpoint.with_suffix(".tmp")
    torch.save({"head": draft_head.state_dict(), "optimizer": optimizer.state_dict(), "state": state,
                "rng": torch.get_rng_state()}, staging)
    os.replace(staging, checkpoint)


def _report_rate(state: dict, seconds: float, tokens_seen: int, recipe: TrainRecipe, device: str) -> None:
    """Add this call's seconds to the state's wall time and print its training tokens/s."""
    state["wall_time_s"] = state.get("wall_time_s", 0.0) + seconds
    if tokens_seen:  # the rate that sizes a run on another machine or batch
        print(f"train stage: {tokens_seen} tokens in {seconds:.0f} s: {tokens_seen / seconds:.0f} training "
              f"tokens/s at {recipe.tokens_per_batch} tokens a batch on {device}")
