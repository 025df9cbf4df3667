// Prefill SwiGLU: gu is the [rows][2*inter] f32 output of the stacked gate/up GEMM (gate in the
// first half of each row); out = bf16(silu(gate) * up), the down GEMM's input.
extern "C" __global__ void swiglu(const float* __restrict__ gu, bf16* __restrict__ out, int inter) {
    pdl_launch_dependents();
    pdl_wait();
    const size_t row = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const float g = gu[row * 2 * inter + j], u = gu[row * 2 * inter + inter + j];
    out[row * inter + j] = f2bf(g / (1.0f + expf(-g)) * u);
}
