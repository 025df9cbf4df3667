// Decode GEMV: y[b][r] = W[r] . x[b] for B rows of activations, bf16 weights streamed once with
// 16-byte loads, f32 activations and accumulation. One warp per output row; the weights are read
// exactly once per step whatever B is, which is what makes batch-N decode cheap.
//
// MODE 0: y = W x          (store)
// MODE 1: y += W x         (residual add: o_proj and down_proj write into the residual stream)
// MODE 2: y[j] = silu(W[j] x) * (W[rows + j] x)   (gate and up stacked in one matrix: SwiGLU)
//
// Requires cols % 8 == 0 and 16-byte-aligned rows (checked on the host).

__device__ __forceinline__ void fma8(float& acc, uint4 w, float4 a, float4 b) {
    acc = fmaf(bf_lo(w.x), a.x, acc);
    acc = fmaf(bf_hi(w.x), a.y, acc);
    acc = fmaf(bf_lo(w.y), a.z, acc);
    acc = fmaf(bf_hi(w.y), a.w, acc);
    acc = fmaf(bf_lo(w.z), b.x, acc);
    acc = fmaf(bf_hi(w.z), b.y, acc);
    acc = fmaf(bf_lo(w.w), b.z, acc);
    acc = fmaf(bf_hi(w.w), b.w, acc);
}

// Weights are used once per step: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int B, int NW>
__device__ __forceinline__ void dot_rows(const bf16* __restrict__ const* wrows, const float* __restrict__ x,
                                         int cols, int ldx, float (&acc)[NW][B]) {
    const int lane = threadIdx.x & 31;
    const int n8 = cols >> 3;
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int b = 0; b < B; b++) acc[r][b] = 0.0f;
    const uint4* w[NW];
#pragma unroll
    for (int r = 0; r < NW; r++) w[r] = reinterpret_cast<const uint4*>(wrows[r]);
    int i = lane;
    // Four 16-byte loads per row in flight per lane before any arithmetic.
    for (; i + 96 < n8; i += 128) {
        uint4 wv[NW][4];
#pragma unroll
        for (int r = 0; r < NW; r++)
#pragma unroll
            for (int u = 0; u < 4; u++) wv[r][u] = load_stream(w[r] + i + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++) {
#pragma unroll
            for (int b = 0; b < B; b++) {
                const float4* xb = reinterpret_cast<const float4*>(x + (size_t)b * ldx) + 2 * (i + 32 * u);
                const float4 a = __ldg(xb), c = __ldg(xb + 1);
#pragma unroll
                for (int r = 0; r < NW; r++) fma8(acc[r][b], wv[r][u], a, c);
            }
        }
    }
    for (; i < n8; i += 32) {
        uint4 wv[NW];
#pragma unroll
        for (int r = 0; r < NW; r++) wv[r] = load_stream(w[r] + i);
#pragma unroll
        for (int b = 0; b < B; b++) {
            const float4* xb = reinterpret_cast<const float4*>(x + (size_t)b * ldx) + 2 * i;
            const float4 a = __ldg(xb), c = __ldg(xb + 1);
#pragma unroll
            for (int r = 0; r < NW; r++) fma8(acc[r][b], wv[r], a, c);
        }
    }
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int b = 0; b < B; b++) acc[r][b] = warp_sum(acc[r][b]);
}

template <int B, int MODE>
__device__ __forceinline__ void gemv(const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                     int rows, int cols, int ldx, int ldy) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    if (MODE == 2) {
        const bf16* wr[2] = {W + (size_t)row * cols, W + (size_t)(rows + row) * cols};
        float acc[2][B];
        dot_rows<B, 2>(wr, x, cols, ldx, acc);
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < B; b++) {
                const float g = acc[0][b];
                y[(size_t)b * ldy + row] = g / (1.0f + expf(-g)) * acc[1][b];
            }
        }
    } else {
        const bf16* wr[1] = {W + (size_t)row * cols};
        float acc[1][B];
        dot_rows<B, 1>(wr, x, cols, ldx, acc);
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < B; b++) {
                if (MODE == 1) y[(size_t)b * ldy + row] += acc[0][b];
                else y[(size_t)b * ldy + row] = acc[0][b];
            }
        }
    }
}

#define GEMV_KERNEL(B, MODE)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) gemv_m##MODE##_b##B(                        \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,  \
        int cols, int ldx, int ldy) {                                                              \
        gemv<B, MODE>(W, x, y, rows, cols, ldx, ldy);                                              \
    }
#define GEMV_MODES(B) GEMV_KERNEL(B, 0) GEMV_KERNEL(B, 1) GEMV_KERNEL(B, 2)
GEMV_MODES(1)
GEMV_MODES(2)
GEMV_MODES(3)
GEMV_MODES(4)
GEMV_MODES(5)
GEMV_MODES(6)
GEMV_MODES(7)
GEMV_MODES(8)
