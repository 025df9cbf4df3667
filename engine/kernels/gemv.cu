// Decode GEMV: y[b][r] = W[r] . x[b] for B rows of activations. bf16 weights are streamed
// exactly once per step whatever B is, with 16-byte loads that bypass L1; activations and
// accumulation are f32. A block is 8 warps; each output row is split over `ksplit` warps of the
// block (contiguous slices of K) and the slices are summed in a fixed order, so a row's result
// depends on the matrix's shape alone, never on B or on how the grid is laid out.
//
// MODE 1: y += W x                       (o_proj, down_proj: add into the residual stream)
// MODE 3: y = W RMSNorm(x), with gain `gamma` (q/k/v; the norm computed by every block)
// MODE 4: y[j] = silu(W[j] n) * (W[rows + j] n), n = RMSNorm(x)   (gate and up stacked: SwiGLU)
// MODE 10: y = relu(W n)^2, n = RMSNorm(x)   (Nemotron-H's MLP up)
// MODE 7, 8, 9, 11, 12: 1, 3, 4, 10 and 5 on the tensor cores (gemv_mma). Which matrices run
// there is chosen per shape at load by timing both (cuda/tune.rs), never per batch.
// MODE 5: per block, the largest W x of its rows for each b, lowest row on ties, into
//         `parts` [B][gridDim.x] as (value, row); argmax_final picks the winner (lm_head).
//         The logits are rounded to bf16 first, as a bf16 model's lm_head output is (vLLM's
//         and transformers'), so logits that tie there tie here and the lowest index wins.
//
// Modes 1, 3 and 4 (gemv_stream) are persistent: the grid is what fits on the GPU at once (plan.rs
// gemv_grid) and each block walks row groups blockIdx.x, +gridDim.x, ...; a lane issues the
// next step's loads, which may be the next row's, before it uses the current ones, so the
// weight stream does not stop at row or block boundaries. Measured on the H200 against the
// one-row-per-warp kernel still used for mode 5 (scripts/gemv-bench): 10-20% faster at batch 1,
// 25-35% at batch 8.
//
// Requires cols % 8 == 0 and 16-byte aligned rows (host-checked). GEMV_WARPS (warps per block)
// and GEMV_MMA_U (below) are plan.rs's, defined by the engine (-D).

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

// An activation load: through the non-coherent path when the activations were written by an
// earlier kernel (every launched GEMV); a plain load (COHERENT, in asm so that the compiler cannot
// make it non-coherent for a const restrict pointer) when another block of the same kernel may
// have written them after a barrier's acquire (a persistent step's later ops).
template <bool COHERENT>
__device__ __forceinline__ float4 load_act(const float4* p) {
    if (!COHERENT) return __ldg(p);
    float4 v;
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p)
                 : "memory");
    return v;
}

// x chunk c (8 values) of activation row b, times the norm gain when there is one.
template <bool NORM, bool COHERENT = false>
__device__ __forceinline__ void x_chunk(const float* __restrict__ xb, const bf16* __restrict__ gamma, int c,
                                        float4& a, float4& b) {
    const float4* p = reinterpret_cast<const float4*>(xb) + 2 * c;
    a = load_act<COHERENT>(p);
    b = load_act<COHERENT>(p + 1);
    if (NORM) {
        const uint4 g = __ldg(reinterpret_cast<const uint4*>(gamma) + c);
        a.x *= bf_lo(g.x); a.y *= bf_hi(g.x); a.z *= bf_lo(g.y); a.w *= bf_hi(g.y);
        b.x *= bf_lo(g.z); b.y *= bf_hi(g.z); b.z *= bf_lo(g.w); b.w *= bf_hi(g.w);
    }
}

// The lm_head's GEMV and argmax (MODE 5): one warp per row (ksplit warps when the matrix is
// short), one block per 8 / ksplit rows; each block leaves, for each b, the largest bf16-rounded
// W x of its rows (lowest row on ties) in `parts` [B][gridDim.x] as (value, row). With LOGITS
// (gemv_m5_logits, the verify request's scoring after a decode step, never in the timed step),
// also every row's bf16-rounded W x, the values the argmax compares, into y [B][ldy].
template <int B, bool LOGITS>
__device__ __forceinline__ void gemv_argmax(const bf16* __restrict__ W, const float* __restrict__ x,
                                            float* __restrict__ y, int rows, int cols, int ldx, int ldy,
                                            int ksplit, float2* __restrict__ parts) {
    __shared__ float red[GEMV_WARPS][B];
    __shared__ float best_v[GEMV_WARPS][B];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rpb = GEMV_WARPS / ksplit;
    const int row = blockIdx.x * rpb + warp / ksplit;
    const int kpart = warp % ksplit;
    const bool valid = row < rows;
    const int per = (cols >> 3) / ksplit;
    const int c0 = kpart * per, c1 = c0 + per;
    const uint4* w = reinterpret_cast<const uint4*>(W + (size_t)(valid ? row : 0) * cols);

    // The weights do not depend on the kernel before: a lane's first four 16-byte loads are
    // issued before waiting for it, then each group of four is loaded while the one before it is
    // used. Chunks past the slice's end are skipped, so a lane sums its chunks in the same order
    // whatever the grouping.
    int c = c0 + lane;
    uint4 cur[4];
    if (valid) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + 32 * u < c1) cur[u] = load_stream(w + c + 32 * u);
    }
    pdl_launch_dependents();
    pdl_wait();

    float acc[B];
#pragma unroll
    for (int b = 0; b < B; b++) acc[b] = 0.0f;
    if (valid) {
        for (; c < c1; c += 128) {
            uint4 next[4];
            const int cn = c + 128;
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (cn + 32 * u < c1) next[u] = load_stream(w + cn + 32 * u);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (c + 32 * u < c1) {
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        float4 xa, xb;
                        x_chunk<false>(x + (size_t)b * ldx, nullptr, c + 32 * u, xa, xb);
                        fma8(acc[b], cur[u], xa, xb);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) cur[u] = next[u];
        }
    }
#pragma unroll
    for (int b = 0; b < B; b++) acc[b] = warp_sum(acc[b]);

    if (ksplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < B; b++) red[warp][b] = acc[b];
        }
        __syncthreads();
        if (kpart == 0 && lane == 0) {
#pragma unroll
            for (int b = 0; b < B; b++) {
                float t = 0.0f;
                for (int k = 0; k < ksplit; k++) t += red[warp + k][b];
                acc[b] = t;
            }
        }
    }

    __syncthreads();
    if (kpart == 0 && lane == 0) {
#pragma unroll
        for (int b = 0; b < B; b++) best_v[warp / ksplit][b] = valid ? bf2f(f2bf(acc[b])) : -INF_F;
        if (LOGITS && valid) {
#pragma unroll
            for (int b = 0; b < B; b++) y[(size_t)b * ldy + row] = bf2f(f2bf(acc[b]));
        }
    }
    __syncthreads();
    if (threadIdx.x < B) {
        const int b = threadIdx.x;
        float v = -INF_F;
        int idx = 0x7fffffff;
        for (int r = 0; r < rpb; r++) {
            const int rr = blockIdx.x * rpb + r;
            if (rr < rows && (best_v[r][b] > v || idx == 0x7fffffff)) { v = best_v[r][b]; idx = rr; }
        }
        parts[(size_t)b * gridDim.x + blockIdx.x] = make_float2(v, __int_as_float(idx));
    }
}

#define GEMV_ARGMAX_KERNEL_AS(B, NAME, LOGITS)                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) NAME##_b##B(                     \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,  \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,         \
        float2* __restrict__ parts) {                                                              \
        gemv_argmax<B, LOGITS>(W, x, y, rows, cols, ldx, ldy, ksplit, parts);                      \
    }
#define GEMV_ARGMAX_KERNEL(B) GEMV_ARGMAX_KERNEL_AS(B, gemv_m5, false) GEMV_ARGMAX_KERNEL_AS(B, gemv_m5_logits, true)

// inv_s[b] = 1 / rms(x[b]) for the block's B activation rows, every thread of the block taking
// part (each block computes it: cheaper than a kernel of its own); ends with a barrier. The rest
// of the weight stream waits for it, so its reads are 16 bytes wide, two steps issued at once: a
// few round trips to L2 rather than one per 256 values (cols % 8 == 0, rows 32-byte aligned). A
// thread's share of row b is the same at every B.
template <int B, bool COHERENT = false>
__device__ __forceinline__ void block_inv_rms(const float* __restrict__ x, int ldx, int cols, float eps,
                                              float (&ssr)[GEMV_WARPS][B], float (&inv_s)[B]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float ss[B];
#pragma unroll
    for (int b = 0; b < B; b++) ss[b] = 0.0f;
#pragma unroll 2
    for (int k = threadIdx.x; k < cols / 4; k += blockDim.x) {
#pragma unroll
        for (int b = 0; b < B; b++) {
            const float4 v = load_act<COHERENT>(reinterpret_cast<const float4*>(x + (size_t)b * ldx) + k);
            ss[b] = fmaf(v.x, v.x, ss[b]);
            ss[b] = fmaf(v.y, v.y, ss[b]);
            ss[b] = fmaf(v.z, v.z, ss[b]);
            ss[b] = fmaf(v.w, v.w, ss[b]);
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
        for (int w = 0; w < GEMV_WARPS; w++) t += ssr[w][threadIdx.x];
        inv_s[threadIdx.x] = rsqrtf(t / (float)cols + eps);
    }
    __syncthreads();
}

// Where a streaming GEMV's block stands: its index among the `count` blocks that walk the row
// groups, and how it waits for whatever wrote its activations (`arrive` before its first weights
// are issued, `wait` after). A launched GEMV is its own grid and waits for the kernel before it
// under programmatic dependent launch.
struct LaunchGrid {
    static constexpr bool coherent = false;
    __device__ __forceinline__ int block() const { return blockIdx.x; }
    __device__ __forceinline__ int count() const { return gridDim.x; }
    __device__ __forceinline__ void arrive() const {}
    __device__ __forceinline__ void wait() const {
        pdl_launch_dependents();
        pdl_wait();
    }
};

// Modes 1, 3, 4. G: 16-byte loads per lane per weight row per step (4 at batch 1; 2 at larger
// batches, whose activation reads need the registers). VK = 2 (with ksplit 1): one warp sums a
// row as two warps would with ksplit 2, the halves of K in two accumulators added at the end in
// the same order, so the result is the same bits; gate/up at batch 2-8 (plan.rs gemv_launch),
// where two warps per row measured slower than one. Needs (cols / 16) % 32 == 0, so the halves'
// chunks fall to the same lanes as the two warps'. (It picks the accumulator per chunk; batch 8
// on the 8B is 7.8% slower than with one slice: docs/ENGINE.md; moving the sum aside once at the
// second half instead, without a branch per chunk, measured no faster.)
template <int B, int MODE, int G, int VK = 1, class Grid = LaunchGrid>
__device__ __forceinline__ void gemv_stream(const bf16* __restrict__ W, const float* __restrict__ x,
                                            float* __restrict__ y, int rows, int cols, int ldx, int ldy,
                                            int ksplit, const bf16* __restrict__ gamma, float eps,
                                            const Grid grid = Grid()) {
    constexpr int WARPS = GEMV_WARPS;
    constexpr bool NORM = MODE == 3 || MODE == 4 || MODE == 10;
    constexpr int NW = MODE == 4 ? 2 : 1;
    __shared__ float red[2][WARPS][NW][B];
    __shared__ float ssr[WARPS][B];
    __shared__ float inv_s[B];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rpb = WARPS / ksplit;
    const int kpart = warp % ksplit;
    const int per = (cols >> 3) / ksplit;
    const int c0 = kpart * per, c1 = c0 + per;
    const int half = per / VK;
    const int nsteps = (per + 32 * G - 1) / (32 * G);
    const int ngroups = (rows + rpb - 1) / rpb;
    const int stride = grid.count(), bid = grid.block();
    const int my_groups = bid < ngroups ? (ngroups - 1 - bid) / stride + 1 : 0;
    const int T = my_groups * nsteps;

    uint4 cur[NW][G], nxt[NW][G];
    // Loads of step t (row group t / nsteps of this block, slice step t % nsteps) into `buf`;
    // chunks past the slice's end are skipped here and when summing.
    auto issue = [&](int t, uint4 (&buf)[NW][G]) {
        const int g = bid + (t / nsteps) * stride;
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
    // The weights do not depend on the kernel before: the first step is issued before waiting
    // for it. (Issuing the second too costs registers, so occupancy: measured 10% slower.)
    grid.arrive();
    if (T > 0) issue(0, cur);
    grid.wait();

    if (NORM) block_inv_rms<B, Grid::coherent>(x, ldx, cols, eps, ssr, inv_s);

    float acc[VK][NW][B];
#pragma unroll
    for (int v = 0; v < VK; v++)
#pragma unroll
        for (int r = 0; r < NW; r++)
#pragma unroll
            for (int b = 0; b < B; b++) acc[v][r][b] = 0.0f;

    for (int t = 0; t < T; t++) {
        if (t + 1 < T) issue(t + 1, nxt);
        const int gi = t / nsteps, s = t % nsteps;
        const int g = bid + gi * stride;
        const int row = g * rpb + warp / ksplit;
        const int c = c0 + s * 32 * G + lane;
        if (row < rows) {
#pragma unroll
            for (int u = 0; u < G; u++) {
                if (c + 32 * u < c1) {
                    // The same for every lane: half is a multiple of 32 chunks.
                    const bool hi = VK == 2 && c - lane - c0 + 32 * u >= half;
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        float4 xa, xb;
                        x_chunk<NORM, Grid::coherent>(x + (size_t)b * ldx, gamma, c + 32 * u, xa, xb);
                        if (hi) {
#pragma unroll
                            for (int r = 0; r < NW; r++) fma8(acc[VK - 1][r][b], cur[r][u], xa, xb);
                        } else {
#pragma unroll
                            for (int r = 0; r < NW; r++) fma8(acc[0][r][b], cur[r][u], xa, xb);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NW; r++)
#pragma unroll
            for (int u = 0; u < G; u++) cur[r][u] = nxt[r][u];
        if (s == nsteps - 1) {
#pragma unroll
            for (int v = 0; v < VK; v++)
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int b = 0; b < B; b++) acc[v][r][b] = warp_sum(acc[v][r][b]);
            if (VK == 2) {
                // As the ksplit 2 path below sums its two warps: from zero, in order.
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        float tt = 0.0f;
                        tt += acc[0][r][b];
                        tt += acc[VK - 1][r][b];
                        acc[0][r][b] = tt;
                    }
            }
            if (ksplit > 1) {
                const int par = gi & 1;
                if (lane == 0) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
#pragma unroll
                        for (int b = 0; b < B; b++) red[par][warp][r][b] = acc[0][r][b];
                }
                __syncthreads();
                if (kpart == 0 && lane == 0) {
#pragma unroll
                    for (int r = 0; r < NW; r++)
#pragma unroll
                        for (int b = 0; b < B; b++) {
                            float tt = 0.0f;
                            for (int k = 0; k < ksplit; k++) tt += red[par][warp + k][r][b];
                            acc[0][r][b] = tt;
                        }
                }
            }
            if (row < rows && kpart == 0 && lane == 0) {
#pragma unroll
                for (int b = 0; b < B; b++) {
                    const float inv = NORM ? inv_s[b] : 1.0f;
                    float* out = y + (size_t)b * ldy + row;
                    if (NW == 2) {
                        const float gg = acc[0][0][b] * inv, uu = acc[0][NW - 1][b] * inv;
                        *out = gg / (1.0f + expf(-gg)) * uu;
                    } else if (MODE == 1) {
                        *out += acc[0][0][b];
                    } else if (MODE == 10) {
                        const float r = fmaxf(acc[0][0][b] * inv, 0.0f);
                        *out = r * r;
                    } else {
                        *out = acc[0][0][b] * inv;
                    }
                }
            }
#pragma unroll
            for (int v = 0; v < VK; v++)
#pragma unroll
                for (int r = 0; r < NW; r++)
#pragma unroll
                    for (int b = 0; b < B; b++) acc[v][r][b] = 0.0f;
        }
    }
}

#define GEMV_STREAM_KERNEL(B, MODE, G) GEMV_STREAM_KERNEL_AS(B, MODE, MODE, G, 1)
#define GEMV_STREAM_KERNEL_AS(B, NAME, MODE, G, VK)                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_m##NAME##_b##B(             \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,  \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,         \
        float2* __restrict__ parts) {                                                              \
        gemv_stream<B, MODE, G, VK>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps);            \
    }
// Mode 6: gate/up (4) with VK = 2.
#define GEMV_STREAM_MODES(B, G) GEMV_STREAM_KERNEL(B, 1, G) GEMV_STREAM_KERNEL(B, 3, G) \
    GEMV_STREAM_KERNEL(B, 4, G) GEMV_STREAM_KERNEL_AS(B, 6, 4, G, 2) GEMV_STREAM_KERNEL(B, 10, G)

// MODE 7: y += W x on the tensor cores, for 1-8 activation rows: mma.sync m16n8k16 with the
// weights as A (a warp's tile: 16 output rows over its slice of K) and the activations as B
// (16 k x 8 batch rows), each activation as two bf16 terms hi = bf16(v), lo = bf16(v - hi)
// through two mma into the same f32 accumulators (about 16 bits of it, where the CUDA-core
// modes keep 24). Lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of rows g and g + 8 at
// k = K0 + 8t (+ 32u for each of U chunks) and the 8 activations of batch row g at the same k:
// the k order inside an mma is free as long as A and B agree, so no shuffle is needed (mma j
// gives slots {2t, 2t+1} the k K0 + 8t + 4j + {0, 1} and {2t+8, 2t+9} K0 + 8t + 4j + {2, 3}).
// Batch row b's result reads column b of B alone, and a lane runs the same code at every B
// (lanes past the batch use zeros), so its bits do not depend on the batch. Persistent like
// gemv_stream: each block walks groups of 8 / ksplit tiles, a lane issuing its next step's
// loads before it uses the current ones; the ksplit warps of a tile add their sums in a fixed
// order. Measured on the H200 (scripts/gemv-bench): at batch 1 within 3% of gemv_stream for the
// 8B's o and down, at batch 8 3.3x (o) and 3.7x (down) faster; other shapes are slower at batch 1,
// so the engine times both kernels per shape at load and keeps the faster over batch 1 and batch
// 8 (cuda/tune.rs). Needs rows % 16 == 0 and cols % (32 U ksplit) == 0 (plan.rs mma_ksplit); U is
// GEMV_MMA_U (plan.rs MMA_U).

// The modes of gemv_stream and gemv_argmax: 1, 3, 4 and 10 (the RMSNorm folded in as
// gemv_stream does, its scale applied to the activations before they are split), and 5, the
// lm_head, which keeps for each b the largest bf16-rounded logit of the block's tiles and its row
// (lowest row on ties) and leaves it in `parts` [B][gridDim.x] for argmax_final; with LOGITS
// also every logit into y [B][ldy] (the verify request's scoring).
template <int B, int MODE, int U, bool LOGITS = false>
__device__ __forceinline__ void gemv_mma(const bf16* __restrict__ W, const float* __restrict__ x,
                                         float* __restrict__ y, int rows, int cols, int ldx, int ldy,
                                         int ksplit, const bf16* __restrict__ gamma, float eps,
                                         float2* __restrict__ parts) {
    constexpr int WARPS = GEMV_WARPS;
    constexpr bool NORM = MODE == 3 || MODE == 4 || MODE == 10;
    constexpr int NW = MODE == 4 ? 2 : 1;
    __shared__ float red[2][WARPS][NW][4][32];
    __shared__ float ssr[WARPS][B];
    __shared__ float inv_s[B];
    __shared__ float2 cand[WARPS][8];
    // MODE 5: this lane's best (value, row) for batch columns 2 tq and 2 tq + 1.
    float best_v[2] = {-INF_F, -INF_F};
    int best_i[2] = {0x7fffffff, 0x7fffffff};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int tpb = WARPS / ksplit, kpart = warp % ksplit;
    const int per = cols / ksplit, k0 = kpart * per;
    const int nsteps = per / (32 * U);
    const int ntiles = rows >> 4, ngroups = (ntiles + tpb - 1) / tpb;
    const int stride = gridDim.x;
    const int my_groups = (int)blockIdx.x < ngroups ? (ngroups - 1 - (int)blockIdx.x) / stride + 1 : 0;
    const int T = my_groups * nsteps;

    uint4 cur[NW][U][2], nxt[NW][U][2];
    // Step t: row group t / nsteps of this block, slice step t % nsteps.
    auto issue = [&](int t, uint4 (&buf)[NW][U][2]) {
        const int tile = (blockIdx.x + (t / nsteps) * stride) * tpb + warp / ksplit;
        if (tile >= ntiles) return;
#pragma unroll
        for (int r = 0; r < NW; r++) {
            const bf16* base =
                W + (size_t)(tile * 16 + g + r * rows) * cols + k0 + (t % nsteps) * 32 * U + 8 * tq;
#pragma unroll
            for (int u = 0; u < U; u++) {
                buf[r][u][0] = load_stream(reinterpret_cast<const uint4*>(base + 32 * u));
                buf[r][u][1] = load_stream(reinterpret_cast<const uint4*>(base + (size_t)8 * cols + 32 * u));
            }
        }
    };
    if (T > 0) issue(0, cur);
    pdl_launch_dependents();
    pdl_wait();

    if (NORM) block_inv_rms<B>(x, ldx, cols, eps, ssr, inv_s);
    // Lanes past the batch read row 0 and scale it by 0 (no branch); their columns are not stored.
    const bool live = g < B;
    const float* xg = x + (size_t)(live ? g : 0) * ldx;
    const float scale = !live ? 0.0f : NORM ? inv_s[g] : 1.0f;
    float d[NW][4];
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int i = 0; i < 4; i++) d[r][i] = 0.0f;
    for (int t = 0; t < T; t++) {
        if (t + 1 < T) issue(t + 1, nxt);
        const int gi = t / nsteps, s = t % nsteps;
        const int tile = (blockIdx.x + gi * stride) * tpb + warp / ksplit;
        if (tile < ntiles) {
            const int kb = k0 + s * 32 * U + 8 * tq;
            float4 xv[U][2];
#pragma unroll
            for (int u = 0; u < U; u++) x_chunk<NORM>(xg, gamma, (kb + 32 * u) >> 3, xv[u][0], xv[u][1]);
#pragma unroll
            for (int u = 0; u < U; u++) {
                unsigned hi[4], lo[4];
                const float4 xa = xv[u][0], xb = xv[u][1];
                // __fmul_rn: the product is never fused into the split's subtraction.
                split_bf16(__fmul_rn(xa.x, scale), __fmul_rn(xa.y, scale), hi[0], lo[0]);
                split_bf16(__fmul_rn(xa.z, scale), __fmul_rn(xa.w, scale), hi[1], lo[1]);
                split_bf16(__fmul_rn(xb.x, scale), __fmul_rn(xb.y, scale), hi[2], lo[2]);
                split_bf16(__fmul_rn(xb.z, scale), __fmul_rn(xb.w, scale), hi[3], lo[3]);
#pragma unroll
                for (int r = 0; r < NW; r++) {
                    const uint4 a = cur[r][u][0], c = cur[r][u][1];
                    mma_bf16(d[r], a.x, c.x, a.y, c.y, hi[0], hi[1]);
                    mma_bf16(d[r], a.z, c.z, a.w, c.w, hi[2], hi[3]);
                    mma_bf16(d[r], a.x, c.x, a.y, c.y, lo[0], lo[1]);
                    mma_bf16(d[r], a.z, c.z, a.w, c.w, lo[2], lo[3]);
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
            if (MODE == 5 && tile < ntiles && kpart == 0) {
                // Rows g, then g + 8 of each tile, tiles in ascending order: a strictly larger
                // value wins, so among equals the lowest row stays (the first row seen is kept
                // whatever it is, as gemv_argmax does).
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int b = 2 * tq + (i & 1), row = tile * 16 + g + (i >= 2 ? 8 : 0);
                    const float v = bf2f(f2bf(d[0][i]));
                    if (LOGITS && b < B) y[(size_t)b * ldy + row] = v;
                    if (v > best_v[i & 1] || best_i[i & 1] == 0x7fffffff) {
                        best_v[i & 1] = v;
                        best_i[i & 1] = row;
                    }
                }
            }
            if (MODE != 5 && tile < ntiles && kpart == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int b = 2 * tq + (i & 1);
                    if (b < B) {
                        float* out = y + (size_t)b * ldy + tile * 16 + g + (i >= 2 ? 8 : 0);
                        if (NW == 2) {
                            const float gg = d[0][i], uu = d[NW - 1][i];
                            *out = gg / (1.0f + expf(-gg)) * uu;
                        } else if (MODE == 1) {
                            *out += d[0][i];
                        } else if (MODE == 10) {
                            const float r = fmaxf(d[0][i], 0.0f);
                            *out = r * r;
                        } else {
                            *out = d[0][i];
                        }
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < NW; r++)
#pragma unroll
                for (int i = 0; i < 4; i++) d[r][i] = 0.0f;
        }
    }
    if (MODE == 5) {
        // The lanes of one tq hold the same batch columns: the best over their rows, then over
        // the block's tile slots (warps of kpart 0), into parts.
        auto better = [](float v, int i, float bv, int bi) {
            return v > bv || (v == bv && i < bi) || (bi == 0x7fffffff && i != 0x7fffffff);
        };
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, best_v[j], o);
                const int oi = __shfl_xor_sync(0xffffffffu, best_i[j], o);
                if (better(ov, oi, best_v[j], best_i[j])) { best_v[j] = ov; best_i[j] = oi; }
            }
        if (kpart == 0 && g == 0) {
            cand[warp][2 * tq] = make_float2(best_v[0], __int_as_float(best_i[0]));
            cand[warp][2 * tq + 1] = make_float2(best_v[1], __int_as_float(best_i[1]));
        }
        __syncthreads();
        if (threadIdx.x < B) {
            const int b = threadIdx.x;
            float v = -INF_F;
            int idx = 0x7fffffff;
            for (int w = 0; w < WARPS; w += ksplit) {
                const float2 c = cand[w][b];
                if (better(c.x, __float_as_int(c.y), v, idx)) { v = c.x; idx = __float_as_int(c.y); }
            }
            parts[(size_t)b * gridDim.x + blockIdx.x] = make_float2(v, __int_as_float(idx));
        }
    }
}

// gemv_m{NAME}_b{B}: gemv_mma of MODE. Engine modes 7, 8, 9, 11 and 12 are the residual (1), norm
// (3), gate/up (4), relu2 (10) and lm_head (5) modes on the tensor cores; gemv_m12_logits_b{B}
// the lm_head writing its logits too.
#define GEMV_MMA_KERNEL_AS(B, NAME, MODE, LOGITS)                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_m##NAME##_b##B(             \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,  \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,         \
        float2* __restrict__ parts) {                                                              \
        gemv_mma<B, MODE, GEMV_MMA_U, LOGITS>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps,   \
                                              parts);                                              \
    }
#define GEMV_MMA_KERNELS(B) GEMV_MMA_KERNEL_AS(B, 7, 1, false) GEMV_MMA_KERNEL_AS(B, 8, 3, false) \
    GEMV_MMA_KERNEL_AS(B, 9, 4, false) GEMV_MMA_KERNEL_AS(B, 11, 10, false)                         \
    GEMV_MMA_KERNEL_AS(B, 12, 5, false) GEMV_MMA_KERNEL_AS(B, 12_logits, 5, true)

// The kernels of each batch size B. A compile unit emits those of GEMV_B_FIRST to GEMV_B_LAST
// (every B by default): kernels.rs compiles the batch sizes as units of their own, at once,
// since this file is most of the kernels' compile time.
#ifndef GEMV_B_FIRST
#define GEMV_B_FIRST 1
#define GEMV_B_LAST 8
#endif
#define GEMV_EMITS(B) (GEMV_B_FIRST <= (B) && (B) <= GEMV_B_LAST)
#if GEMV_EMITS(1)
GEMV_ARGMAX_KERNEL(1)
GEMV_STREAM_MODES(1, 4)
GEMV_MMA_KERNELS(1)
#endif
#if GEMV_EMITS(2)
GEMV_ARGMAX_KERNEL(2)
GEMV_STREAM_MODES(2, 2)
GEMV_MMA_KERNELS(2)
#endif
#if GEMV_EMITS(3)
GEMV_ARGMAX_KERNEL(3)
GEMV_STREAM_MODES(3, 2)
GEMV_MMA_KERNELS(3)
#endif
#if GEMV_EMITS(4)
GEMV_ARGMAX_KERNEL(4)
GEMV_STREAM_MODES(4, 2)
GEMV_MMA_KERNELS(4)
#endif
#if GEMV_EMITS(5)
GEMV_ARGMAX_KERNEL(5)
GEMV_STREAM_MODES(5, 2)
GEMV_MMA_KERNELS(5)
#endif
#if GEMV_EMITS(6)
GEMV_ARGMAX_KERNEL(6)
GEMV_STREAM_MODES(6, 2)
GEMV_MMA_KERNELS(6)
#endif
#if GEMV_EMITS(7)
GEMV_ARGMAX_KERNEL(7)
GEMV_STREAM_MODES(7, 2)
GEMV_MMA_KERNELS(7)
#endif
#if GEMV_EMITS(8)
GEMV_ARGMAX_KERNEL(8)
GEMV_STREAM_MODES(8, 2)
GEMV_MMA_KERNELS(8)
#endif
