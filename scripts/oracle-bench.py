#!/usr/bin/env python3
"""The oracle leg's speed on the prompts `engine bench` uses, through the leg protocol.

    python3 scripts/oracle-bench.py --model DIR [--label L] [--tokens-out F] -- [oracle serve options]

Starts `python3 -m oracle serve --backend vllm --model DIR OPTIONS`, then measures exactly what
`engine bench` measures, on the same synthetic prompts (the same seeded generator, so both
legs see identical token ids): per output token at batch 1 by the protocol's recipe
((elapsed(32) - elapsed(1)) / 31 per prompt, warm repeats), elapsed of max_tokens=1 on a
512-token prompt, batch-8 throughput over 128 new tokens, and load_s. Prints one JSON object.
--tokens-out writes the batch-1 max_tokens=32 tokens per prompt (for comparing with
`engine generate --prompts` on the same prompts file, written with --prompts-out).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

A, C, M = 6364136223846793005, 1442695040888963407, (1 << 64) - 1


def synthetic_prompt(n, vocab, seed):
    """Mirror of engine::bench::synthetic_prompt."""
    s = (seed * A + C) & M
    out = []
    for _ in range(n):
        s = (s * A + C) & M
        out.append((s >> 33) % vocab)
    return out


class Leg:
    def __init__(self, argv, env, log):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  env=env, text=True)

    def recv(self):
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"the leg exited ({self.p.wait()}) without answering")
        return json.loads(line)

    def generate(self, rid, prompts, max_tokens, batch):
        msg = {"type": "generate", "id": rid, "prompts": prompts, "max_tokens": max_tokens,
               "ignore_eos": True, "batch": batch}
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()
        res = {}
        while True:
            ev = self.recv()
            if ev["type"] == "error":
                raise SystemExit(f"error event: {ev}")
            if ev["type"] == "done":
                return [res[i] for i in range(len(prompts))], ev
            res[ev["index"]] = ev

    def close(self):
        self.p.stdin.write('{"type":"shutdown"}\n')
        self.p.stdin.flush()
        return self.p.wait(timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default="vllm")
    ap.add_argument("--prompt-lens", default="16,64,256,1000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens-out")
    ap.add_argument("--prompts-out")
    ap.add_argument("--log", default=os.devnull)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    lens = [int(x) for x in a.prompt_lens.split(",")]
    seed = 7
    prompts = [synthetic_prompt(n, vocab, seed + i) for i, n in enumerate(lens)]
    if a.prompts_out:
        with open(a.prompts_out, "w") as f:
            json.dump({"schema": 1, "prompts": [{"id": f"len{n}", "tokens": p} for n, p in zip(lens, prompts)]}, f)
    argv = [sys.executable, "-m", "oracle", "serve", "--backend", "vllm", "--model", a.model, *a.serve_args]
    started = time.time()
    leg = Leg(argv, os.environ.copy(), open(a.log, "w"))
    ready = leg.recv()
    if ready["type"] != "ready":
        raise SystemExit(f"no ready: {ready}")
    leg.generate("warm", prompts, 32, 1)
    per = []
    tokens = None
    for r in range(a.repeat):
        one, _ = leg.generate(f"one{r}", prompts, 1, 1)
        n, _ = leg.generate(f"n{r}", prompts, 32, 1)
        tokens = [x["tokens"] for x in n]
        per += [(y["elapsed_s"] - x["elapsed_s"]) / 31 for x, y in zip(one, n)]
    ttft_prompt = synthetic_prompt(512, vocab, seed + 1000)
    leg.generate("tw", [ttft_prompt], 1, 1)
    ttft = [leg.generate(f"t{r}", [ttft_prompt], 1, 1)[0][0]["elapsed_s"] for r in range(a.repeat)]
    bprompts = [synthetic_prompt(lens[i % len(lens)], vocab, seed + 2000 + i) for i in range(8)]
    leg.generate("bw", bprompts, 128, 8)
    tps = []
    for r in range(a.repeat):
        res, done = leg.generate(f"b{r}", bprompts, 128, 8)
        tps.append(sum(len(x["tokens"]) for x in res) / done["wall_s"])
    rc = leg.close()
    out = {
        "label": a.label,
        "per_output_token_s": statistics.median(per),
        "per_output_token_by_len_s": {str(n): statistics.median(per[i::len(lens)]) for i, n in enumerate(lens)},
        "ttft_s": statistics.median(ttft),
        "batch_throughput_tok_s": statistics.median(tps),
        "load_s": ready.get("load_s"),
        "kv": ready.get("kv"),
        "features": ready.get("features"),
        "resolved": ready.get("resolved"),
        "versions": ready.get("versions"),
        "exit": rc,
        "total_s": time.time() - started,
    }
    if a.tokens_out:
        with open(a.tokens_out, "w") as f:
            json.dump({"prompt_lens": lens, "tokens": tokens}, f)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
