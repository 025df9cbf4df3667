// Greedy choice on the device, second stage: the lm_head GEMV (MODE 5) leaves one candidate
// (value, row) per block; tokens[b] = the best row, the lowest index winning a tie as
// torch.argmax does.
// With `advance`, positions[b] += 1 (the next graph replay feeds the token at the next
// position). One block per b.
extern "C" __global__ void argmax_final(const float2* __restrict__ parts, int nparts, int* __restrict__ tokens,
                                        int* __restrict__ positions, int advance) {
    __shared__ float sv[32];
    __shared__ int si[32];
    pdl_launch_dependents();
    pdl_wait();
    const int b = blockIdx.x;
    float best = -INF_F;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
        const float2 p = parts[(size_t)b * nparts + i];
        const int pi = __float_as_int(p.y);
        if (p.x > best || (p.x == best && pi < idx)) { best = p.x; idx = pi; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) { sv[warp] = best; si[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        best = lane < nwarps ? sv[lane] : -INF_F;
        idx = lane < nwarps ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) {
            tokens[b] = idx == 0x7fffffff ? 0 : idx;
            if (advance) positions[b] += 1;
        }
    }
}
