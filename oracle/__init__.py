"""The oracle leg: vLLM (pinned) or the transformers reference behind docs/PROTOCOL.md.

This module is imported first by `python -m oracle`, so the clock for `ready.load_s` starts
here, before any heavy import.
"""

import time as _time

# Process-start clock for ready.load_s: perf_counter now, plus how long the process had
# already lived before this line (interpreter start-up), read from /proc where available.
T0 = _time.perf_counter()


def _lived_before_t0() -> float:
    try:
        import os

        with open("/proc/self/stat") as f:
            # field 22 (starttime, clock ticks since boot); split after the ")" of comm
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        lived = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return lived if 0.0 <= lived < 60.0 else 0.0
    except (OSError, ValueError, IndexError):
        return 0.0


PRE_T0_S = _lived_before_t0()


def seconds_since_start() -> float:
    """Seconds from process start to now (the `ready.load_s` figure)."""
    return PRE_T0_S + (_time.perf_counter() - T0)


__version__ = "0.1.0"
