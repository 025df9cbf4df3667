// Greedy choice on the device: tokens[row] = argmax(logits[row]), the lowest index winning a
// tie as torch.argmax does. With `advance`, positions[row] += 1, so that the next replay of a
// decode graph feeds the chosen token at the next position with no host involvement.
extern "C" __global__ void argmax(const float* __restrict__ logits, int vocab, int* __restrict__ tokens,
                                  int* __restrict__ positions, int advance) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int row = blockIdx.x;
    const float* lr = logits + (size_t)row * vocab;
    float best = -INF_F;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = lr[i];
        if (v > best) { best = v; idx = i; }  // strided ascending: the first max seen is the lowest
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
            tokens[row] = idx == 0x7fffffff ? 0 : idx;
            if (advance) positions[row] += 1;
        }
    }
}
