"""Training EAGLE-1 and EAGLE-3 heads: prompts, data, train and export stages, each resumable.

0. prompts (optional, `prompts.self_prompts`): the target writes instructions itself, for a prompt mix closer
   to what it was tuned on than the shipped instruction files.
1. data (`data.make_data`): the target answers instruction prompts through its chat template; token ids, the
   response start and the target's features (last hidden state after the final norm) go into shards.
2. train (`trainer.train`): EAGLE's recipe (`loss.head_loss`) on batches of the shards (`batching`); an
   EAGLE-3 head (`format="eagle3"`, eagle3.py) reads three target layers' hidden states and is trained on its
   own outputs at every draft depth with the token loss alone, over its draft vocabulary.
3. export (`exporting.export`): the EAGLE-1 format or a compact one; an EAGLE-3 head in the released layout.

`evaluation` scores a trained head.  Spec-Bench / MT-Bench questions are never trained on.
"""

from .batching import FeatureTargets, _batches, _collate, _training_batch, data_shards, rank_tokens
from .data import DataRecipe, _generate, _shard_batches, check_data_record, make_data, target_features
from .evaluation import (GUARD_PROMPTS, _prompt_data, depth1_scores, evaluate, guard_tau, held_out_prompts,
                         teacher_forced)
from .exporting import export
from .loss import TOKEN_LOSSES, draft_vocab_lm_head, head_loss, unrolled_predictions
from .prompts import DEFAULT_PROMPTS, _normalise, benchmark_texts, load_prompts, self_prompts, user_turn_prefix
from .trainer import (FORMATS, TrainRecipe, check_before_data, check_resumable, learning_rate, new_eagle3_head,
                      schedule_position, train)

__all__ = ["DEFAULT_PROMPTS", "FORMATS", "GUARD_PROMPTS", "TOKEN_LOSSES", "DataRecipe", "FeatureTargets",
           "TrainRecipe", "benchmark_texts", "check_before_data", "check_data_record", "check_resumable",
           "data_shards", "depth1_scores", "draft_vocab_lm_head", "evaluate", "export", "guard_tau", "head_loss",
           "held_out_prompts", "learning_rate", "load_prompts", "make_data", "new_eagle3_head", "rank_tokens",
           "schedule_position", "self_prompts", "target_features", "teacher_forced", "train",
           "unrolled_predictions", "user_turn_prefix"]
