"""Triton autotuning pins (oracle/kernel_pins.py) through Triton's own cache-manager hook, without
a GPU: what Triton's Autotuner.check_disk_cache does with its cache manager (get_file, then put
after timing) is done here by hand."""

from __future__ import annotations

import json
import os

import pytest

from oracle import kernel_pins

triton = pytest.importorskip("triton")

KEY = "ABCDEFGHIJKLMNOP"  # a cache key as Triton passes it (base32 of a sha256)
FILE = "_chunk_scan_fwd_kernel.autotune.json"
FAST = {"key": [256, 64, 128, True], "configs_timings": [[{"kwargs": {"BLOCK_SIZE_M": 64}}, [0.011]],
                                                        [{"kwargs": {"BLOCK_SIZE_M": 32}}, [0.010]]]}


@pytest.fixture
def triton_env(tmp_path, monkeypatch):
    for var in (kernel_pins.MANAGER_ENV, kernel_pins.PINS_ENV, kernel_pins.LOG_ENV, "TRITON_CACHE_AUTOTUNING"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    kernel_pins._PINS.clear()
    yield tmp_path
    kernel_pins._PINS.clear()


def manager():
    """The cache manager Triton's autotuner would get for KEY, as triton.runtime.cache does."""
    from triton import knobs

    cls = knobs.cache.manager_class
    assert cls is not None, "TRITON_CACHE_MANAGER did not reach Triton"
    return cls(KEY)


def write_pins(path, entries):
    path.write_text(kernel_pins.pins_document({k: json.dumps(v) for k, v in entries.items()}, {"triton": "3.6.0"}))


def test_a_kernel_tuned_afresh_is_logged_and_becomes_the_pins_file(triton_env):
    log = triton_env / "log.jsonl"
    kernel_pins.install(str(triton_env / "pins.json"), str(log))
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
    m = manager()
    assert m.get_file(FILE) is None  # no pin, nothing cached: Triton times the configs
    m.put(json.dumps(FAST), FILE, binary=False)
    pinned, tuned = kernel_pins.read_log(log)
    assert pinned == {} and list(tuned) == [f"{KEY}/{FILE}"]
    # The capture's pins file round-trips to the same entries.
    (triton_env / "pins.json").write_text(kernel_pins.pins_document(tuned, {"triton": "3.6.0"}))
    assert {k: json.loads(v) for k, v in kernel_pins.load_pins(triton_env / "pins.json").items()} == \
        {f"{KEY}/{FILE}": FAST}
    assert kernel_pins.summary(str(triton_env / "pins.json"), str(log))["tuned"] == ["_chunk_scan_fwd_kernel"]


def test_a_pin_is_served_over_what_the_cache_held(triton_env):
    pins = triton_env / "pins.json"
    write_pins(pins, {f"{KEY}/{FILE}": FAST})
    log = triton_env / "log.jsonl"
    kernel_pins.install(str(pins), str(log))
    m = manager()
    # An earlier process on this machine tuned it otherwise: the pin wins.
    stale = {"key": FAST["key"], "configs_timings": [[{"kwargs": {"BLOCK_SIZE_M": 64}}, [0.001]]]}
    m.put(json.dumps(stale), FILE, binary=False)
    kernel_pins._PINS.clear()
    log.unlink()
    path = m.get_file(FILE)
    assert json.loads(open(path).read()) == FAST
    pinned, tuned = kernel_pins.read_log(log)
    assert list(pinned) == [f"{KEY}/{FILE}"] and tuned == {}
    s = kernel_pins.summary(str(pins), str(log))
    assert s["pinned"] == ["_chunk_scan_fwd_kernel"] and s["tuned"] == [] and len(s["pins_sha256"]) == 64
    # Other cache traffic (compiled kernels) is Triton's own.
    assert m.get_file("kernel.cubin") is None


def test_a_pin_of_another_key_is_not_served(triton_env):
    pins = triton_env / "pins.json"
    write_pins(pins, {f"ZZZZ/{FILE}": FAST})  # tuned under another Triton, GPU or kernel source
    kernel_pins.install(str(pins), str(triton_env / "log.jsonl"))
    assert manager().get_file(FILE) is None


@pytest.mark.parametrize("text,needle", [
    ("{", "is not JSON"),
    ('{"schema": 2, "entries": {}}', "schema-1"),
    ('{"schema": 1, "entries": {"x.json": {}}}', "<cache key>/<kernel>.autotune.json"),
])
def test_a_broken_pins_file_fails_the_load_and_names_the_fix(triton_env, text, needle):
    pins = triton_env / "pins.json"
    pins.write_text(text)
    with pytest.raises(kernel_pins.PinsError) as e:
        kernel_pins.install(str(pins), str(triton_env / "log.jsonl"))
    assert needle in str(e.value) and str(pins) in str(e.value) and "capture the unit's golden again" in str(e.value)


def test_a_cache_manager_of_the_callers_own_is_not_overridden(triton_env, monkeypatch):
    monkeypatch.setenv(kernel_pins.MANAGER_ENV, "mine:Cache")
    with pytest.raises(kernel_pins.PinsError, match="TRITON_CACHE_MANAGER=mine:Cache"):
        kernel_pins.install(None, str(triton_env / "log.jsonl"))
    assert os.environ[kernel_pins.MANAGER_ENV] == "mine:Cache"


def test_a_log_cut_mid_line_reads_as_its_whole_lines(triton_env):
    log = triton_env / "log.jsonl"
    log.write_text(json.dumps({"event": "tuned", "entry": f"{KEY}/{FILE}", "data": "{}"}) + '\n{"event": "tun')
    assert list(kernel_pins.read_log(log)[1]) == [f"{KEY}/{FILE}"]
    assert kernel_pins.read_log(triton_env / "missing.jsonl") == ({}, {})
