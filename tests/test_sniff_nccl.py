from __future__ import annotations

from forensics.parsers import sniff


def test_nccl_envelope_beats_everything_text():
    text = b"junk\nhost:1:2 [0] NCCL INFO Bootstrap : Using eth0:1.2.3.4<0>\n"
    assert sniff.score_nccl_log(text) == 51


def test_watchdog_log_with_kernel_words_is_nccl():
    text = (b"[rank1]:[E626 16:48:25.4 ProcessGroupNCCL.cpp:670] Stack trace ... FlightRecorder is disabled\n" * 5
            + b"kernel: something\nOut of memory\n")
    assert sniff.score_nccl_log(text) == 45 > sniff.score_dmesg(text) == 32


def test_plain_text_is_not_nccl():
    assert sniff.score_nccl_log(b"epoch 1 loss 2.3\n") == 0


def test_nccl_tests_table_pasted_without_its_parameter_line_is_nccl():
    # NVIDIA/nccl-tests#256 (comment of 2024-10-11): the mpirun line, then the column header and rows only
    text = (b"mpirun -np 16 -x NCCL_TOPO_FILE=/home/fs/nccl_topo.xml all_reduce_perf -b 32M -e 16G\n\n"
            b"#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
            b"busbw #wrong\n")
    assert sniff.score_nccl_log(text) == 41
    assert sniff.score_nccl_log(b"size count type\n") == 0  # the words alone, not the header, are not enough
