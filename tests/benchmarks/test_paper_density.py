"""benchmarks/paper/density.py at a tiny size on generated images: what it writes."""

import importlib.util
import json

import numpy as np
import pytest

from benchmarks.paper import density


def test_the_run_reports_both_test_figures_and_writes_a_row(tmp_path):
    results, figure = tmp_path / "runs.json", tmp_path / "density.png"
    argv = ["--synthetic", "--train", "60", "--valid", "20", "--test", "20",
            "--results", str(results), "--machine", "test"]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--figure", str(figure)]
    figures = density.main(argv)
    rows = json.loads(results.read_text())
    assert [r["figures"] for r in rows] == [figures] and rows[0]["machine"] == "test"
    assert rows[0]["command"] == ("python benchmarks/paper/density.py --synthetic --train 60"
                                  " --valid 20 --test 20")
    assert (figures["train"], figures["valid"], figures["test"]) == (60, 20, 20)
    # Generated digits are learnable: the test images cost well under a coin per pixel.
    assert 0 < figures["test_nats_online"] < 784 * np.log(2) / 2
    assert 0 < figures["test_nats_frozen"] < 784 * np.log(2) / 2
    assert figures["test_nats_frozen"] != figures["test_nats_online"]
    assert figures["images_per_second"] > 0
    assert figures["curve"][-1][0] == 100 and figures["curve"][0][1] > figures["curve"][-1][1]
    if importlib.util.find_spec("matplotlib") is not None:
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_npz_is_read_from_the_data_directory_and_unpacked(tmp_path):
    rng = np.random.default_rng(0)
    pixels = {split: (rng.random((n, 784)) < 0.2).astype(np.uint8)
              for split, n in (("train", 5), ("valid", 3), ("test", 2))}
    folder = tmp_path / "binarized_mnist"
    folder.mkdir()
    np.savez(folder / "binarized_mnist.npz",
             **{split: np.packbits(p, axis=1) for split, p in pixels.items()})
    loaded = density.binarized_mnist(str(tmp_path), synthetic=False)
    assert all(np.array_equal(loaded[split], pixels[split]) for split in pixels)
    with pytest.raises(SystemExit, match="not found"):
        density.binarized_mnist(str(tmp_path / "elsewhere"), synthetic=False)


def test_the_network_can_be_sized_and_the_row_says_so(tmp_path):
    figures = density.main(["--synthetic", "--train", "20", "--valid", "5", "--test", "5",
                            "--layer-sizes", "8,4,1"])
    assert figures["layer_sizes"] == [8, 4, 1]
    assert 0 < figures["test_nats_online"] < 784 * np.log(2)
