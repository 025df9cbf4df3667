// Embedding gather: x[row] = widen(table[tokens[row]]).
extern "C" __global__ void embed_gather(const bf16* __restrict__ table, const int* __restrict__ tokens,
                                        float* __restrict__ x, int hidden) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x;
    const bf16* src = table + (size_t)tokens[row] * hidden;
    float* dst = x + (size_t)row * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) dst[d] = bf2f(src[d]);
}
