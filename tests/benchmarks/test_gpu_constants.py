"""Reading the launch constants off a GPU benchmark's layer_pass lines."""

import json

import pytest

import gln.staging
from benchmarks.gpu_constants import main, recommend
from gln.kernels import cuda, uploads
from gln.kernels.replay import REPLAY_MAX_ROWS


def layer_pass(layer, kernel, learn, rows, microseconds, rows_per_warp=None):
    return {"measure": "layer_pass", "layer": layer, "kernel": kernel, "learn": learn,
            "rows": rows, "rows_per_warp": rows_per_warp, "microseconds": microseconds}


def test_resident_from_the_length_where_it_wins_for_good_summed_over_layers(monkeypatch):
    records = [{"measure": "learn", "examples_per_second": 1.0}]  # other lines are ignored
    # (rows, streaming us, resident us) per layer: resident wins at 8 on layer 1 alone, but
    # loses at 8 overall (layer 2), wins again from 32 on; 16 is a tie (resident).
    timings = {"a": [(1, 10, 30), (8, 40, 30), (16, 60, 55), (32, 100, 60), (256, 800, 300)],
               "b": [(1, 5, 20), (8, 10, 25), (16, 15, 20), (32, 30, 25), (256, 200, 90)]}
    for layer, rows in timings.items():
        for n, streaming, resident in rows:
            records += [layer_pass(layer, "streaming", True, n, streaming),
                        layer_pass(layer, "resident", True, n, resident)]
    for per_warp, us in ((8, 50), (32, 30), (128, 40)):
        records += [layer_pass("a", "streaming", False, 4096, us, per_warp),
                    layer_pass("b", "streaming", False, 4096, us, per_warp),
                    layer_pass("a", "streaming", False, 1, 1000 - us, per_warp)]
    # The shared kernel (two rows-per-block settings): slower at 1 row, faster from 256 on.
    for rows, per_block, us in ((1, 256, 2000), (1, 512, 2100), (256, 256, 10), (256, 512, 9),
                                (4096, 256, 20), (4096, 512, 25)):
        records.append(layer_pass("a", "shared", False, rows, us, per_block))
    records += [layer_pass("a", "streaming", False, 256, 50, 32)]
    for per_warp, us in ((8, 70), (32, 60), (128, 55)):  # the longest that streaming predicts
        records.append(layer_pass("a", "streaming", False, 128, us, per_warp))
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 256)
    assert recommend(records)["PREDICT_ROWS_PER_BLOCK"] == 512  # at 256 rows, the chunk
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 4096)
    chosen = recommend(records)
    assert chosen["RESIDENT_MIN_ROWS"] == 16
    assert chosen["learn_us_by_rows"][8] == {"streaming": 50, "resident": 55}
    # At 128 rows, the longest below the shared kernel's 256: not at 4,096 (32 best), which
    # the shared kernel predicts, nor at 1 (8 best).
    assert chosen["PREDICT_ROWS_PER_WARP"] == 128
    assert chosen["PREDICT_ROWS_PER_BLOCK"] == 256  # at 4096 rows, not at 256
    assert chosen["PREDICT_SHARED_MIN_ROWS"] == 256
    # Each kernel at its best setting for the length (streaming summed over both layers).
    assert chosen["predict_us_by_rows"][4096] == {"streaming": 60, "shared": 20}
    assert chosen["predict_us_by_rows"][1] == {"streaming": 950, "shared": 2000}


def test_rows_from_the_length_where_they_beat_both_others_on_uneven_contexts():
    """The row kernel against the faster of streaming and resident at each length, on uneven
    contexts only (its uniform timings, here always the fastest, are not what real data
    gives); lines without a ``contexts`` field are uniform ones (runs before it existed)."""
    records = []
    # (rows, streaming, resident, rows kernel) us on uneven contexts, one layer; rows wins at
    # 16, loses at 64 to resident alone, wins from 256 on; in natural order it is faster up to
    # 256 and slower at 4,096, the longest, which decides the order.
    for n, streaming, resident, rows in ((16, 30, 40, 20), (64, 90, 80, 85),
                                         (256, 300, 250, 200), (4096, 5000, 4000, 1500)):
        for kernel, us in (("streaming", streaming), ("resident", resident)):
            records.append({**layer_pass("a", kernel, True, n, us), "contexts": "uneven"})
        natural = rows + 1000 if n == 4096 else 1
        for order, us in (("longest_first", rows), ("natural", natural)):
            records.append({**layer_pass("a", "rows", True, n, us), "contexts": "uneven",
                            "row_order": order})
        records.append({**layer_pass("a", "rows", True, n, 1), "contexts": "uniform"})
        records += [layer_pass("a", "streaming", True, n, 2), layer_pass("a", "resident", True,
                                                                          n, 3)]
    chosen = recommend(records)
    assert chosen["ROW_ORDER"] == "longest_first"
    assert chosen["ROW_WARPS_MIN_ROWS"] == 256
    assert chosen["uneven_learn_us_by_rows"][64] == {"streaming or resident": 80, "rows": 85}
    assert chosen["uneven_learn_us_by_rows"][16]["streaming or resident"] == 30
    assert chosen["RESIDENT_MIN_ROWS"] is None  # from the uniform lines: resident never wins
    assert chosen["learn_us_by_rows"][16] == {"streaming": 2, "resident": 3}
    assert "ROW_WARPS_MIN_ROWS" in chosen["current"]


def test_nothing_to_choose_from_gives_nulls(tmp_path, capsys):
    never = [layer_pass("a", "streaming", True, n, n) for n in (1, 64)]
    never += [layer_pass("a", "resident", True, n, 2 * n) for n in (1, 64)]
    assert recommend(never)["RESIDENT_MIN_ROWS"] is None  # resident never wins
    run = tmp_path / "gpu_learn.jsonl"
    run.write_text('{"measure": "learn"}\nnot json: a warning line\n')
    main([str(run)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["RESIDENT_MIN_ROWS"] is None and printed["PREDICT_ROWS_PER_WARP"] is None
    assert printed["PREDICT_SHARED_MIN_ROWS"] is None and printed["ROW_WARPS_MIN_ROWS"] is None
    assert printed["ROW_ORDER"] is None
    assert printed["GATING_PRODUCT"] is None and printed["STAGE_AHEAD"] is None
    assert printed["GATING_GEMM_MIN_ROWS"] is None
    assert printed["PREDICT_VECTOR_ROWS"] is None and printed["PREDICT_WARPS"] is None
    assert printed["PREDICT_EXAMPLE_GROUP"] is None
    assert printed["current"]["RESIDENT_MIN_ROWS"] >= 1


def by_gating(verb: str, product: str, rate: float, same: bool = True) -> dict:
    return {"measure": f"{verb}_by_gating", "gating_product": product,
            "examples_per_second": rate, "same_outputs_as_float32": same}


def test_int8_gating_only_where_it_won_with_the_same_outputs():
    gating = [by_gating("learn", "float32", 100), by_gating("predict", "float32", 500),
              by_gating("learn", "int8", 120), by_gating("predict", "int8", 600)]
    assert recommend(gating)["GATING_PRODUCT"] == "int8"
    slower = [*gating[:3], by_gating("predict", "int8", 450)]  # learns faster, predicts slower
    assert recommend(slower)["GATING_PRODUCT"] == "float32"
    differing = [*gating[:3], by_gating("predict", "int8", 600, same=False)]
    assert recommend(differing)["GATING_PRODUCT"] == "float32"


def gating_path(rows: int, path: str, microseconds: float, same: bool = True) -> dict:
    return {"measure": "gating_path", "rows": rows, "path": path,
            "microseconds": microseconds, "same_contexts": same}


def test_the_gating_gemm_from_the_length_where_it_costs_a_call_no_more_for_good():
    # (rows, kernel us, gemm us): cuBLAS ahead at 4 (noise), behind at 8, ahead from 32 on.
    timings = [(1, 40, 90), (4, 60, 55), (8, 70, 80), (32, 120, 100), (128, 400, 110)]
    records = [line for n, kernel, gemm in timings
               for line in (gating_path(n, "kernel", kernel), gating_path(n, "gemm", gemm))]
    chosen = recommend(records)
    assert chosen["GATING_GEMM_MIN_ROWS"] == 32
    assert chosen["gating_us_by_rows"][8] == {"kernel": 70, "gemm": 80}
    early = [line for n, kernel in ((1, 40), (4, 60), (16, 90)) for line in
             (gating_path(n, "kernel", kernel), gating_path(n, "gemm", kernel - 1))]
    assert recommend(early)["GATING_GEMM_MIN_ROWS"] == REPLAY_MAX_ROWS + 1  # not replayed
    differing = [*records[:-1], gating_path(128, "gemm", 110, same=False)]
    assert recommend(differing)["GATING_GEMM_MIN_ROWS"] is None
    never = [line for n in (1, 64) for line in
             (gating_path(n, "kernel", 10), gating_path(n, "gemm", 20))]
    assert recommend(never)["GATING_GEMM_MIN_ROWS"] is None


def by_layout(dtype: str, vector: bool, warps: int | None, rate: float,
              same: bool = True, group: int | None = None) -> dict:
    return {"measure": "predict_by_shared_layout", "dtype": dtype, "vector_rows": vector,
            "warps": warps, "example_group": group, "examples_per_second": rate,
            "same_outputs_as_float32": same}


def test_the_shared_kernels_setting_whose_slower_dtype_gained_most_and_predicted_alike(
        monkeypatch):
    monkeypatch.setattr(cuda, "PREDICT_VECTOR_ROWS", False)  # the library's, as rated here
    monkeypatch.setattr(cuda, "PREDICT_WARPS", None)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", None)
    library = [by_layout("float32", False, None, 800), by_layout("uint8", False, None, 1000)]
    vector = [by_layout("float32", True, None, 900), by_layout("uint8", True, None, 1010)]
    warps = [by_layout("float32", True, 32, 1000), by_layout("uint8", True, 32, 1005)]
    chosen = recommend([*library, *vector, *warps])  # the slower gains: 1% against 0.5%
    assert (chosen["PREDICT_VECTOR_ROWS"], chosen["PREDICT_WARPS"]) == (True, None)
    differing = [*vector[:1], by_layout("uint8", True, None, 1010, same=False)]
    chosen = recommend([*library, *differing, *warps])
    assert (chosen["PREDICT_VECTOR_ROWS"], chosen["PREDICT_WARPS"]) == (True, 32)
    slower = [by_layout("float32", False, 24, 1200), by_layout("uint8", False, 24, 990)]
    chosen = recommend([*library, *slower])  # float32 faster, uint8 slower: the library's
    assert (chosen["PREDICT_VECTOR_ROWS"], chosen["PREDICT_WARPS"]) == (False, None)
    chosen = recommend([*library[:1], *vector])  # uint8 not measured with the library's
    assert (chosen["PREDICT_VECTOR_ROWS"], chosen["PREDICT_WARPS"]) == (None, None)
    grouped = [by_layout("float32", True, 32, 1100, group=4),
               by_layout("uint8", True, 32, 1100, group=4)]
    chosen = recommend([*library, *vector, *warps, *grouped])
    assert (chosen["PREDICT_VECTOR_ROWS"], chosen["PREDICT_WARPS"],
            chosen["PREDICT_EXAMPLE_GROUP"]) == (True, 32, 4)


def by_dtype(dtype: str, ahead: bool, rate: float, same: bool = True, threads: int = 1) -> dict:
    return {"measure": "predict_by_dtype", "dtype": dtype, "stage_ahead": ahead,
            "staging_threads": threads, "examples_per_second": rate,
            "same_outputs_as_float32": same}


@pytest.fixture
def staged_by_one_thread_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's staging as these tests' rates take it: one thread, nothing ahead."""
    monkeypatch.setattr(uploads, "STAGING_THREADS", 1)
    monkeypatch.setattr(uploads, "STAGE_AHEAD", False)


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_staging_ahead_only_where_it_won_for_every_dtype_with_the_same_outputs():
    rates = [by_dtype("float32", False, 800), by_dtype("uint8", False, 1000),
             by_dtype("float32", True, 950), by_dtype("uint8", True, 1010)]
    assert recommend(rates)["STAGE_AHEAD"] is True
    slower = [*rates[:3], by_dtype("uint8", True, 990)]  # float32 faster, uint8 slower
    assert recommend(slower)["STAGE_AHEAD"] is False
    differing = [*rates[:3], by_dtype("uint8", True, 1010, same=False)]
    assert recommend(differing)["STAGE_AHEAD"] is False
    assert recommend(rates[:3])["STAGE_AHEAD"] is None  # uint8 staged ahead not measured
    assert recommend(rates)["current"]["STAGE_AHEAD"] is False


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_staging_threads_from_the_setting_whose_slower_gain_is_largest():
    library = [by_dtype("float32", False, 800), by_dtype("uint8", False, 1000)]
    four = [by_dtype("float32", False, 1000, threads=4), by_dtype("uint8", False, 1050, threads=4)]
    ahead = [by_dtype("float32", True, 1200), by_dtype("uint8", True, 1020)]  # uint8: +2% only
    chosen = recommend([*library, *four, *ahead])
    assert (chosen["STAGING_THREADS"], chosen["STAGE_AHEAD"]) == (4, False)
    fewer = recommend([*library, *four[:1], by_dtype("uint8", False, 900, threads=4), *ahead])
    assert (fewer["STAGING_THREADS"], fewer["STAGE_AHEAD"]) == (1, True)
    assert recommend(four)["STAGING_THREADS"] is None  # the library's own setting not measured
