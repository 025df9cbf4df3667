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

// Tensor-core GEMV for 1-8 activation rows: mma.sync m16n8k16 (bf16 in, f32 accumulate) with the
// weights as A (16 rows x 16 k) and the activations, rounded to bf16, as B (16 k x 8 rows of the
// batch). A warp takes a tile of 16 output rows (16 gate + 16 up for SwiGLU) over a slice of K,
// 32 k per step: lane (g = lane / 4, t = lane % 4) loads 16 bytes of weight rows g and g + 8 at
// k = K0 + 8t and 8 activations of batch row g at the same k. The k order inside an mma is free
// as long as A and B agree, and both depend on t alone, so the loads need no shuffle:
// mma j (0, 1) gives slots {2t, 2t+1} the k K0 + 8t + 4j + {0, 1} and slots {2t+8, 2t+9} the k
// K0 + 8t + 4j + {2, 3}. The activations are read once per 16 weight rows (the one-warp-per-row
// GEMV reads them once per row), which is what bounds that kernel at batch 8. RMSNorm (modes 3,
// 4) is applied to the activations before rounding, as a bf16 model's norm output is.
// Requires cols % (32 * ksplit) == 0 and rows % 16 == 0.
__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}

template <int MODE, int WARPS, int U>
__device__ __forceinline__ void gemv_mma(const bf16* __restrict__ W, const float* __restrict__ x,
                                         float* __restrict__ y, int rows, int cols, int B, int ksplit,
                                         const bf16* __restrict__ gamma, float eps) {
    constexpr bool NORM = MODE == 3 || MODE == 4;
    constexpr int NW = (MODE == 2 || MODE == 4) ? 2 : 1;
    __shared__ float red[WARPS][NW][32][4];
    __shared__ float inv_s[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int tpb = WARPS / ksplit;  // tiles per block
    const int kpart = warp % ksplit;
    const int per = cols / ksplit, k0 = kpart * per;
    const int nsteps = per / (32 * U);
    const int ntiles = rows / 16, ngroups = (ntiles + tpb - 1) / tpb;
    const bool live = g < B;  // this lane's batch row

    if (NORM) {
        pdl_wait();
        for (int b = warp; b < B; b += WARPS) {
            float s = 0.0f;
            for (int k = lane; k < cols; k += 32) s = fmaf(x[(size_t)b * cols + k], x[(size_t)b * cols + k], s);
            s = warp_sum(s);
            if (lane == 0) inv_s[b] = rsqrtf(s / (float)cols + eps);
        }
        __syncthreads();
    }
    pdl_launch_dependents();
    if (!NORM) pdl_wait();

    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x) {
        const int tile = grp * tpb + warp / ksplit;
        const bool valid = tile < ntiles;
        const int row0 = tile * 16;
        float d[NW][4];
#pragma unroll
        for (int r = 0; r < NW; r++)
#pragma unroll
            for (int i = 0; i < 4; i++) d[r][i] = 0.0f;
        if (valid) {
            const float inv = NORM && live ? inv_s[g] : 1.0f;
            for (int s = 0; s < nsteps; s++) {
                uint4 w[NW][U][2];
                const int kb = k0 + s * 32 * U + 8 * t;
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const bf16* base = W + (size_t)(row0 + g + r * rows) * cols + kb + 32 * u;
                        w[r][u][0] = load_stream(reinterpret_cast<const uint4*>(base));
                        w[r][u][1] = load_stream(reinterpret_cast<const uint4*>(base + (size_t)8 * cols));
                    }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    unsigned bb[4] = {0u, 0u, 0u, 0u};
                    if (live) {
                        float4 xa, xb;
                        x_chunk<NORM>(x + (size_t)g * cols, gamma, (kb + 32 * u) >> 3, xa, xb);
                        bb[0] = pack_bf16(xa.x * inv, xa.y * inv);
                        bb[1] = pack_bf16(xa.z * inv, xa.w * inv);
                        bb[2] = pack_bf16(xb.x * inv, xb.y * inv);
                        bb[3] = pack_bf16(xb.z * inv, xb.w * inv);
                    }
#pragma unroll
                    for (int r = 0; r < NW; r++) {
                        mma_bf16(d[r], w[r][u][0].x, w[r][u][1].x, w[r][u][0].y, w[r][u][1].y, bb[0], bb[1]);
                        mma_bf16(d[r], w[r][u][0].z, w[r][u][1].z, w[r][u][0].w, w[r][u][1].w, bb[2], bb[3]);
                    }
                }
            }
        }
        // d[r]: c0, c1 = (row g, batch 2t, 2t+1); c2, c3 = (row g + 8, batch 2t, 2t+1).
        if (ksplit > 1) {
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[warp][r][lane][i] = d[r][i];
            __syncthreads();
            if (kpart == 0) {
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float s = 0.0f;
                        for (int k = 0; k < ksplit; k++) s += red[warp + k][r][lane][i];
                        d[r][i] = s;
                    }
            }
            __syncthreads();
        }
        if (valid && kpart == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + g + (i >= 2 ? 8 : 0), b = 2 * t + (i & 1);
                if (b >= B) continue;
                float* out = y + (size_t)b * rows + row;
                if (NW == 2) {
                    const float gg = d[0][i], uu = d[NW - 1][i];
                    *out = gg / (1.0f + expf(-gg)) * uu;
                } else if (MODE == 1) {
                    *out += d[0][i];
                } else {
                    *out = d[0][i];
                }
            }
        }
    }
}

#define MMA(MODE, U)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) mma_m##MODE##_u##U(                            \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int B, int ksplit, const bf16* __restrict__ gamma, float eps) {                    \
        gemv_mma<MODE, 8, U>(W, x, y, rows, cols, B, ksplit, gamma, eps);                           \
    }
MMA(1, 1) MMA(1, 2) MMA(1, 4) MMA(3, 1) MMA(3, 2) MMA(3, 4) MMA(4, 1) MMA(4, 2)
