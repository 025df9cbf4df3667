// Candidate decode GEMVs, timed by scripts/gemv-bench against the engine's gemv.cu (compiled
// into the same module after common.cuh and gemv.cu, so they share its helpers).
//
// gemv2<B, MODE, WARPS, G, PERSIST, DB>, modes as in gemv.cu (0-4):
//   a warp walks its slice of a row in steps of 32*G chunks (G 16-byte loads per lane per weight
//   row); PERSIST sizes the grid to what is resident and each block walks row groups
//   blockIdx.x, +gridDim.x, ...; DB issues the next step's loads (perhaps the next row's) before
//   the current step is used; the RMSNorm sum of squares is computed once per block while the
//   first loads are in flight. Chunks are summed in the same order as gemv.cu with the same ksplit.

template <int B, int MODE, int WARPS, int G, bool PERSIST, bool DB>
__device__ __forceinline__ void gemv2(const bf16* __restrict__ W, const float* __restrict__ x,
                                      float* __restrict__ y, int rows, int cols, int ksplit,
                                      const bf16* __restrict__ gamma, float eps) {
    constexpr bool NORM = MODE == 3 || MODE == 4;
    constexpr int NW = (MODE == 2 || MODE == 4) ? 2 : 1;
    __shared__ float red[2][WARPS][NW][B];
    __shared__ float ssr[WARPS][B];
    __shared__ float inv_s[B];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rpb = WARPS / ksplit;
    const int kpart = warp % ksplit;
    const int per = (cols >> 3) / ksplit;
    const int c0 = kpart * per, c1 = c0 + per;
    const int nsteps = (per + 32 * G - 1) / (32 * G);
    const int ngroups = (rows + rpb - 1) / rpb;
    const int stride = PERSIST ? (int)gridDim.x : ngroups;
    const int my_groups = (int)blockIdx.x < ngroups ? (ngroups - 1 - (int)blockIdx.x) / stride + 1 : 0;
    const int T = my_groups * nsteps;

    uint4 cur[NW][G], nxt[NW][G];
    auto issue = [&](int t, uint4 (&buf)[NW][G]) {
        const int g = blockIdx.x + (t / nsteps) * stride;
        const int row = g * rpb + warp / ksplit;
        if (row >= rows) return;
        const int c = c0 + (t % nsteps) * 32 * G + lane;
#pragma unroll
        for (int r = 0; r < NW; r++) {
            const uint4* w = reinterpret_cast<const uint4*>(W + (size_t)(row + r * rows) * cols);
#pragma unroll
            for (int u = 0; u < G; u++)
                if (c + 32 * u < c1) buf[r][u] = load_stream(w + c + 32 * u);
        }
    };
    if (T > 0) issue(0, cur);
    pdl_launch_dependents();
    pdl_wait();

    if (NORM) {
        float ss[B];
#pragma unroll
        for (int b = 0; b < B; b++) ss[b] = 0.0f;
        for (int k = threadIdx.x; k < cols; k += blockDim.x) {
#pragma unroll
            for (int b = 0; b < B; b++) {
                const float v = x[(size_t)b * cols + k];
                ss[b] = fmaf(v, v, ss[b]);
            }
        }
#pragma unroll
        for (int b = 0; b < B; b++) ss[b] = warp_sum(ss[b]);
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < B; b++) ssr[warp][b] = ss[b];
        }
        __syncthreads();
        if (threadIdx.x < B) {
            float t = 0.0f;
            for (int w = 0; w < WARPS; w++) t += ssr[w][threadIdx.x];
            inv_s[threadIdx.x] = rsqrtf(t / (float)cols + eps);
        }
        __syncthreads();
    }

    float acc[NW][B];
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int b = 0; b < B; b++) acc[r][b] = 0.0f;

    for (int t = 0; t < T; t++) {
        if (!DB && t > 0) issue(t, cur);
        if (DB && t + 1 < T) issue(t + 1, nxt);
        const int gi = t / nsteps, s = t % nsteps;
        const int g = blockIdx.x + gi * stride;
        const int row = g * rpb + warp / ksplit;
        const int c = c0 + s * 32 * G + lane;
        if (row < rows) {
#pragma unroll
            for (int u = 0; u < G; u++) {
                if (c + 32 * u < c1) {
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        float4 xa, xb;
                        x_chunk<NORM>(x + (size_t)b * cols, gamma, c + 32 * u, xa, xb);
#pragma unroll
                        for (int r = 0; r < NW; r++) fma8(acc[r][b], cur[r][u], xa, xb);
                    }
                }
            }
        }
        if (DB) {
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int u = 0; u < G; u++) cur[r][u] = nxt[r][u];
        }
        if (s == nsteps - 1) {
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int b = 0; b < B; b++) acc[r][b] = warp_sum(acc[r][b]);
            if (ksplit > 1) {
                const int par = gi & 1;
                if (lane == 0) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
#pragma unroll
                        for (int b = 0; b < B; b++) red[par][warp][r][b] = acc[r][b];
                }
                __syncthreads();
                if (kpart == 0 && lane == 0) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
#pragma unroll
                        for (int b = 0; b < B; b++) {
                            float tt = 0.0f;
                            for (int k = 0; k < ksplit; k++) tt += red[par][warp + k][r][b];
                            acc[r][b] = tt;
                        }
                }
            }
            if (row < rows && kpart == 0 && lane == 0) {
#pragma unroll
                for (int b = 0; b < B; b++) {
                    const float inv = NORM ? inv_s[b] : 1.0f;
                    float* out = y + (size_t)b * rows + row;
                    if (NW == 2) {
                        const float gg = acc[0][b] * inv, uu = acc[NW - 1][b] * inv;
                        *out = gg / (1.0f + expf(-gg)) * uu;
                    } else if (MODE == 1) {
                        *out += acc[0][b];
                    } else {
                        *out = acc[0][b] * inv;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int b = 0; b < B; b++) acc[r][b] = 0.0f;
        }
    }
}

#define V2(B, MODE, WARPS, G, P, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                         \
        v2_m##MODE##_b##B##_w##WARPS##_g##G##_p##P##_d##D(                                           \
            const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows, \
            int cols, int ksplit, const bf16* __restrict__ gamma, float eps) {                      \
        gemv2<B, MODE, WARPS, G, P, D>(W, x, y, rows, cols, ksplit, gamma, eps);                    \
    }
#define V2_PD(B, MODE, WARPS, G) V2(B, MODE, WARPS, G, 0, 0) V2(B, MODE, WARPS, G, 0, 1) \
    V2(B, MODE, WARPS, G, 1, 0) V2(B, MODE, WARPS, G, 1, 1)
#define V2_ALL(B, MODE) V2_PD(B, MODE, 4, 4) V2_PD(B, MODE, 4, 8) V2_PD(B, MODE, 8, 4) \
    V2_PD(B, MODE, 8, 8) V2(B, MODE, 4, 16, 0, 0) V2(B, MODE, 8, 16, 0, 0) V2(B, MODE, 4, 16, 1, 0) \
    V2(B, MODE, 8, 16, 1, 0) V2(B, MODE, 4, 2, 0, 1) V2(B, MODE, 8, 2, 0, 1) V2(B, MODE, 4, 2, 1, 1) \
    V2(B, MODE, 8, 2, 1, 1)
V2_ALL(1, 1)
V2_ALL(1, 3)
V2_ALL(1, 4)
V2_ALL(8, 1)
V2_ALL(8, 3)
V2_ALL(8, 4)

// The read ceiling: every block streams a contiguous share with 8 loads in flight per lane.
extern "C" __global__ void __launch_bounds__(256) read_only(const uint4* __restrict__ p, size_t n, float* out) {
    float s = 0.0f;
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < n; i += 8 * nt) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) if (i + u * nt < n) v[u] = load_stream(p + i + u * nt);
#pragma unroll
        for (int u = 0; u < 8; u++) if (i + u * nt < n) s += __uint_as_float(v[u].x ^ v[u].w);
    }
    if (s == 12345.0f) *out = s;
}

// Seeded pseudo-random bf16 in [-scale, scale) plus offset, so no weight is zero or denormal.
extern "C" __global__ void fill_bf16(bf16* p, size_t n, unsigned seed, float scale, float offset) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = f2bf(offset + scale * ((float)(h >> 8) / 8388608.0f - 1.0f));
    }
}

extern "C" __global__ void fill_f32(float* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = (float)(h >> 8) / 8388608.0f - 1.0f;
    }
}
