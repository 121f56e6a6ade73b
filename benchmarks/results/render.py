"""The results (``benchmarks/results/*.json``) as the markdown tables of docs/benchmarks.md.

    python benchmarks/results/render.py                          # print every table
    python benchmarks/results/render.py --write docs/benchmarks.md
    python benchmarks/results/render.py --check docs/benchmarks.md

A results file is a JSON list, one run a row: the ``command`` that ran, the ``machine``, the
``commit`` measured and the ``figures`` (the keys the script prints; a nested key is written
``outer.inner``, a range ``[low, high]``). A table of the doc sits between
``<!-- results: NAME -->`` and ``<!-- /results -->``; ``--write`` replaces what is there with
the table ``NAME`` of ``TABLES``, ``--check`` fails where the doc differs from the files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Table:
    """Rows of ``file`` that have at least one of ``columns`` (figure key, header)."""

    file: str
    columns: tuple[tuple[str, str], ...]


TABLES = {
    "learn_speed": Table("learn_speed.json", (
        ("gln_examples_per_second", "`gln.GLN` examples/s"),
        ("plain_numpy_examples_per_second", "plain NumPy examples/s"),
        ("pygln_examples_per_second", "pygln (PyTorch) examples/s"),
        ("speedup_over_pygln", "`gln` / pygln"),
        ("predicted_class_agreement", "same class as plain NumPy"))),
    "family_learn": Table("family_learn.json", (
        ("models", "models"), ("chunk_rows", "rows a family call"),
        ("models_examples_per_second", "`GLN.learn` a row examples/s"),
        ("family_examples_per_second", "`GLNFamily.learn` examples/s"),
        ("family_over_models", "family / models"),
        ("family_one_thread_examples_per_second", "family, kernels on one thread"),
        ("family_one_thread_over_models", "one thread / models"),
        ("members_equal", "members equal models alone"),
        ("load_average", "load average, before-after"))),
    "mnist_online": Table("mnist_online.json", (
        ("seed", "seed"), ("gating_window", "gating window"),
        ("test_accuracy", "test accuracy"), ("prequential_accuracy", "prequential accuracy"),
        ("prequential_log_loss", "prequential log loss"),
        ("examples_per_second", "examples/s"))),
    "gpu_learn": Table("gpu_learn.json", (
        ("learn_examples_per_second", "learn examples/s"),
        ("prequential_accuracy", "prequential accuracy"),
        ("learn_latency_median_us", "one-example learn, median us"),
        ("learn_latency_p99_us", "p99 us"),
        ("predict_latency_median_us", "one-example predict, median us"),
        ("predict_latency_p99_us", "p99 us"),
        ("predict_float32_rows_per_second", "predict float32 rows/s"),
        ("predict_page_locked_rows_per_second", "inside `page_locked`"),
        ("predict_uint8_rows_per_second", "uint8 pixels"))),
    "gpu_peers": Table("gpu_learn.json", (
        ("learn_examples_per_second", "`gln` learn examples/s"),
        ("plain_cupy_learn_examples_per_second", "plain CuPy"),
        ("pygln_learn_examples_per_second", "pygln, 1 row a call"),
        ("pygln_batched_learn_examples_per_second", "pygln, 10 rows a call (not exact)"),
        ("plain_cupy_predict_rows_per_second", "plain CuPy predict rows/s"),
        ("pygln_predict_rows_per_second", "pygln predict, 100 rows a call"),
        ("plain_cupy_learn_latency_median_us", "plain CuPy one-example learn, median us"))),
    "service_load": Table("service_load.json", (
        ("scenario", "scenario"), ("workers", "GLN_WORKERS"), ("log", "log"),
        ("keyed", "Idempotency-Key"), ("requests_per_s", "requests/s"),
        ("examples_per_s", "examples/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
        ("p999_ms", "p99.9 ms"), ("max_ms", "max ms"))),
    "fault_load": Table("fault_load.json", (
        ("fault", "fault of the log"), ("requests_acknowledged", "requests acknowledged"),
        ("errors_returned.503", "503s returned"), ("redis_down_s", "Redis down, s"),
        ("sentinel_failover_s", "Sentinel failover, s"),
        ("learning_outage_s", "longest wait for an ack, s"), ("examples_lost", "examples lost"),
        ("examples_duplicated", "examples duplicated"),
        ("model_equals_reference", "model equals reference"),
        ("predictions_while_hung", "idle model's predictions while Redis hung"),
        ("predict_max_ms_while_hung", "their slowest, ms"),
        ("log_outage_s", "learning answered again after, s"))),
    "tenants": Table("tenants.json", (
        ("models", "models"), ("random_model_requests_per_s", "random model, req/s"),
        ("random_model_p99_ms", "p99 ms"), ("one_model_requests_per_s", "one model, req/s"),
        ("random_over_one", "random / one"), ("create_p50_ms", "create p50 ms"),
        ("create_last_tenth_p99_ms", "last tenth's p99 ms"), ("metrics_ms", "/metrics ms"),
        ("metrics_series", "series"), ("open_files", "open files"), ("rss_mib", "RSS MiB"),
        ("sigterm_to_exit_s", "SIGTERM to exit, s"),
        ("restart_to_ready_s", "restart to ready, s"))),
    "wal_append": Table("wal_append.json", (
        ("scenario", "scenario"), ("log", "file log"), ("appends_per_s", "appends/s"),
        ("fdatasyncs_per_append", "fdatasyncs per append"),
        ("speedup", "appends/s, after / before"))),
    "paper_uci": Table("paper_uci.json", (
        ("dataset", "data set"), ("method", "method"), ("splits", "splits"),
        ("test_accuracy", "test accuracy"), ("test_accuracy_stderr", "standard error"),
        ("prequential_accuracy", "prequential accuracy"),
        ("seconds_per_split", "s a split"))),
    "recovery_time": Table("recovery_time.json", (
        ("store", "store and log"), ("seconds_to_listening", "s to listening"),
        ("snapshot_load_s", "snapshot load s"), ("replay_s", "tail replay s"),
        ("seconds_to_ready", "s to `/readyz` 200"), ("export_s", "export s"),
        ("import_s", "import s"))),
    "paper_saliency": Table("paper_saliency.json", (
        ("input_scaling", "inputs"), ("test_accuracy", "test accuracy"),
        ("map_correlation.within_class", "maps, within a class"),
        ("map_correlation.between_classes", "maps, between classes"),
        ("digit_correlation.within_class", "digits, within a class"),
        ("digit_correlation.between_classes", "digits, between classes"),
        ("residual_correlation", "map less class mean vs digit less class mean"),
        ("contribution_correlation.within_class", "saliency x ink, within a class"),
        ("contribution_digit_correlation", "saliency x ink vs digit"),
        ("frame.pixels", "never-seen pixels"), ("frame.flat", "flat on every map"),
        ("frame.offset_in_seen_spreads", "frame level off the mean, in spreads"))),
    "paper_permuted_mnist": Table("paper_permuted_mnist.json", (
        ("model", "model"), ("seed", "seed"), ("tasks", "tasks"),
        ("train_per_task", "examples a task"), ("test_per_task", "test examples a task"),
        ("task1_after_task1", "task 1 after task 1"),
        ("task1_after_last", "task 1 after the last"),
        ("mean_new_task", "each task after it, mean"),
        ("mean_after_last", "all tasks after the last, mean"))),
    "paper_capacity": Table("paper_capacity.json", (
        ("dataset", "dataset"), ("model", "model"), ("weights", "weights"),
        ("examples", "examples"), ("passes", "passes"),
        ("final_train_accuracy", "training accuracy after the last pass"))),
    "paper_density": Table("paper_density.json", (
        ("train", "train images"), ("valid", "valid images"), ("test", "test images"),
        ("base_predictions", "base predictions"),
        ("layer_sizes", "neurons"), ("context_dim", "context dimension"),
        ("test_nats_online", "test nats an image, online"),
        ("test_nats_frozen", "test nats an image, frozen"),
        ("train_nats_online", "train nats an image, online"),
        ("images_per_second", "images/s"))),
}
BLOCK = re.compile(r"(<!-- results: (\w+) -->\n).*?(<!-- /results -->)", re.DOTALL)


def load(file: str) -> list[dict]:
    """The runs of a results file, each checked to name its command, machine and commit."""
    runs = json.loads((RESULTS / file).read_text())
    for run in runs:
        missing = {"command", "machine", "commit", "figures"} - set(run)
        if missing:
            raise ValueError(f"{file}: a run without {sorted(missing)}: {run}")
    return runs


def figure(figures: dict, key: str) -> Any:
    """``figures[key]``, ``outer.inner`` read as a nested key; None where absent."""
    value: Any = figures
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def cell(value: Any) -> str:
    """A figure as a table shows it: thousands separated, a range as low-high."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "-".join(cell(v) for v in value)
    if isinstance(value, int | float):
        return f"{value:,}"
    return str(value)


def render(name: str) -> str:
    """Table ``name`` of ``TABLES`` as markdown, each run a row with its commit, machine and
    command."""
    table = TABLES[name]
    keys = [key for key, _ in table.columns]
    headers = [header for _, header in table.columns] + ["commit", "machine", "command"]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "---:|" * len(keys) + "---|---|---|"]
    for run in load(table.file):
        values = [figure(run["figures"], key) for key in keys]
        if all(v is None for v in values):
            continue
        lines.append("| " + " | ".join([*map(cell, values), run["commit"], run["machine"],
                                        f"`{run['command']}`"]) + " |")
    return "\n".join(lines) + "\n"


def rendered(doc: str) -> str:
    """``doc`` with every results block replaced by its table."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(3), doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="a markdown file whose blocks to rewrite")
    parser.add_argument("--check", type=Path, help="a markdown file whose blocks to compare")
    args = parser.parse_args(argv)
    if args.write:
        args.write.write_text(rendered(args.write.read_text()))
    elif args.check:
        if rendered(args.check.read_text()) != args.check.read_text():
            print(f"{args.check}: tables differ from benchmarks/results; run "
                  f"python benchmarks/results/render.py --write {args.check}", file=sys.stderr)
            return 1
    else:
        for name in TABLES:
            print(f"<!-- results: {name} -->\n{render(name)}<!-- /results -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
