"""The CPU learning benchmark at a small network: both learners' rates, and the plain NumPy
peer's predictions against the library's on the same stream."""

import json

from benchmarks import learn_speed


def test_the_plain_peer_learns_the_stream_as_the_library_does(capsys):
    result = learn_speed.main(["--features", "6", "--classes", "3", "--layer-sizes", "4,1",
                               "--examples", "40", "--plain-examples", "20"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result))
    assert result["gln_examples_per_second"] > 0 and result["plain_numpy_examples_per_second"] > 0
    assert result["predicted_class_agreement"] == 1.0
    assert result["max_probability_difference"] < 1e-3
    assert "pygln_examples_per_second" not in result  # no checkout given
