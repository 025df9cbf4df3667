# vLLM 0.26.0 and the Nemotron-H hybrid: is its output for a 1-token prompt the state of whatever ran
# before? Runs on the GPU box (PYTHONPATH=/tmp/site:$PWD, VLLM_ENABLE_V1_MULTIPROCESSING=0), one LLM,
# tiny-trained-h's prompts, each generate call alone (batch 1), compared with the f32 golden.
#   python3 scripts/vllm-one-token-probe.py
import json
from vllm import LLM, SamplingParams
U = "goldens/tiny-trained-h"
P = [p["tokens"] for p in json.load(open(f"{U}/prompts.json"))["prompts"]]
F = [o["tokens"] for o in json.load(open(f"{U}/golden.json"))["outputs"]]
llm = LLM(model=f"{U}/model", dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=1024,
          max_num_seqs=8, seed=0, skip_tokenizer_init=True)
sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
def gen(toks):
    out = llm.generate([{"prompt_token_ids": toks}], sp, use_tqdm=False)
    return list(out[0].outputs[0].token_ids)
def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
runs = [("p0 first", P[0]), ("p0 again", P[0]), ("p1", P[1]), ("p0 after p1", P[0]),
        ("p0 token twice", P[0] * 2), ("p2 prefix + p0", P[2][:5] + P[0]), ("p0 last", P[0])]
for name, toks in runs:
    got = gen(toks)
    ref = F[0] if toks == P[0] else (F[1] if toks == P[1] else None)
    print(name, "len", len(toks), "tokens", got[:8], "first diff vs f32 golden",
          first_diff(got, ref) if ref else "-", flush=True)
print("f32 golden p0", F[0][:8])
