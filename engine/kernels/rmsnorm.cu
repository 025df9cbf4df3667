// RMSNorm as transformers computes it, in f32: out = w * (x * rsqrt(mean(x^2) + eps)).
// One block per row. Writes f32 (decode GEMV input) and/or bf16 (prefill GEMM input).
extern "C" __global__ void rmsnorm(const float* __restrict__ x, const bf16* __restrict__ w, float eps,
                                   int hidden, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const size_t row = blockIdx.x;
    const float* xr = x + row * hidden;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) ss += xr[d] * xr[d];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)hidden + eps);
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
        const float v = bf2f(w[d]) * (xr[d] * inv);
        if (out_f32) out_f32[row * hidden + d] = v;
        if (out_bf16) out_bf16[row * hidden + d] = f2bf(v);
    }
}
