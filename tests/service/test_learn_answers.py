"""Learn answers: scoring of prequential rows, and the bounded memory of retried requests'
original answers."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.learn_answers import AnswerCache, LearnResult, scored_rows


def _result(rows: int, sequence: int = 0) -> LearnResult:
    probs = np.full((rows, 2), 0.5)
    return LearnResult(sequence, probs, np.full(rows, np.log(2.0)), rows)


def test_scored_rows_gives_the_log_loss_of_the_true_class_and_whether_argmax_hit_it():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0]])
    losses, hits = scored_rows(probs, np.array([0, 1, 1]))
    np.testing.assert_allclose(losses, [-np.log(0.7), -np.log(0.1), 0.0])
    assert hits.tolist() == [True, False, True]


def test_a_zero_probability_for_the_true_class_keeps_the_loss_finite():
    losses, _ = scored_rows(np.array([[1.0, 0.0]]), np.array([1]))
    assert np.isfinite(losses).all() and losses[0] > 30


def test_mean_loss_equals_the_mean_of_the_rows_losses():
    result = LearnResult(0, None, np.array([0.1, 0.2, 0.6]), 3)
    assert result.mean_loss == pytest.approx(0.3)
    assert LearnResult(None, None, None, 2, duplicate=True).mean_loss is None


def test_the_cache_keeps_the_newest_answers_within_its_rows():
    cache = AnswerCache(max_rows=5)
    cache.put("a", _result(2, 0), "da")
    cache.put("b", _result(2, 2), "db")
    cache.put("c", _result(2, 4), None)  # 6 rows: the oldest answer goes
    assert cache.get("a") is None
    answer, digest = cache.get("b")
    assert (answer.sequence, digest) == (2, "db")
    assert cache.get("c")[0].sequence == 4


def test_a_key_answered_again_is_counted_once():
    cache = AnswerCache(max_rows=4)
    cache.put("a", _result(2, 0), "d1")
    cache.put("a", _result(2, 2), "d2")  # replaces; 2 rows held, not 4
    cache.put("b", _result(2, 4), "d3")
    assert cache.get("a")[1] == "d2" and cache.get("b") is not None


def test_an_answer_longer_than_the_cache_is_not_kept_and_evicts_nothing():
    cache = AnswerCache(max_rows=3)
    cache.put("small", _result(1), None)
    cache.put("big", _result(4), None)
    assert cache.get("big") is None
    assert cache.get("small") is not None
