"""Which questions a run answers: a spread over the categories, and the untimed warm-up question outside it."""

from __future__ import annotations

# Answered in full before the timed questions where the benchmark leaves no question of its set out.
SPARE_QUESTION = {"question_id": -1, "category": "warm-up", "turns": [
    "Write a long, detailed travel story about a week spent walking along a coast, day by day.",
    "Now rewrite the story as a letter to a friend, keeping every day in it."]}


def spread(chosen: list[dict], count: int | None) -> list[dict]:
    """`count` questions taken round-robin over the categories (all when count is None), by id."""
    if count is None or count >= len(chosen):
        return chosen
    by_category: dict[str, list[dict]] = {}
    for question in chosen:
        by_category.setdefault(question["category"], []).append(question)
    picked, rank = [], 0
    while len(picked) < count:
        picked += [group[rank] for group in by_category.values() if rank < len(group)][: count - len(picked)]
        rank += 1
    return sorted(picked, key=lambda q: q["question_id"])


def warmup_question(all_questions: list[dict], chosen: list[dict]) -> dict:
    """The question every method answers in full before the timed ones: the first of the set left out of
    `chosen`, so that no timed answer is one a method has already given."""
    taken = {q["question_id"] for q in chosen}
    return next((q for q in all_questions if q["question_id"] not in taken), SPARE_QUESTION)
