// Candidate decode GEMVs, timed by scripts/gemv-bench against the engine's own (compiled into
// the same module after the engine's program, so they share its helpers).
//
// stream_m<MODE>_b<B>_g<G>: the engine's gemv_stream at other step widths G (16-byte loads per
// lane per weight row per step) than the engine instantiates.
#define STREAM(B, MODE, G)                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) stream_m##MODE##_b##B##_g##G(      \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_stream<B, MODE, G>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);                   \
    }
#define STREAM_G(B, MODE) STREAM(B, MODE, 2) STREAM(B, MODE, 4) STREAM(B, MODE, 8)
// stream_m4_b<B>_switch: the engine's one-warp gate/up (mode 6: gemv_stream VK = 2) with SWITCH,
// its two accumulators swapped once per row instead of chosen per chunk; ksplit 1, same bits.
// Held to two blocks per SM as mode 6 runs (at B = 8 that spills 24 bytes; not yet timed).
#define STREAM_SWITCH(B)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 2) stream_m4_b##B##_switch(         \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_stream<B, 4, 2, 2, true>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);             \
    }
STREAM_SWITCH(2)
STREAM_SWITCH(4)
STREAM_SWITCH(8)
STREAM_G(1, 1)
STREAM_G(1, 3)
STREAM_G(1, 4)
STREAM_G(8, 1)
STREAM_G(8, 3)
STREAM_G(8, 4)

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
// S = 2: the activations as two bf16 terms, hi = bf16(v) and lo = bf16(v - hi), each through its
// own mma into the same f32 accumulators: about 16 bits of each activation instead of 8.
// Requires cols % (32 * ksplit) == 0 and rows % 16 == 0.
// mma_bf16, pack_bf16 and split_bf16 are gemv.cu's (the engine's mode 7).

template <int MODE, int WARPS, int U, int S = 1>
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
                    unsigned bb[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                    if (live) {
                        float4 xa, xb;
                        x_chunk<NORM>(x + (size_t)g * cols, gamma, (kb + 32 * u) >> 3, xa, xb);
                        if (S == 2) {
                            split_bf16(xa.x * inv, xa.y * inv, bb[0], bl[0]);
                            split_bf16(xa.z * inv, xa.w * inv, bb[1], bl[1]);
                            split_bf16(xb.x * inv, xb.y * inv, bb[2], bl[2]);
                            split_bf16(xb.z * inv, xb.w * inv, bb[3], bl[3]);
                        } else {
                            bb[0] = pack_bf16(xa.x * inv, xa.y * inv);
                            bb[1] = pack_bf16(xa.z * inv, xa.w * inv);
                            bb[2] = pack_bf16(xb.x * inv, xb.y * inv);
                            bb[3] = pack_bf16(xb.z * inv, xb.w * inv);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < NW; r++) {
                        mma_bf16(d[r], w[r][u][0].x, w[r][u][1].x, w[r][u][0].y, w[r][u][1].y, bb[0], bb[1]);
                        mma_bf16(d[r], w[r][u][0].z, w[r][u][1].z, w[r][u][0].w, w[r][u][1].w, bb[2], bb[3]);
                        if (S == 2) {
                            mma_bf16(d[r], w[r][u][0].x, w[r][u][1].x, w[r][u][0].y, w[r][u][1].y, bl[0], bl[1]);
                            mma_bf16(d[r], w[r][u][0].z, w[r][u][1].z, w[r][u][0].w, w[r][u][1].w, bl[2], bl[3]);
                        }
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
#define MMA_S2(MODE, U)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) mma_m##MODE##_u##U##_s2(                       \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int B, int ksplit, const bf16* __restrict__ gamma, float eps) {                    \
        gemv_mma<MODE, 8, U, 2>(W, x, y, rows, cols, B, ksplit, gamma, eps);                        \
    }
MMA_S2(1, 2) MMA_S2(1, 4) MMA_S2(3, 2) MMA_S2(3, 4) MMA_S2(4, 1) MMA_S2(4, 2)

// mmas_m<MODE>_b<B>_u<U>: the tensor-core GEMV (gemv_mma's tile: 16 rows per warp, lane (g, t)
// holding 16 bytes of rows g and g + 8 at k = K0 + 8t, the activations of batch row g at the
// same k as two bf16 terms) streamed like gemv_stream: persistent, each block walking groups of
// 8 / ksplit tiles, a lane issuing its next step's loads (the next tile's at a tile's end)
// before it uses the current ones. Batch row b's result depends on its own activations only
// (an mma's column n reads column n of B alone) and the code a live lane runs does not depend
// on B, so the bits are the same at every batch size. U: 16-byte loads per lane per weight row
// per step, each for 32 k. Needs rows % 16 == 0 and cols % (32 U ksplit) == 0.
// C = 2: every (u, hi/lo) its own accumulator, added in a fixed order at a tile's end: 2U
// independent chains of mma per step instead of one chain of 4U.
// LOADS_ONLY: the same loads with next to no arithmetic (what the access pattern alone costs).
// PAIR (gate/up, MODE 4): a tile is 8 outputs, its mma rows 0-7 their gate rows and 8-15 their
// up rows, so lane (g, t) gets gate and up of output g in its own accumulators (two row streams
// per lane instead of four).
template <int B, int MODE, int U, int C = 1, bool LOADS_ONLY = false, bool PAIR = false>
__device__ __forceinline__ void gemv_mma_stream(const bf16* __restrict__ W, const float* __restrict__ x,
                                                float* __restrict__ y, int rows, int cols, int ldx, int ldy,
                                                int ksplit, const bf16* __restrict__ gamma, float eps) {
    constexpr int WARPS = GEMV_WARPS;
    constexpr bool NORM = MODE == 3 || MODE == 4;
    constexpr int NW = MODE == 4 && !PAIR ? 2 : 1;
    constexpr int TR = PAIR ? 8 : 16;  // output rows per tile
    __shared__ float red[2][WARPS][NW][4][32];
    __shared__ float ssr[WARPS][B];
    __shared__ float inv_s[B];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int tpb = WARPS / ksplit, kpart = warp % ksplit;
    const int per = cols / ksplit, k0 = kpart * per;
    const int nsteps = per / (32 * U);
    const int ntiles = rows / TR, ngroups = (ntiles + tpb - 1) / tpb;
    const int stride = gridDim.x;
    const int my_groups = (int)blockIdx.x < ngroups ? (ngroups - 1 - (int)blockIdx.x) / stride + 1 : 0;
    const int T = my_groups * nsteps;

    uint4 cur[NW][U][2], nxt[NW][U][2];
    auto issue = [&](int t, uint4 (&buf)[NW][U][2]) {
        const int tile = (blockIdx.x + (t / nsteps) * stride) * tpb + warp / ksplit;
        if (tile >= ntiles) return;
        const int kb = k0 + (t % nsteps) * 32 * U + 8 * tq;
#pragma unroll
        for (int r = 0; r < NW; r++) {
            const bf16* base = W + (size_t)(tile * TR + g + r * rows) * cols + kb;
            const size_t second = PAIR ? (size_t)rows * cols : (size_t)8 * cols;
#pragma unroll
            for (int u = 0; u < U; u++) {
                buf[r][u][0] = load_stream(reinterpret_cast<const uint4*>(base + 32 * u));
                buf[r][u][1] = load_stream(reinterpret_cast<const uint4*>(base + second + 32 * u));
            }
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
                const float v = x[(size_t)b * ldx + k];
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
    const bool live = g < B;
    const float* xg = x + (size_t)(live ? g : 0) * ldx;
    // Lanes past the batch scale by 0: their activations are zeros.
    const float inv = !live ? 0.0f : NORM ? inv_s[g] : 1.0f;

    constexpr int NA = C == 2 ? 2 * U : 1;
    float acc[NW][NA][4];
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int a = 0; a < NA; a++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[r][a][i] = 0.0f;

    for (int t = 0; t < T; t++) {
        if (t + 1 < T) issue(t + 1, nxt);
        const int gi = t / nsteps, s = t % nsteps;
        const int tile = (blockIdx.x + gi * stride) * tpb + warp / ksplit;
        if (tile < ntiles) {
            const int kb = k0 + s * 32 * U + 8 * tq;
            // Every chunk's activations first (lanes past the batch load row 0's and use zeros:
            // no branch), then the mma.
            float4 xv[U][2];
            if (!LOADS_ONLY) {
#pragma unroll
                for (int u = 0; u < U; u++) x_chunk<NORM>(xg, gamma, (kb + 32 * u) >> 3, xv[u][0], xv[u][1]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (LOADS_ONLY) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
                    {
                        const uint4 a = cur[r][u][0], c = cur[r][u][1];
                        acc[r][0][0] += __uint_as_float((a.x ^ a.y ^ a.z ^ a.w ^ c.x ^ c.y ^ c.z ^ c.w) & 0x3f800000u);
                    }
                    continue;
                }
                unsigned hi[4], lo[4];
                const float4 xa = xv[u][0], xb = xv[u][1];
                // __fmul_rn: the product is never fused into the split's subtraction.
                split_bf16(__fmul_rn(xa.x, inv), __fmul_rn(xa.y, inv), hi[0], lo[0]);
                split_bf16(__fmul_rn(xa.z, inv), __fmul_rn(xa.w, inv), hi[1], lo[1]);
                split_bf16(__fmul_rn(xb.x, inv), __fmul_rn(xb.y, inv), hi[2], lo[2]);
                split_bf16(__fmul_rn(xb.z, inv), __fmul_rn(xb.w, inv), hi[3], lo[3]);
#pragma unroll
                for (int r = 0; r < NW; r++) {
                    const uint4 a = cur[r][u][0], c = cur[r][u][1];
                    float(&dh)[4] = acc[r][C == 2 ? 2 * u : 0];
                    float(&dl)[4] = acc[r][C == 2 ? 2 * u + 1 : 0];
                    mma_bf16(dh, a.x, c.x, a.y, c.y, hi[0], hi[1]);
                    mma_bf16(dh, a.z, c.z, a.w, c.w, hi[2], hi[3]);
                    mma_bf16(dl, a.x, c.x, a.y, c.y, lo[0], lo[1]);
                    mma_bf16(dl, a.z, c.z, a.w, c.w, lo[2], lo[3]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NW; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                cur[r][u][0] = nxt[r][u][0];
                cur[r][u][1] = nxt[r][u][1];
            }
        if (s == nsteps - 1) {
            // d[r]: 0, 1 = (row g, batch 2t, 2t + 1); 2, 3 = (row g + 8, batch 2t, 2t + 1).
            float d[NW][4];
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float tt = acc[r][0][i];
#pragma unroll
                    for (int a = 1; a < NA; a++) tt += acc[r][a][i];
                    d[r][i] = tt;
                }
            if (ksplit > 1) {
                const int par = gi & 1;
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++) red[par][warp][r][i][lane] = d[r][i];
                __syncthreads();
                if (kpart == 0) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float tt = 0.0f;
                            for (int k = 0; k < ksplit; k++) tt += red[par][warp + k][r][i][lane];
                            d[r][i] = tt;
                        }
                }
            }
            if (PAIR && tile < ntiles && kpart == 0) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int b = 2 * tq + i;
                    if (b < B) {
                        const float gg = d[0][i], uu = d[0][2 + i];
                        y[(size_t)b * ldy + tile * 8 + g] = gg / (1.0f + expf(-gg)) * uu;
                    }
                }
            }
            if (!PAIR && tile < ntiles && kpart == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int row = tile * 16 + g + (i >= 2 ? 8 : 0), b = 2 * tq + (i & 1);
                    if (b < B) {
                        float* out = y + (size_t)b * ldy + row;
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
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int a = 0; a < NA; a++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[r][a][i] = 0.0f;
        }
    }
}

#define MMAS(B, MODE, U)                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) mmas_m##MODE##_b##B##_u##U(        \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_mma_stream<B, MODE, U>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);               \
    }
#define MMAS_B(B) MMAS(B, 1, 1) MMAS(B, 1, 2) MMAS(B, 1, 4) MMAS(B, 3, 1) MMAS(B, 3, 2) MMAS(B, 3, 4) \
    MMAS(B, 4, 1) MMAS(B, 4, 2)
MMAS_B(1)
MMAS_B(8)
#define MMASC(B, MODE, U)                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) mmasc_m##MODE##_b##B##_u##U(       \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_mma_stream<B, MODE, U, 2>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);            \
    }
#define MMASC_B(B) MMASC(B, 1, 2) MMASC(B, 1, 4) MMASC(B, 3, 2) MMASC(B, 3, 4) MMASC(B, 4, 1) MMASC(B, 4, 2)
MMASC_B(1)
MMASC_B(8)
#define MMASL(B, MODE, U)                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) mmasl_m##MODE##_b##B##_u##U(       \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_mma_stream<B, MODE, U, 1, true>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);      \
    }
#define MMASP(B, U)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) mmasp_m4_b##B##_u##U(              \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_mma_stream<B, 4, U, 1, false, true>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);  \
    }
MMASP(1, 2) MMASP(1, 4) MMASP(8, 2) MMASP(8, 4)
MMASL(1, 1, 2) MMASL(1, 1, 4) MMASL(1, 1, 8) MMASL(1, 4, 2) MMAS(1, 1, 8) MMAS(1, 3, 8) MMAS(8, 1, 8) MMAS(8, 3, 8)
