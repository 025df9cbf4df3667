// RMSNorm as transformers computes it, in f32: out = w * (x * rsqrt(mean(x^2) + eps)).
// One block per row. Writes f32 (decode GEMV input) and/or bf16 (prefill GEMM input).
// A row's values are loaded once, 16 bytes a load, all of a thread's loads in flight together
// and kept in registers for the second pass: a loop of single loads summed as they came was a
// chain of dependent loads (13 us a norm at batch 32 on the 8B, 63 of them a step; session 17).
#define RMSNORM_VEC 8  // float4s a thread holds (256 threads: rows up to 8,192 wide)
extern "C" __global__ void rmsnorm(const float* __restrict__ x, const bf16* __restrict__ w, float eps,
                                   int hidden, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const size_t row = blockIdx.x;
    const float* xr = x + row * hidden;
    if (hidden % 4 != 0 || hidden > RMSNORM_VEC * 4 * (int)blockDim.x) {
        float ss = 0.0f;
        for (int d = threadIdx.x; d < hidden; d += blockDim.x) ss += xr[d] * xr[d];
        ss = block_sum(ss, scratch);
        const float inv = rsqrtf(ss / (float)hidden + eps);
        for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
            const float v = bf2f(w[d]) * (xr[d] * inv);
            if (out_f32) out_f32[row * hidden + d] = v;
            if (out_bf16) out_bf16[row * hidden + d] = f2bf(v);
        }
        return;
    }
    const int n4 = hidden / 4;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4 v[RMSNORM_VEC];
#pragma unroll
    for (int k = 0; k < RMSNORM_VEC; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMSNORM_VEC; k++) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)hidden + eps);
#pragma unroll
    for (int k = 0; k < RMSNORM_VEC; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= n4) break;
        const uint2 wb = reinterpret_cast<const uint2*>(w)[i];
        const float4 o = make_float4(bf_lo(wb.x) * (v[k].x * inv), bf_hi(wb.x) * (v[k].y * inv),
                                     bf_lo(wb.y) * (v[k].z * inv), bf_hi(wb.y) * (v[k].w * inv));
        if (out_f32) reinterpret_cast<float4*>(out_f32 + row * hidden)[i] = o;
        if (out_bf16) reinterpret_cast<uint2*>(out_bf16 + row * hidden)[i] = bf4(o.x, o.y, o.z, o.w);
    }
}
