"""A configuration that would take a large share of the machine's memory is warned about."""

import warnings

import pytest

from gln import GLN, memory

PAPER_UCI_DIGITS = {"num_features": 64, "num_classes": 10, "layer_sizes": [1000, 500, 1],
                    "context_dim": 8}  # the paper's UCI network on digits: 5.4 GiB


def test_the_machines_memory_is_read():
    assert memory.host_memory() > 2**26


def test_the_papers_uci_network_on_digits_warns_before_allocating(monkeypatch):
    monkeypatch.setattr(memory, "host_memory", lambda: 16 * 2**30)  # a 16 GiB laptop
    with pytest.warns(UserWarning, match=r"about 5\.4 GiB, more than 10% of this machine's "
                                         r"16\.0 GiB.*smaller context_dim") as caught:
        GLN.check_config(PAPER_UCI_DIGITS)
    assert caught[0].filename == __file__  # points at the caller's line


def test_a_model_at_the_share_warns_and_the_defaults_do_not(monkeypatch):
    config = {"num_features": 30}
    nbytes = GLN.estimate_nbytes(config)
    monkeypatch.setattr(memory, "host_memory", lambda: int(nbytes / memory.WARN_SHARE) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GLN(**config)
    monkeypatch.setattr(memory, "host_memory", lambda: int(nbytes / memory.WARN_SHARE) - 8)
    with pytest.warns(UserWarning, match="GLN.estimate_nbytes"):
        GLN(**config)
