// Prefill SwiGLU: gu is the [rows][2*inter] f32 output of the stacked gate/up GEMM (gate in the
// first half of each row); out = bf16(silu(gate) * up), the down GEMM's input.
//
// Four values a thread: one 16-byte load of each half and one 8-byte store where inter is a
// multiple of four (every half-row then starts 16-byte aligned), one at a time otherwise; the
// same expression per value either way. A value a thread left the kernel bandwidth-bound on
// block scheduling (2 TB/s on the H200 at 3,400 rows of the 8B, session 20).
__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

extern "C" __global__ void swiglu(const float* __restrict__ gu, bf16* __restrict__ out, int inter) {
    pdl_launch_dependents();
    pdl_wait();
    const size_t row = blockIdx.y;
    const int j0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (j0 >= inter) return;
    const float* g = gu + row * 2 * inter;
    const float* u = g + inter;
    bf16* o = out + row * inter;
    if ((inter & 3) == 0) {
        const float4 g4 = *reinterpret_cast<const float4*>(g + j0);
        const float4 u4 = *reinterpret_cast<const float4*>(u + j0);
        *reinterpret_cast<uint2*>(o + j0) =
            bf4(swiglu_f(g4.x, u4.x), swiglu_f(g4.y, u4.y), swiglu_f(g4.z, u4.z), swiglu_f(g4.w, u4.w));
    } else {
        for (int j = j0; j < min(j0 + 4, inter); j++) o[j] = f2bf(swiglu_f(g[j], u[j]));
    }
}
