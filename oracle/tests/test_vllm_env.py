"""What the vLLM backend makes of the orchestrator's lease, without vLLM or a GPU."""

from oracle.backends.vllm_backend import LEASED_GPU_ENV, recorded_env, visible_gpu


def test_the_leased_gpu_is_made_the_visible_one():
    # In a run: the lease decides, over an inherited CUDA_VISIBLE_DEVICES and a --device index.
    assert visible_gpu("cuda", {LEASED_GPU_ENV: "3"}) == "3"
    assert visible_gpu("cuda:1", {LEASED_GPU_ENV: "3", "CUDA_VISIBLE_DEVICES": "0"}) == "3"
    # By hand: --device cuda:N, unless the caller chose the visible devices already.
    assert visible_gpu("cuda:1", {}) == "1"
    assert visible_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "2"}) is None
    assert visible_gpu("cuda", {}) is None


def test_inductors_deterministic_mode_is_recorded_only_where_set():
    plain = recorded_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert plain["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and plain["CUDA_VISIBLE_DEVICES"] is None
    # Unset, it is absent, so a golden captured before it was recorded still compares equal.
    assert "TORCHINDUCTOR_DETERMINISTIC" not in plain
    flagged = recorded_env({"TORCHINDUCTOR_DETERMINISTIC": "1"})
    assert flagged["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    assert {k: v for k, v in flagged.items() if k != "TORCHINDUCTOR_DETERMINISTIC"} == recorded_env({})
