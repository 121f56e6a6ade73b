"""Could the gating GEMM run on tensor cores? TF32 products, plain and split in three, and
products of int8 slices, against the float32 GEMM the library uses: device time and error, on
one chunk of the MNIST network.

    python benchmarks/gpu_gating_tf32.py [--data-dir DIR] [--rows 4096]
    python benchmarks/gpu_gating_tf32.py --emulated --rows 256 [--data-dir DIR]   # no GPU

The gating product (4,096 rows by 10,280 hyperplanes for MNIST) runs at the H100's float32 rate,
1.3 ms of the 4.4 ms the device spends predicting 4,096 rows. TF32 tensor cores multiply
several times faster, but round the inputs to 10 bits: the bound under which a float32
margin's sign is trusted (``gln.gating.rounding_tolerances``, 2 gamma_d ||z||) would have to
grow, and every margin inside the larger bound would be re-checked in float64. The split
product keeps most of float32's accuracy at three TF32 products' cost:

    z = zh + zl, v = vh + vl (each part's low 13 bits zeroed, so the hardware's conversion to
    TF32 changes nothing), z . v ~ zh . vh + zh . vl + zl . vh, one GEMM over [zh, zh, zl] and
    [vh, vl, vh], 3 d long.

The int8 products (``int8_2slices``: 3 int8 GEMMs, ``int8_3slices``: 6) come with a bound of
their own, proved (``benchmarks/int8_gating.py``): integer tensor cores add exactly, so only
the slicing errs. Their lines add ``own_bound``: the largest error in units of that bound
(above 1 would disprove it), the share of margins inside it (what the float64 re-check would
take), the margins outside it whose sign is wrong (must be 0), and its median size in units of
the library's float32 bound; ``own_row_bound`` the same for its largest value over the planes
per row (``int8_gating.row_bound``), a tolerance the library's contexts kernel could take as it
is. Their time includes slicing the rows; the normals are sliced once per model.

Prints one JSON line per product (``float32``, ``tf32``, ``tf32x3``, the int8 ones): device
microseconds (CUDA events, back to back), the largest and the 99.99th-percentile error
against the float64 product in units of the library's bound (the float32 GEMM must stay below
1), and for each multiple k of that bound the share of margins inside k bounds (what would be
re-checked) and the margins outside them whose float32 sign is wrong (``wrong_outside``: a
bound that lets one through is unsafe on this data; 0 is necessary, not sufficient: a bound
must be proved). Then a ``gating_paths`` line for each of ``--path-rows`` (the first rows of
the same data): the library's two ``GATING_PRODUCT`` paths, each timed whole as a chunk of
that many rows is gated (int8 slices the normals for every chunk, which short chunks feel:
these lines say from how many rows it pays).
Needs CuPy and a GPU, or ``--emulated``: the CPU's emulated device (tests/gln/emulated_cupy.py),
TF32 products emulated by rounding the operands to TF32 and multiplying in float32; its shares
of margins are the data's, its times and errors are not the tensor cores'.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import int8_gating  # noqa: E402
from benchmarks.gpu_learn import (  # noqa: E402
    GATING_PRODUCTS,
    NETWORK,
    device_name,
    int_list,
    load_data,
    mean_event_seconds,
    module_constant,
    served_inputs,
)
from gln import GLN  # noqa: E402
from gln.gating import dot_rounding_bound  # noqa: E402
from gln.kernels.int8_gating import int8_product  # noqa: E402

BOUND_MULTIPLES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LOW_13_BITS_CLEARED = np.uint32(0xFFFFE000)  # float32 -> a value TF32 holds exactly


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_gating_tf32", "device": device, **record}), flush=True)


def tf32_product(cp: ModuleType, a: Any, b: Any) -> Any:
    """``a @ b.T`` for float32 operands on TF32 tensor cores (cuBLAS, through CuPy)."""
    linalg = cp._core._routines_linalg
    before = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        return a @ b.T
    finally:
        linalg.set_compute_type(np.float32, before)


def tf32_part(cp: ModuleType, a: Any) -> Any:
    """``a`` with its low 13 mantissa bits cleared: exactly a TF32 value."""
    return (a.view(cp.uint32) & _LOW_13_BITS_CLEARED).view(cp.float32)


def split_operands(cp: ModuleType, z: Any, normals: Any) -> tuple[Any, Any]:
    """[zh, zh, zl] and [vh, vl, vh], whose product is zh.vh + zh.vl + zl.vh."""
    zh, vh = tf32_part(cp, z), tf32_part(cp, normals)
    zl, vl = tf32_part(cp, z - zh), tf32_part(cp, normals - vh)
    return (cp.ascontiguousarray(cp.concatenate([zh, zh, zl], axis=1)),
            cp.ascontiguousarray(cp.concatenate([vh, vl, vh], axis=1)))


def margin_errors(cp: ModuleType, products: Any, exact: Any, offsets: Any, tolerance: Any
                  ) -> dict[str, Any]:
    """How far ``products`` are from ``exact`` in bound units, and what each multiple of the
    bound would re-check or let through wrong."""
    error = cp.abs(products.astype(cp.float64) - exact) / tolerance[:, None]
    margins = cp.abs(products - offsets[None, :]) / tolerance[:, None]  # float32, as the kernel
    wrong = (products - offsets[None, :] >= 0) != (exact >= offsets[None, :].astype(cp.float64))
    return {
        "max_error_in_bounds": float(error.max()),
        "p9999_error_in_bounds": float(cp.percentile(error.ravel(), 99.99)),
        "by_bound_multiple": [
            {"k": k, "rechecked_share": float((margins <= k).mean()),
             "wrong_outside": int((wrong & (margins > k)).sum())}
            for k in BOUND_MULTIPLES
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--path-rows", type=int_list, default=[64, 256, 1024, 2048, 4096],
                        help="chunk lengths to time the library's gating paths at")
    parser.add_argument("--emulated", action="store_true",
                        help="on the CPU's emulated device, TF32 emulated by rounding")
    args = parser.parse_args(argv)
    if args.emulated:
        from tests.gln.emulated_cupy import emulated_cupy_installed  # noqa: PLC0415

        with emulated_cupy_installed():
            measure(args, rounded_operands_product)
    else:
        measure(args, tf32_product)


def rounded_operands_product(cp: ModuleType, a: Any, b: Any) -> Any:
    """TF32's operand rounding (the low 13 bits cleared) with a float32 product: an emulation
    of ``tf32_product`` for machines without tensor cores."""
    return tf32_part(cp, a) @ tf32_part(cp, b).T


def measure(args: argparse.Namespace, tf32: Callable[[ModuleType, Any, Any], Any]) -> None:
    """The products' lines for ``args``, on the ``cupy`` that imports now, ``tf32`` standing
    for ``tf32_product``."""
    import cupy as cp  # noqa: PLC0415 - a GPU's, or the emulation's

    device = device_name(cp)
    X, y, data = load_data(args, 2 * args.rows)
    model = GLN(**NETWORK, device="cuda")
    model.learn(X[:args.rows], y[:args.rows])  # moments of real data, as a serving model has
    z = served_inputs(cp, model, X[args.rows:])
    normals, offsets = model.normals, model.offsets
    exact = z.astype(cp.float64) @ normals.astype(cp.float64).T
    bound = 2.0 * dot_rounding_bound(z.shape[1])  # the library's, per unit of ||z||
    tolerance = bound * cp.sqrt((z.astype(cp.float64) ** 2).sum(axis=1))
    split_z, split_normals = split_operands(cp, z, normals)

    runs = {"float32": lambda: z @ normals.T, "tf32": lambda: tf32(cp, z, normals),
            "tf32x3": lambda: tf32(cp, split_z, split_normals)}
    for name, run in runs.items():
        seconds = mean_event_seconds(cp, run, args.repeats)
        emit({"measure": "gating_product", "product": name, "rows": len(z),
              "planes": normals.shape[0], "features": z.shape[1], "data": data,
              "device_us": seconds * 1e6,
              **margin_errors(cp, run(), exact, offsets, tolerance)}, device)
    for count in (2, 3):
        emit(int8_record(cp, count, z, normals, offsets, exact, tolerance, args.repeats, data),
             device)
    for rows in args.path_rows:
        if rows <= len(z):
            emit(library_record(cp, model, z[:rows], exact[:rows], tolerance[:rows],
                                args.repeats, data), device)


def library_record(cp: ModuleType, model: GLN, z: Any, exact: Any, tolerance: Any,
                   repeats: int, data: str) -> dict:
    """The library's two gating paths for ``model``'s planes, each ``GATING_PRODUCT``: the
    float32 GEMM with its bound, and ``gln.kernels.int8_gating``'s (slicing kernels, three
    int8 GEMMs and the per-row bound, the estimates made by the contexts kernel), each timed
    whole as the model gates a chunk (products, bounds, contexts, re-checks), with the share of
    margins each bound leaves to the float64 re-check and any outside it with the wrong sign."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    normals, offsets = model.normals, model.offsets
    record = {"measure": "gating_paths", "rows": len(z), "planes": normals.shape[0],
              "features": z.shape[1], "data": data}
    truth = exact >= offsets[None, :].astype(cp.float64)

    def gating() -> list[Any]:
        return cuda.cuda_layer_contexts(z, normals, offsets, model.context_dim, model.num_glns,
                                        model.layer_sizes)

    for name in GATING_PRODUCTS:
        try:
            with module_constant(cuda, "GATING_PRODUCT", name):
                seconds = mean_event_seconds(cp, gating, repeats)
                products, bound = cuda._gating_products_and_bounds(z, normals, offsets)
        except Exception as error:  # noqa: BLE001 - one path's failure is a line, not the end
            record[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        if hasattr(products, "as_float32"):
            products = products.as_float32()
        margins = products - offsets[None, :]  # float32, as the kernel subtracts
        inside = cp.abs(margins) <= bound[:, None]
        record[name] = {"device_us": seconds * 1e6, "rechecked_share": float(inside.mean()),
                        "wrong_outside": int(((margins >= 0) != truth)[~inside].sum()),
                        "median_bound_in_float32_bounds": float(cp.median(bound / tolerance))}
    return record


def int8_record(cp: ModuleType, count: int, z: Any, normals: Any, offsets: Any, exact: Any,
                tolerance: Any, repeats: int, data: str) -> dict:
    """One int8 product's line: ``count`` slices a row, timed from the rows' slicing."""
    name = f"int8_{count}slices"
    record = {"measure": "gating_product", "product": name, "rows": len(z),
              "planes": normals.shape[0], "features": z.shape[1], "data": data}
    try:
        planes = int8_gating.sliced(cp, normals, count)

        def run() -> list[Any]:
            return int8_gating.products_by_order(
                cp, int8_gating.sliced(cp, z, count), planes, int8_product)

        seconds = mean_event_seconds(cp, run, repeats)
    except Exception as error:  # noqa: BLE001 - one product's failure is a line, not the end
        return {**record, "error": f"{type(error).__name__}: {error}"}
    rows = int8_gating.sliced(cp, z, count)
    orders = int8_gating.products_by_order(cp, rows, planes, int8_product)
    estimate = int8_gating.combined(cp, orders, rows, planes)
    margins = estimate - offsets[None, :].astype(cp.float64)
    wrong = (margins >= 0) != (exact >= offsets[None, :].astype(cp.float64))
    per_pair = int8_gating.bound(cp, orders, rows, planes)
    per_row = cp.broadcast_to(int8_gating.row_bound(cp, rows, planes)[:, None], per_pair.shape)
    return {**record, "device_us": seconds * 1e6,
            **margin_errors(cp, estimate, exact, offsets, tolerance),
            "own_bound": own_bound_record(cp, per_pair, estimate, exact, margins, wrong,
                                          tolerance),
            "own_row_bound": own_bound_record(cp, per_row, estimate, exact, margins, wrong,
                                              tolerance)}


def own_bound_record(cp: ModuleType, own: Any, estimate: Any, exact: Any, margins: Any,
                     wrong: Any, tolerance: Any) -> dict:
    """How a proved bound ``own`` (n, P) fares: the largest error in its units (at most 1),
    the margins it leaves to the float64 re-check, those outside it with the wrong sign (none),
    and its median size in units of the library's float32 bound."""
    inside = cp.abs(margins) <= own
    return {"max_error_in_own_bounds": float((cp.abs(estimate - exact) / own).max()),
            "rechecked_share": float(inside.mean()),
            "wrong_outside": int((wrong & ~inside).sum()),
            "median_in_library_bounds": float(cp.median(own / tolerance[:, None]))}


if __name__ == "__main__":
    main()
