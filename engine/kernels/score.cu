// Teacher forcing's score of one step (the verify request, docs/PROTOCOL.md), launched after the
// step (its graph, or prefill's last lm_head) and never inside it: for row b, from the
// bf16-rounded logits the lm_head left in `logits` [B][vocab] (gemv_m5_logits), the step's own
// greedy choice tokens[b], gap = logit(tokens[b]) - logit(forced[b]) and the largest absolute
// logit (NaN if any logit is NaN). Then tokens[b] = forced[b], so the next step feeds the forced
// token. out [B][3]: argmax (its int bits), gap, scale. One block per b.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

extern "C" __global__ void score_forced(const float* __restrict__ logits, int vocab, int* __restrict__ tokens,
                                        const int* __restrict__ forced, float* __restrict__ out) {
    __shared__ float scratch[32];
    const int b = blockIdx.x;
    const float* l = logits + (size_t)b * vocab;
    float m = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = nan_max(m, fabsf(l[i]));
    for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nwarps; w++) m = nan_max(m, scratch[w]);
        const int a = tokens[b], f = forced[b];
        out[3 * b] = __int_as_float(a);
        out[3 * b + 1] = l[a] - l[f];
        out[3 * b + 2] = m;
        tokens[b] = f;
    }
}
