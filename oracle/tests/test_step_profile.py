"""scripts/step-profile.py: the last complete decode step out of an ncu raw CSV as the GPU box
writes it (the program's own lines between ncu's rows), its kernels grouped by shape, units
converted, and clear errors for a table it cannot use."""

import importlib.util

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("step_profile", ROOT / "scripts" / "step-profile.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)

HEAD = '"ID","Kernel Name","Grid Size","dram__bytes_read.sum","gpu__time_duration.sum","launch__grid_size"'


def csv_text(kernels, time_unit="ns", byte_unit="byte"):
    """An ncu raw table of (name, time, bytes) with ncu's and the program's noise around it."""
    lines = ["==PROF== Connected to process 585 (/x/engine)", HEAD,
             f'"","","","{byte_unit}","{time_unit}",""']
    for i, (name, t, b) in enumerate(kernels):
        lines.append(f'"{i}","{name}","(1, 1, 1)","{b:,}","{t:,}","512"')
        if i == 3:
            lines.append("0: 85619,34065,9049,63815")  # the program's stdout
    lines.append("==PROF== Disconnected from process 585")
    return "\n".join(lines) + "\n"


def step(scale):
    """One decode step of a two-layer model: embed, per layer q/k/v, attention, o, gate/up, down,
    then the final norm, the lm_head and its argmax; times in ns scaled by `scale`."""
    ks = [("embed_gather", 5000 * scale, 8192)]
    for _ in range(2):
        ks += [("gemv_m8_b1", 9000 * scale, 12_600_000), ("attention_g4", 10000 * scale, 120_000),
               ("gemv_m1_b1", 7000 * scale, 8_400_000), ("gemv_m4_b1", 22000 * scale, 67_100_000),
               ("gemv_m1_b1", 16000 * scale, 33_600_000)]
    return ks + [("rmsnorm", 8000 * scale, 16_000), ("gemv_m5_b1", 126000 * scale, 525_000_000),
                 ("argmax_final", 9000 * scale, 130_000)]


def test_the_last_complete_step_grouped_by_shape():
    prefill = [("rmsnorm", 3000, 1000), ("attention_prefill_d64", 40000, 5_000_000)]
    # Two whole steps (the second twice as slow), then a step cut off by --launch-count.
    ks = sp.kernels(csv_text(prefill + step(1) + step(2) + step(1)[:4]))
    got = sp.last_step(ks)
    assert [k[0] for k in got] == [k[0] for k in step(2)]
    assert got[0][1] == 10.0 and got[0][2] == 8192  # ns -> us, bytes
    t = sp.table(got, copy_tbs=4.0)
    rows = [line for line in t.splitlines() if line.startswith("| gemv_m1_b1")]
    # o and down are one kernel of two shapes: two rows, each with its two calls.
    assert len(rows) == 2 and all("| 2 |" in r for r in rows)
    assert rows[0].startswith("| gemv_m1_b1 | 33.6 | 2 | 32.00 | 64.0 | 1.05 |")
    assert "step: 14 kernels, 0.552 ms alone, 768.8 MB read" in t
    assert "those bytes at the copy rate (4.0 TB/s): 0.192 ms" in t
    # The costliest group first.
    assert t.splitlines()[2].startswith("| gemv_m5_b1 | 525.0 | 1 | 252.00 |")


def test_other_units_are_converted():
    ks = sp.kernels(csv_text(step(1), time_unit="usecond", byte_unit="Mbyte"))
    assert ks[0] == ("embed_gather", 5000.0, 8192e6)


def test_no_complete_step_and_no_table_are_named():
    with pytest.raises(ValueError, match="--launch-count"):
        sp.last_step(sp.kernels(csv_text(step(1)[:-1])))
    with pytest.raises(ValueError, match="no ncu table"):
        sp.kernels("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="unknown unit"):
        sp.kernels(csv_text(step(1), time_unit="cycle"))
