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
