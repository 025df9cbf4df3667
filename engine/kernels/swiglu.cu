// Prefill SwiGLU: gu is the [rows][2*inter] bf16 output of the stacked gate/up GEMM (gate in the
// first half of each row; bf16 as vLLM's GEMM writes it, half the bytes of f32 to write and read
// again); out = bf16(silu(gate) * up), the down GEMM's input, computed in f32.
//
// Four values a thread: one 8-byte load of each half and one 8-byte store where inter is a
// multiple of four (every half-row then starts 8-byte aligned), one at a time otherwise; the
// same expression per value either way. A value a thread left the kernel bandwidth-bound on
// block scheduling (2 TB/s on the H200 at 3,400 rows of the 8B, session 20).
__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

extern "C" __global__ void swiglu(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter) {
    pdl_launch_dependents();
    pdl_wait();
    const size_t row = blockIdx.y;
    const int j0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (j0 >= inter) return;
    const bf16* g = gu + row * 2 * inter;
    const bf16* u = g + inter;
    bf16* o = out + row * inter;
    if ((inter & 3) == 0) {
        const uint2 g4 = *reinterpret_cast<const uint2*>(g + j0);
        const uint2 u4 = *reinterpret_cast<const uint2*>(u + j0);
        *reinterpret_cast<uint2*>(o + j0) =
            bf4(swiglu_f(bf_lo(g4.x), bf_lo(u4.x)), swiglu_f(bf_hi(g4.x), bf_hi(u4.x)),
                swiglu_f(bf_lo(g4.y), bf_lo(u4.y)), swiglu_f(bf_hi(g4.y), bf_hi(u4.y)));
    } else {
        for (int j = j0; j < min(j0 + 4, inter); j++) o[j] = f2bf(swiglu_f(bf2f(g[j]), bf2f(u[j])));
    }
}
