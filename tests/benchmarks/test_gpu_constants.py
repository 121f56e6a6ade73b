"""Reading the launch constants off a GPU benchmark's layer_pass and shared_grid lines."""

import json

import pytest

import gln.staging
from benchmarks.gpu_constants import GRID_MARGIN, main, recommend
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
    assert printed["PREDICT_SUM_BATCH"] is None and printed["PREDICT_WARPS"] is None
    assert printed["PREDICT_EXAMPLE_GROUP"] is None and printed["shared_grid_us"] == []
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


MNIST_LAYERS = ("784->128", "128->128", "128->1")  # 25, 5 and 5 elements a lane
INPUTS = {"784->128": 785, "128->128": 129, "128->1": 129, "2048->8": 2049}  # with the bias


def grid(setting: tuple[int, int, int], *times: list[float],
         layers: tuple[str, ...] = MNIST_LAYERS) -> list[dict]:
    """``shared_grid`` lines of one setting: each layer's microseconds turn by turn."""
    batch, warps, group = setting
    return [{"measure": "shared_grid", "layer": layer, "inputs": INPUTS[layer], "rows": 2048,
             "sum_batch": batch, "warps": warps, "example_group": group, "turn": turn,
             "microseconds": us}
            for layer, by_turn in zip(layers, times, strict=True)
            for turn, us in enumerate(by_turn)]


@pytest.fixture
def library_grid_setting(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """The library's shared-kernel settings as these tests take them: the source's sum batch
    (16 on MNIST's layers), 32 warps, examples in pairs; as the grid writes them."""
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", None)
    monkeypatch.setattr(cuda, "PREDICT_WARPS", 32)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", 2)
    return 16, 32, 2


def shared_constants(chosen: dict) -> tuple:
    return (chosen["PREDICT_SUM_BATCH"], chosen["PREDICT_WARPS"],
            chosen["PREDICT_EXAMPLE_GROUP"])


def test_the_grid_setting_least_in_time_summed_over_layers_of_medians_over_turns(
        library_grid_setting):
    library = grid(library_grid_setting, [500, 510, 490], [150, 140, 160], [10, 10, 10])
    # Each layer's median (not mean: one slow turn) sums to 600, under the library's 660.
    quick = grid((8, 24, 4), [450, 3000, 450], [140, 150, 140], [10, 10, 10])
    # Quickest on the first layer, but not summed over the three.
    first = grid((32, 16, 8), [400, 400, 400], [300, 300, 300], [10, 10, 10])
    # Quickest of all, but not measured on the last layer: not a candidate.
    partial = grid((1, 16, 1), [100, 100, 100], [100, 100, 100],
                   layers=MNIST_LAYERS[:2])
    chosen = recommend([*library, *quick, *first, *partial])
    assert shared_constants(chosen) == (8, 24, 4)
    totals = {(r["sum_batch"], r["warps"], r["example_group"]): r["microseconds"]
              for r in chosen["shared_grid_us"]}
    assert totals == {(8, 24, 4): 600, (16, 32, 2): 660, (32, 16, 8): 710}
    assert [r["microseconds"] for r in chosen["shared_grid_us"]] == [600, 660, 710]


def test_the_librarys_values_unless_the_grid_beats_them_by_more_than_the_margin(
        library_grid_setting):
    library = grid(library_grid_setting, [1000], [100], [10])
    near = 1 - GRID_MARGIN / 2  # quicker, but within the margin
    level = grid((8, 24, 4), [1000 * near], [100 * near], [10 * near])
    assert shared_constants(recommend([*library, *level])) == (None, 32, 2)
    beyond = 1 - 2 * GRID_MARGIN
    ahead = grid((8, 24, 4), [1000 * beyond], [100 * beyond], [10 * beyond])
    assert shared_constants(recommend([*library, *level, *ahead])) == (8, 24, 4)
    # The library's own batch with other warps: the batch stays the library's (the source's).
    warps = grid((16, 24, 2), [1000 * beyond], [100 * beyond], [10 * beyond])
    assert shared_constants(recommend([*library, *level, *warps])) == (None, 24, 2)


def test_no_grid_choice_without_the_librarys_setting_or_another(library_grid_setting,
                                                                monkeypatch):
    library = grid(library_grid_setting, [1000], [100], [10])
    other = grid((8, 24, 4), [500], [50], [5])
    assert shared_constants(recommend(library)) == (None, None, None)  # nothing else
    assert shared_constants(recommend(other)) == (None, None, None)  # the library's not timed
    # With the library's batch set to 8, the lines batched by 16 are another setting's.
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", 8)
    by_eight = grid((8, 32, 2), [2000], [200], [20])
    assert shared_constants(recommend([*library, *by_eight])) == (16, 32, 2)
    # A layer of 65 elements a lane, whose sums the source does not batch: no setting of the
    # grid, one batch for every layer, is the library's.
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", None)
    wide = ("2048->8", *MNIST_LAYERS[1:])
    mixed = [*grid(library_grid_setting, [1000], [100], [10], layers=wide),
             *grid((8, 24, 4), [500], [50], [5], layers=wide)]
    assert shared_constants(recommend(mixed)) == (None, None, None)


def by_dtype(dtype: str, ahead: bool, rate: float, same: bool = True, threads: int = 1,
             behind: bool | None = None, locked: bool | None = None) -> dict:
    """A ``predict_by_dtype`` line; without ``behind`` or ``locked``, one from before its
    ``launch_while_staging`` or ``send_registered`` (the library's, then)."""
    line = {"measure": "predict_by_dtype", "dtype": dtype, "stage_ahead": ahead,
            "staging_threads": threads, "examples_per_second": rate,
            "same_outputs_as_float32": same}
    if behind is not None:
        line["launch_while_staging"] = behind
    return line if locked is None else {**line, "send_registered": locked}


@pytest.fixture
def staged_by_one_thread_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's staging as these tests' rates take it: one thread, nothing ahead, the
    rows staged (not page-locked)."""
    monkeypatch.setattr(uploads, "STAGING_THREADS", 1)
    monkeypatch.setattr(uploads, "STAGE_AHEAD", False)
    monkeypatch.setattr(uploads, "SEND_REGISTERED", False)


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_staging_ahead_only_where_it_won_for_every_dtype_with_the_same_outputs():
    rates = [by_dtype("float32", False, 800), by_dtype("uint8", False, 1000),
             by_dtype("float32", True, 950), by_dtype("uint8", True, 1010)]
    assert recommend(rates)["STAGE_AHEAD"] is True
    level = [*rates[:3], by_dtype("uint8", True, 990)]  # uint8 1% slower: noise
    assert recommend(level)["STAGE_AHEAD"] is True
    slower = [*rates[:3], by_dtype("uint8", True, 970)]  # float32 faster, uint8 3% slower
    assert recommend(slower)["STAGE_AHEAD"] is False
    differing = [*rates[:3], by_dtype("uint8", True, 1010, same=False)]
    assert recommend(differing)["STAGE_AHEAD"] is False
    assert recommend(rates[:3])["STAGE_AHEAD"] is None  # uint8 staged ahead not measured
    assert recommend(rates)["current"]["STAGE_AHEAD"] is False


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_staging_threads_from_the_setting_whose_float32_gain_is_largest():
    library = [by_dtype("float32", False, 800), by_dtype("uint8", False, 1000)]
    four = [by_dtype("float32", False, 1000, threads=4), by_dtype("uint8", False, 1050, threads=4)]
    ahead = [by_dtype("float32", True, 1200, threads=4), by_dtype("uint8", True, 975, threads=4)]
    chosen = recommend([*library, *four, *ahead])  # uint8 2.5% slower staged ahead: not that
    assert (chosen["STAGING_THREADS"], chosen["STAGE_AHEAD"]) == (4, False)
    ahead[1] = by_dtype("uint8", True, 990, threads=4)  # 1% slower: noise
    chosen = recommend([*library, *four, *ahead])
    assert (chosen["STAGING_THREADS"], chosen["STAGE_AHEAD"]) == (4, True)
    fewer = recommend([*library, *four[:1], by_dtype("uint8", False, 900, threads=4)])
    assert (fewer["STAGING_THREADS"], fewer["STAGE_AHEAD"]) == (1, False)
    assert recommend(four)["STAGING_THREADS"] is None  # the library's own setting not measured


def by_upload(first: int | None, rate: float, threads: int | None = None,
              pieces: int | None = None, behind: bool | None = None) -> dict:
    """A ``predict_by_upload`` line, by default with the library's staging as it is when
    called; without ``behind``, one without ``launch_while_staging`` (the library's, then)."""
    line = {"measure": "predict_by_upload", "uploads": "copy_stream",
            "staging_threads": threads or uploads.STAGING_THREADS,
            "staging_pieces": pieces or uploads.STAGING_PIECES, "first_chunk_rows": first,
            "examples_per_second": rate}
    return line if behind is None else {**line, "launch_while_staging": behind}


def test_the_first_chunk_length_that_beat_the_librarys_with_its_staging():
    current_stream = {**by_upload(None, 2000), "uploads": "current_stream"}
    other_staging = by_upload(256, 3000, threads=1, pieces=1)
    rates = [by_upload(None, 900), by_upload(512, 950), by_upload(1024, 920), current_stream,
             other_staging]
    assert recommend(rates)["PREDICT_FIRST_CHUNK_ROWS"] == 512
    slower = [by_upload(None, 900), by_upload(512, 890), by_upload(1024, 850), current_stream]
    assert recommend(slower)["PREDICT_FIRST_CHUNK_ROWS"] is None  # the library's: none
    assert recommend(rates[1:])["PREDICT_FIRST_CHUNK_ROWS"] is None  # no library line
    assert recommend([by_upload(None, 900)])["PREDICT_FIRST_CHUNK_ROWS"] is None
    assert recommend(rates)["current"]["PREDICT_FIRST_CHUNK_ROWS"] is None


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_sending_while_staging_where_float32_gained_and_uint8_kept_its_pace():
    library = [by_dtype("float32", False, 800, behind=False),
               by_dtype("uint8", False, 1000, behind=False)]
    behind = [by_dtype("float32", False, 900, behind=True),
              by_dtype("uint8", False, 990, behind=True)]
    chosen = recommend([*library, *behind])
    assert (chosen["LAUNCH_WHILE_STAGING"], chosen["STAGE_AHEAD"]) == (True, False)
    slower = [behind[0], by_dtype("uint8", False, 950, behind=True)]
    assert recommend([*library, *slower])["LAUNCH_WHILE_STAGING"] is False
    no_gain = [by_dtype("float32", False, 800, behind=True), behind[1]]
    assert recommend([*library, *no_gain])["LAUNCH_WHILE_STAGING"] is False
    assert recommend(behind)["LAUNCH_WHILE_STAGING"] is None  # the library's not measured
    assert recommend(library)["current"]["LAUNCH_WHILE_STAGING"] is False


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_page_locked_rows_where_float32_gained_and_uint8_kept_its_pace():
    staged = [by_dtype("float32", False, 800, behind=False, locked=False),
              by_dtype("uint8", False, 1000, behind=False, locked=False)]
    locked = [by_dtype("float32", False, 1000, behind=False, locked=True),
              by_dtype("uint8", False, 1005, behind=False, locked=True)]
    chosen = recommend([*staged, *locked])
    assert (chosen["SEND_REGISTERED"], chosen["STAGE_AHEAD"], chosen["STAGING_THREADS"],
            chosen["LAUNCH_WHILE_STAGING"]) == (True, False, 1, False)
    slower = [locked[0], by_dtype("uint8", False, 950, behind=False, locked=True)]
    assert recommend([*staged, *slower])["SEND_REGISTERED"] is False
    differing = [locked[0], by_dtype("uint8", False, 1005, same=False, behind=False,
                                     locked=True)]
    assert recommend([*staged, *differing])["SEND_REGISTERED"] is False
    assert recommend(locked)["SEND_REGISTERED"] is None  # the library's not measured
    assert recommend(staged)["current"]["SEND_REGISTERED"] is False


def by_locking(dtype: str, after: bool, ahead: bool, rate: float, same: bool = True) -> dict:
    """A ``predict_by_locking`` line."""
    return {"measure": "predict_by_locking", "dtype": dtype, "unlock_after_return": after,
            "lock_rest_ahead": ahead, "examples_per_second": rate,
            "same_outputs_as_float32": same}


def locking_choice(records: list[dict]) -> tuple:
    chosen = recommend(records)
    return chosen["UNLOCK_AFTER_RETURN"], chosen["LOCK_REST_AHEAD"]


def test_the_locking_where_float32_gained_most_and_uint8_kept_its_pace(monkeypatch):
    monkeypatch.setattr(uploads, "UNLOCK_AFTER_RETURN", False)
    monkeypatch.setattr(uploads, "LOCK_REST_AHEAD", False)
    library = [by_locking("float32", False, False, 900), by_locking("uint8", False, False, 1000)]
    after = [by_locking("float32", True, False, 950), by_locking("uint8", True, False, 990)]
    both = [by_locking("float32", True, True, 980), by_locking("uint8", True, True, 1010)]
    assert locking_choice([*library, *after, *both]) == (True, True)
    slower = [both[0], by_locking("uint8", True, True, 950)]  # uint8 5% slower: not that
    assert locking_choice([*library, *after, *slower]) == (True, False)
    differing = [by_locking("float32", True, True, 980, same=False), both[1]]
    assert locking_choice([*library, *after, *differing]) == (True, False)
    no_gain = [by_locking("float32", True, False, 890), after[1]]
    assert locking_choice([*library, *no_gain]) == (False, False)
    assert locking_choice([*after, *both]) == (None, None)  # the library's not measured
    assert recommend(library)["current"]["LOCK_REST_AHEAD"] is False


@pytest.mark.usefixtures("staged_by_one_thread_in_turn")
def test_the_first_chunk_is_chosen_among_lines_sent_as_the_staging_recommended():
    """Sending while staging recommended (off predict_by_dtype's lines): the first chunk comes
    from the lines sent so, whose best may differ from the lines sent as before."""
    upload = [by_upload(None, 900, behind=False), by_upload(512, 880, behind=False),
              by_upload(1024, 950, behind=False), by_upload(None, 1000, behind=True),
              by_upload(512, 1100, behind=True), by_upload(1024, 1050, behind=True)]
    staged_before = [by_dtype("float32", False, 800, behind=False),
                     by_dtype("uint8", False, 1000, behind=False)]
    staged_behind = [by_dtype("float32", False, 900, behind=True),
                     by_dtype("uint8", False, 1000, behind=True)]
    chosen = recommend([*upload, *staged_before, *staged_behind])
    assert (chosen["LAUNCH_WHILE_STAGING"], chosen["PREDICT_FIRST_CHUNK_ROWS"]) == (True, 512)
    staged_behind[0] = by_dtype("float32", False, 700, behind=True)  # sending so lost
    chosen = recommend([*upload, *staged_before, *staged_behind])
    assert (chosen["LAUNCH_WHILE_STAGING"], chosen["PREDICT_FIRST_CHUNK_ROWS"]) == (False, 1024)
