"""The head's training loss: EAGLE's recipe (SmoothL1 on the next feature + 0.1 x a token term), with the
training-time test of HASS / EAGLE-3 (the head's own predictions fed back, `unroll` passes)."""

from __future__ import annotations

import torch

from .. import eagle3


def _unrolled_mask(length: int, step: int) -> torch.Tensor:
    """Which cached head entries the step-s pass at position i sees, as the decoder would (s = 1, 2, ...).

    At draft depth s - 1 (pass s) the query at position i sees the true pairs up to position i - s + 1 and
    the path's entries of passes 2..s at positions i - s + 2 .. i (itself last); the keys are the s passes
    laid side by side.
    """
    index = torch.arange(length)
    blocks = [index[None, :] <= index[:, None] - (step - 1)]
    blocks += [index[None, :] == index[:, None] - (step - r) for r in range(2, step + 1)]
    return torch.cat(blocks, 1)


def unrolled_predictions(draft_head, features, embedded, unroll: int = 1) -> list[torch.Tensor]:
    """The head's predicted features [B, T, H] of passes 1..unroll over (f_i, x_{i+1}) pairs.

    Pass 1 reads the true features; pass r reads pass r - 1's predictions shifted by one position (the
    input at position i is its prediction of f_i, or for an EAGLE-3 head its output there) and attends,
    through the cached keys of the earlier passes, to what the decoder's head sees at draft depth r: the
    true pairs and one entry per earlier depth on the path.  Position 0 of pass r > 1 has no such input
    and must not be scored.
    """
    from transformers import DynamicCache

    from ..tree import additive_mask

    batch, length, _ = features.shape
    positions = torch.arange(1, length + 1, device=features.device)[None].expand(batch, -1)
    cache = DynamicCache() if unroll > 1 else None
    passes, inputs = [], features
    for step in range(1, unroll + 1):
        visible = _unrolled_mask(length, step).to(features.device)
        attention = additive_mask(visible, torch.float32)[None, None].to(features.dtype).expand(batch, -1, -1, -1)
        passes.append(draft_head(inputs, embedded, positions, attention, cache))
        if step < unroll:  # (position 0, never scored, reads the true feature, or zeros at another width)
            first = features[:, :1] if features.shape[-1] == passes[-1].shape[-1] else \
                torch.zeros_like(passes[-1][:, :1])
            inputs = torch.cat([first, passes[-1][:, :-1]], 1)
    return passes


TOKEN_LOSSES = {  # token term per position, from the target's p and the head's log q
    "ce": lambda p, logq: -(p * logq).sum(-1),
    "tv": lambda p, logq: 0.5 * (p - logq.exp()).abs().sum(-1),
    "top1": lambda p, logq: -logq.gather(-1, p.argmax(-1, keepdim=True))[..., 0],
}


def head_loss(draft_head, embed, lm_head, features, tokens, targets, mask, noise: float = 0.1, unroll: int = 1,
              token_weight: float = 0.1, token_loss: str = "ce"):
    """(loss, top-1 accuracy of pass 1): SmoothL1 on features + token_weight x a token term comparing the head's
    distribution q with the target's p (EAGLE's recipe: cross-entropy, 0.1), with U(-noise, noise) added to the
    input features.

    token_loss "ce" is EAGLE's cross-entropy; "tv" is the total variation distance 1/2 sum |p - q|, which is
    1 - the acceptance rate sum min(p, q) of one sampled draft (DistillSpec, Zhou et al. 2024); "top1" is the
    cross-entropy against the target's most probable token alone, the token a draft must match at T = 0.
    unroll = 1 is EAGLE-1's recipe.  unroll = s > 1 also trains the head on its own predictions, as it is
    used at draft depths 2..s (HASS, Zhang et al. 2025; EAGLE-3's training-time test); pass r's loss is
    weighted 0.8^(r-1).

    An EAGLE-3 head (eagle3.Eagle3Head) is scored by the token term alone (weight 1), its own logits over its
    draft vocabulary against the target's p there (`lm_head` gives the target's logits over those tokens in
    draft-id order); features are [final | three layers] (4H), targets' final part gives p; no input noise.
    """
    if token_loss not in TOKEN_LOSSES:
        raise ValueError(f"unknown token loss {token_loss!r}: use ce, tv or top1")
    eagle3_head = isinstance(draft_head, eagle3.Eagle3Head)
    if eagle3_head:
        noise, targets = 0.0, targets[..., : draft_head.target_hidden]  # p comes from the final features
    if noise:
        features = features + (torch.rand_like(features) * 2 - 1) * noise
    passes = unrolled_predictions(draft_head, features, embed(tokens).to(features.dtype), unroll)
    with torch.no_grad():
        target_probs = torch.softmax(lm_head(targets[mask]).float(), -1)
    head_logits = draft_head.logits if eagle3_head else lm_head
    total, accuracy = 0.0, 0.0
    for step, predicted in enumerate(passes, start=1):
        kept = mask & (torch.arange(mask.shape[1], device=mask.device) >= step - 1)
        head_logp = torch.log_softmax(head_logits(predicted[kept]).float(), -1)
        p = target_probs[kept[mask]]
        term = TOKEN_LOSSES[token_loss](p, head_logp).mean()
        if not eagle3_head:  # EAGLE-1: the feature term, and the token term weighed against it
            term = torch.nn.functional.smooth_l1_loss(predicted[kept].float(), targets[kept].float()) \
                + token_weight * term
        total = total + 0.8 ** (step - 1) * term
        if step == 1:
            accuracy = float((head_logp.argmax(-1) == p.argmax(-1)).float().mean())
    return total, accuracy


def draft_vocab_lm_head(lm_head, rows: torch.Tensor):
    """The target's output layer over `rows` only: logits over the draft vocabulary the decoder drafts from.

    With it the cross-entropy term compares the head with the target's distribution renormalised over those
    tokens (the decoder's q is 0 outside them anyway), and skips most of the full-vocabulary logits, which are
    most of a training step's work on a small target."""
    weight = lm_head.weight[rows].detach()
    bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[rows].detach()
    return lambda hidden: torch.nn.functional.linear(hidden, weight, bias)
