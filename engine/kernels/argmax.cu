// Greedy choice on the device, the lowest index winning a tie as torch.argmax does. With
// `advance`, positions[b] += 1 (the next graph replay feeds the token at the next position).
// One block per b.

// The block's best (value, index) into thread 0's `best`/`idx`: larger values win, the lower
// index among equals. `sv`/`si` hold 32 entries.
__device__ __forceinline__ void block_argmax(float& best, int& idx, float* sv, int* si) {
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
    }
}

// Thread 0 of block b, after block_argmax: the token, and the position moved on.
__device__ __forceinline__ void store_token(int* tokens, int* positions, int advance, int idx) {
    if (threadIdx.x == 0) {
        tokens[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
        if (advance) positions[blockIdx.x] += 1;
    }
}

// Second stage after the lm_head GEMV (MODE 5), which leaves one candidate (value, row) per
// block: tokens[b] = the best row.
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
    block_argmax(best, idx, sv, si);
    store_token(tokens, positions, advance, idx);
}

// After the cuBLAS path's lm_head GEMM (cuda/step.rs): row b of `logits` [B][vocab] is rounded to
// bf16 in place, as a bf16 lm_head's output is (vLLM's and transformers'; the GEMV lm_head
// rounds the same way), so that the verify request's score_forced reads the values compared
// here. Block (b, p) of a (B, P) grid takes the p-th of P slices of row b and leaves its best
// (value, index) in parts[b][p], which argmax_final then reduces as it does the GEMV lm_head's:
// one block a row left the row's 0.5 MB (a 128k vocabulary) to one multiprocessor, 57 us at
// batch 8 on the H200 (session 20).
extern "C" __global__ void argmax_rows(float* __restrict__ logits, int vocab, float2* __restrict__ parts) {
    __shared__ float sv[32];
    __shared__ int si[32];
    pdl_launch_dependents();
    pdl_wait();
    const int b = blockIdx.x, p = blockIdx.y, np = gridDim.y;
    const int slice = (vocab + np - 1) / np, end = min(vocab, (p + 1) * slice);
    float* l = logits + (size_t)b * vocab;
    float best = -INF_F;
    int idx = 0x7fffffff;
    // Ascending indices per thread: a strictly larger value wins, so the lowest stays on ties.
    for (int i = p * slice + threadIdx.x; i < end; i += blockDim.x) {
        const float v = bf2f(f2bf(l[i]));
        l[i] = v;
        if (v > best || idx == 0x7fffffff) { best = v; idx = i; }
    }
    block_argmax(best, idx, sv, si);
    if (threadIdx.x == 0) parts[(size_t)b * np + p] = make_float2(best, __int_as_float(idx));
}
