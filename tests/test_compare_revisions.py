"""scripts/compare_revisions.py: the per-question ratio and its interval."""

import math

import pytest

import evaluation_scripts


@pytest.fixture(scope="module")
def script():
    return evaluation_scripts.load("compare_revisions")


def test_the_per_question_ratio_is_a_geometric_mean_with_a_t_interval(script):
    assert script.paired_ratio([2.2, 4.4, 1.1], [2.0, 4.0, 1.0]) == pytest.approx((1.1, 1.1, 1.1))
    # log ratios log 2 and log 0.5: mean 0, standard deviation sqrt(2) log 2, two samples (t = 12.706)
    ratio, low, high = script.paired_ratio([2.0, 1.0], [1.0, 2.0])
    half = 12.7062047 * math.sqrt(2) * math.log(2) / math.sqrt(2)
    assert (ratio, low, high) == pytest.approx((1.0, math.exp(-half), math.exp(half)))
    assert script.paired_ratio([3.0], [2.0]) == pytest.approx((1.5, 1.5, 1.5))  # one question: no interval
