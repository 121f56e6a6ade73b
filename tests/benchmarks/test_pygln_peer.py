"""The pygln peer's harness: what it counts and what it refuses (pygln itself is not installed)."""

import numpy as np
import pytest

from benchmarks import pygln_peer


class Recorder:
    """A stand-in online model: predicts the class it saw last, and records each call's rows."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.last = 0

    def predict(self, rows, target=None, return_probs=False):
        self.calls.append((len(rows), target is not None))
        if return_probs:
            return np.full((len(rows), 3), 1 / 3)
        guess = np.full(len(rows), self.last)
        if target is not None:
            self.last = int(target[-1])
        return guess


def test_learn_rate_feeds_the_stream_in_order_and_scores_each_prediction_before_its_update():
    y = np.array([0, 1, 1, 1, 2, 2, 0])
    model = Recorder()
    rate, accuracy = pygln_peer.learn_rate(model, np.zeros((7, 4)), y)
    assert model.calls == [(1, True)] * 7
    # row 0 is the first guess (0); rows 2, 3 and 5 repeat their predecessor's label
    assert accuracy == pytest.approx(4 / 7)
    assert rate > 0


def test_batched_learning_and_prediction_cut_the_stream_into_calls_of_the_given_size():
    model = Recorder()
    pygln_peer.learn_rate(model, np.zeros((25, 4)), np.zeros(25, int), batch=10)
    pygln_peer.predict_rate(model, np.zeros((25, 4)), batch=10)
    assert model.calls == [(10, True), (10, True), (5, True), (10, False), (10, False), (5, False)]


def test_a_directory_that_is_not_a_pygln_checkout_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a pygln checkout"):
        pygln_peer.build_peer(tmp_path, 784, 10)
