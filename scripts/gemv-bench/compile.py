#!/usr/bin/env python3
"""Compiles the engine's kernels + variants.cu to one cubin with NVRTC, as the engine does:
   compile.py OUT.cubin [ARCH (default sm_90)]. Needs libnvrtc.so.13 (CUDA 13) on the loader path."""
import ctypes, pathlib, sys

root = pathlib.Path(__file__).resolve().parents[2]
# The engine's own program (engine/src/cuda/kernels.rs SOURCES, in its order), then the variants.
kernels = root / "engine/kernels"
parts = [kernels / n for n in ("common.cuh", "embed.cu", "rmsnorm.cu", "gemv.cu", "rope_kv.cu",
                               "attention.cu", "attention_prefill.cu", "attention_batch.cu", "swiglu.cu", "argmax.cu")]
parts.append(pathlib.Path(__file__).with_name("variants.cu"))
src = "".join(f'#line 1 "{p.name}"\n{p.read_text()}\n' for p in parts).encode()
arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
nv = ctypes.CDLL("libnvrtc.so.13")
prog = ctypes.c_void_p()
assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"gemv_bench.cu", 0, None, None) == 0
# The constants the kernels share with the engine's plan.rs (KERNEL_DEFINES), as the engine passes
# them; engine/src/cuda/kernels.rs's tests check that this list matches.
defines = ["-DGEMV_WARPS=8", "-DGEMV_MMA_U=4", "-DATT_WARPS=4", "-DATT_MAXG=8", "-DATT_SPLIT_MIN=16",
           "-DATT_MAX_SPLITS=32", "-DATT_PF_WARPS=4", "-DATT_PF_POS=64", "-DATT_BATCH_SPLIT=256",
           "-DMAX_HEAD_DIM=128", "-DMAMBA_MAX_WINDOW=7", "-DMAMBA_SSM_PER=32",
           "-DMAMBA_SCAN_CH=2", "-DMAMBA_SSD_ROWS=32", "-DMAMBA_SSD_HD=64", "-DMAMBA_SSD_N=128"]
opts = [f"--gpu-architecture={arch}", "--std=c++17", "--prec-div=true", "--prec-sqrt=true",
        "--fmad=true", *defines, "-Xptxas=-v"]
arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
size = ctypes.c_size_t()
nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
nv.nvrtcGetProgramLog(prog, log)
if rc != 0:
    sys.exit(f"NVRTC failed ({rc}):\n{log.value.decode()}")
pathlib.Path(sys.argv[1] + ".log").write_text(log.value.decode())
nv.nvrtcGetCUBINSize(prog, ctypes.byref(size))
buf = ctypes.create_string_buffer(size.value)
assert nv.nvrtcGetCUBIN(prog, buf) == 0
pathlib.Path(sys.argv[1]).write_bytes(buf.raw)
print(f"{sys.argv[1]}: {size.value} bytes")
