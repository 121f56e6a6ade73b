"""The loop counter reads cuobjdump's listings; where cuobjdump and a compiler (NVRTC or nvcc)
are at hand it also holds the shared prediction kernel's inner loop to what the row loads
need."""

import json
import shutil

import pytest

from benchmarks import nvrtc
from benchmarks.kernel_sass import cuobjdump, loops, main, opcode

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   LDS R0, [R22] ;                        /* 0x0000000016007984 */
        /*0020*/              @!P0 LDS.128 R4, [R22+0x80] ;               /* 0x0000800016048984 */
        /*0030*/                   FFMA R3, R0, R73, RZ ;                 /* 0x0000004900037223 */
        /*0040*/                   BRA.DIV UR4, 0x200 ;                   /* 0x0000001e04647947 */
        /*0050*/                   SHFL.BFLY PT, R3, R0, 0x10, 0x1f ;     /* 0x0e001f0000037f89 */
        /*0060*/                   ISETP.NE.AND P0, PT, R69, R98, PT ;    /* 0x000000624500720c */
        /*0070*/               @P1 BRA 0x90 ;                             /* 0x0000000000041947 */
        /*0080*/              @!P0 BRA 0x10 ;                             /* 0xfffffff800008947 */
        /*0090*/                   STG.E [R2.64], R3 ;                    /* 0x0000000302007986 */
        /*00a0*/              @!P2 BRA 0x30 ;                             /* 0xfffffff800008947 */
        /*00b0*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def test_opcodes_lose_predicates_and_modifiers():
    assert opcode("@!P0 LDS.128 R4, [R22+0x80]") == "LDS"
    assert opcode("SHFL.BFLY PT, R3, R0, 0x10, 0x1f") == "SHFL"
    assert opcode("FFMA R3, R0, R73, RZ") == "FFMA"


def test_each_backward_branch_is_a_loop_counted_by_kind():
    found = list(loops(LISTING))
    # The forward branch (0x70) and the divergence branch (BRA.DIV) are not loops.
    assert [(loop["start"], loop["end"]) for loop in found] == [("0x10", "0x80"),
                                                                ("0x30", "0xa0")]
    inner, outer = found
    assert inner["instructions"] == 8 and outer["instructions"] == 8
    assert inner["shared_loads"] == 2 and outer["shared_loads"] == 0
    assert inner["fmas"] == 1 and inner["shuffles"] == 1 and inner["integer_compares"] == 1
    assert outer["global_stores"] == 1
    assert list(loops(LISTING, min_instructions=9)) == []


def _tools_present() -> bool:
    try:
        cuobjdump()
    except FileNotFoundError:
        return False
    return nvrtc.library() is not None or shutil.which("nvcc") is not None


@pytest.mark.skipif(not _tools_present(),
                    reason="needs cuobjdump (nvidia-cuda-cuobjdump, -nvdisasm) and NVRTC or nvcc")
def test_the_shared_kernels_row_loads_compare_only_the_last_element(capsys):
    """MNIST's first layer, 25 elements a lane: a row is 25 loads from shared memory, with
    only the last element checked against the row's end, not each of them: in the plain loop
    (one sum at a time), a pair's loop holds fewer than 12 integer compares; in the source's
    batched loop (16 sums at once), the loop over the whole batch as few a pair."""
    main(["--kernel", "gln_layer_predict_shared", "--define", "GLN_PER_LANE=25",
          "--define", "GLN_SUM_BATCH=1"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    inner = [r for r in records if r["shared_loads"] == 25]
    assert inner, records
    assert all(r["integer_compares"] < 12 for r in inner), inner
    main(["--kernel", "gln_layer_predict_shared", "--define", "GLN_PER_LANE=25"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    batch = max(records, key=lambda r: r["shared_loads"])
    pairs = batch["shared_loads"] // 25
    assert pairs == 16 and batch["shared_loads"] == 25 * pairs, batch
    assert batch["integer_compares"] < 12 * pairs, batch
