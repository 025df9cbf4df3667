#!/usr/bin/env python3
"""A fake leg for the orchestrator's fault tests (stdlib only).

It speaks docs/PROTOCOL.md well enough to be benchmarked, and misbehaves on request. Its own
options come first as --name=value; every other argument (the engine's or the oracle's argv) is
accepted and mostly ignored:
  --fault=none|crash-load|hang-generate|malformed|wrong-tokens|straggler|error-event|check-fail
         |nan-verify|no-verify
         |check-slow (the check sleeps 60 s)|sigstop-later (stops itself with SIGSTOP at its
         4th request, once its pace is known)|fuzz-events (each event it sends is mutated
         with probability 1/4, from --seed=N: tests/hostile's protocol fuzzing)
         |sigint-after-exit (at shutdown, leaves a helper that sends SIGINT to the
         orchestrator as soon as this leg has exited: an interrupt after the legs)
  --ignore-term        ignore SIGTERM (so the watchdog must escalate to SIGKILL)
  --kv=B,N | --kv=none a pool of N blocks of B tokens, or no pool
  --resizable          honour --num-blocks / --num-gpu-blocks-override (the option its ready.kv
                       names in resize_option, as vLLM's does)
  --no-resize-option   a pool whose ready.kv names no resize_option
  --backend=NAME       features.backend (default cpu)
  --degraded=A,B       features.degraded
  --dtype=NAME         features.dtype (default float32)
  --gap=X              verify: the gap reported where the leg's choice differs (default 1.0)
  --scale=X|none       verify: every position's scale (default 3.0; none: null, as vLLM)
`verify` (teacher forcing) answers with the fake's own tokens as argmax (gap 0 where they are
the forced ones); under wrong-tokens, prompt 0's position 5 takes forced + 1 with gap --gap;
under nan-verify its gap there is null (NaN logits); under no-verify every verify request is
refused as malformed (a leg that predates verify).
`... check ...` (as in `python -m oracle check`) prints an ok line and exits 0.

Tokens are a pure function of the prompt, shared with tests/faults.rs: token(p, i) =
(sum(p) * 7 + i * 3) % 500 + 10.
"""
import json
import os
import signal
import subprocess
import sys
import time

T0 = time.perf_counter()


def token(prompt, i):
    return (sum(prompt) * 7 + i * 3) % 500 + 10


def main():
    own = {}
    rest = []
    for a in sys.argv[1:]:
        if a.startswith("--") and "=" in a and a.split("=")[0][2:] in (
            "fault", "kv", "backend", "degraded", "dtype", "gap", "scale", "seed"):
            k, v = a[2:].split("=", 1)
            own[k] = v
        elif a in ("--ignore-term", "--resizable", "--no-resize-option"):
            own[a[2:]] = True
        else:
            rest.append(a)
    if "check" in rest:
        if own.get("fault") == "check-slow":
            print("checking slowly...", file=sys.stderr, flush=True)
            time.sleep(60)
        if own.get("fault") == "check-fail":
            print("ok   python: 3.11")
            print("FAIL vllm: cannot import vllm (No module named 'vllm'); install oracle/requirements-vllm.txt")
            return 1
        print("ok   fake oracle check")
        return 0
    fault = own.get("fault", "none")
    if fault == "fuzz-events":
        import random
        global FUZZ
        FUZZ = random.Random(int(own.get("seed", "0")))
    if own.get("ignore-term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def flag(name):
        return int(rest[rest.index(name) + 1]) if name in rest else None

    kv = None
    if own.get("kv", "16,64") != "none":
        b, n = (int(x) for x in own.get("kv", "16,64").split(","))
        if own.get("resizable"):
            n = flag("--num-blocks") or flag("--num-gpu-blocks-override") or n
        kv = {"block_size": b, "num_blocks": n, "capacity_tokens": b * n, "bytes": b * n * 64}
        if not own.get("no-resize-option"):
            kv["resize_option"] = "num_gpu_blocks_override"
    print(f"fake leg pid {os.getpid()} starting:", " ".join(sys.argv[1:]), file=sys.stderr, flush=True)
    if fault == "crash-load":
        print("loading weights... boom: fake crash at load", file=sys.stderr, flush=True)
        return 3
    pids = [os.getpid()]
    if fault == "straggler":
        # Left running on purpose: the orchestrator must find, name and kill it.
        child = subprocess.Popen(["sleep", "300"])
        pids.append(child.pid)
    degraded = [d for d in own.get("degraded", "").split(",") if d]
    features = {"backend": own.get("backend", "cpu"), "dtype": own.get("dtype", "float32"), "device": "cpu",
                "cuda_graphs": False, "kernels": [], "degraded": degraded}
    if kv is None:
        features["kv"] = "none: fake leg without a pool"
    send({"type": "ready", "load_s": time.perf_counter() - T0, "kv": kv, "features": features,
          "versions": {"fake": "1"}, "resolved": {"fake": True}, "pid": os.getpid(), "pids": pids})
    served = 0
    for line in sys.stdin:
        req = json.loads(line)
        if req["type"] == "shutdown":
            if fault == "sigint-after-exit":
                interrupt_parent_after_exit()
            break
        served += 1
        if fault == "sigstop-later" and served == 4:
            print("stopping myself (SIGSTOP) on purpose", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if fault == "hang-generate":
            print("generating... (hanging on purpose)", file=sys.stderr, flush=True)
            while True:
                time.sleep(1)
        if fault == "malformed":
            print("this is not a protocol line", flush=True)
            continue
        if req["type"] == "verify":
            if fault == "no-verify":
                send({"type": "error", "id": req["id"], "code": "malformed_request",
                      "message": "unknown request type \"verify\" (expected \"generate\" or \"shutdown\")",
                      "fatal": False})
                continue
            verify(req, fault, float(own.get("gap", "1.0")), own.get("scale", "3.0"))
            continue
        if fault == "error-event":
            send({"type": "error", "id": req["id"], "code": "internal",
                  "message": "fake failure in generate", "fatal": True})
            return 1
        start = time.perf_counter()
        total = 0
        for idx, p in enumerate(req["prompts"]):
            t = time.perf_counter()
            toks = [token(p, i) for i in range(req["max_tokens"])]
            if fault == "wrong-tokens" and idx == 0 and len(toks) > 5:
                toks[5] += 1
            time.sleep(0.0005 * len(toks))
            now = time.perf_counter()
            origin = t if req["batch"] == 1 else start
            total += len(toks)
            send({"type": "result", "id": req["id"], "index": idx, "tokens": toks,
                  "elapsed_s": now - origin, "ttft_s": (now - origin) / len(toks)})
        send({"type": "done", "id": req["id"], "wall_s": time.perf_counter() - start, "tokens": total})
    return 0


def verify(req, fault, gap, scale):
    start = time.perf_counter()
    for idx, (p, forced) in enumerate(zip(req["prompts"], req["forced"])):
        argmax = [token(p, j) for j in range(len(forced))]
        gaps = [0.0 if a == f else gap for a, f in zip(argmax, forced)]
        if idx == 0 and len(forced) > 5 and fault in ("wrong-tokens", "nan-verify"):
            argmax[5] = forced[5] + 1
            gaps[5] = gap if fault == "wrong-tokens" else None
        scales = None if scale == "none" else [float(scale)] * len(forced)
        send({"type": "verified", "id": req["id"], "index": idx, "argmax": argmax, "gap": gaps,
              "scale": scales, "path": "decode"})
    send({"type": "done", "id": req["id"], "wall_s": time.perf_counter() - start,
          "tokens": sum(len(f) for f in req["forced"])})


LATE = "sigint-after-exit: the orchestrator had exited before the signal"


def interrupt_parent_after_exit():
    """A helper out of this leg's process group (so not reaped as a straggler) that waits for
    this process to be gone, sends SIGINT to the orchestrator, and exits. On a loaded machine it
    may get the CPU only after the orchestrator has finished: then it says so on the leg's
    stderr (LATE), so a test can tell that run from one that ignored the signal."""
    me, parent = os.getpid(), os.getppid()

    def state(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return "X"

    if os.fork() == 0:
        os.setsid()
        while state(me) not in "ZX":
            time.sleep(0.0005)
        # An orchestrator that has exited but is not yet reaped (a zombie) takes the signal
        # without a word: that is late too, not an ignored signal.
        if state(parent) in "ZX":
            print(LATE, file=sys.stderr, flush=True)
            os._exit(0)
        try:
            os.kill(parent, signal.SIGINT)
        except ProcessLookupError:
            print(LATE, file=sys.stderr, flush=True)
        os._exit(0)


FUZZ = None  # a random.Random when --fault=fuzz-events


def mutate(obj, rng):
    """One hostile change to an event, as bytes: a field dropped, retyped, made huge or
    negative, an unknown field, the type changed, garbage, a truncated or non-UTF-8 line."""
    obj = dict(obj)
    keys = [k for k in obj if k != "type"]
    k = rng.choice(keys) if keys else "type"
    nasty = [None, -1, 2**64, -2**63, 1e308, "x", "", [], {}, [[1]], True, "\u0000", "é" * 50]
    r = rng.randrange(10)
    if r == 0:
        obj.pop(k, None)
    elif r == 1:
        obj[k] = rng.choice(nasty)
    elif r == 2:
        obj["unexpected_" + str(rng.randrange(100))] = 1
    elif r == 3:
        obj["type"] = rng.choice(["ready", "result", "done", "error", "verified", "progress", 7, None])
    elif r == 4:
        return b"not json at all\n"
    elif r == 5:
        return json.dumps(obj).encode()[: rng.randrange(1, 40)] + b"\n"
    elif r == 6:
        return b"\xff\xfe" + json.dumps(obj).encode() + b"\n"
    elif r == 7:
        return (json.dumps([obj]) + "\n").encode()
    elif r == 8:
        return (json.dumps(obj) + "\n").encode() * 2
    else:
        obj[k] = [obj.get(k)] * rng.randrange(0, 3)
    return (json.dumps(obj) + "\n").encode()


def send(obj):
    if FUZZ is not None and FUZZ.randrange(4) == 0:
        sys.stdout.buffer.write(mutate(obj, FUZZ))
        sys.stdout.buffer.flush()
        return
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
