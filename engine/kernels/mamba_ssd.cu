// The Mamba-2 prefill scan in its chunked form (SSD), on the tensor cores: the same recurrence as
// mamba.cu's sequential scan (state = state * exp(dt A) + dt B x, y = state . C + D x), summed a
// chunk of MAMBA_SSD_ROWS rows at a time as matrix products, as transformers' torch path and
// vLLM's kernels sum it. Within a chunk, with cum_t the running sum of dt A over its rows:
//
//   y_t   = exp(cum_t) C_t . S  +  sum_{s <= t} (C_t . B_s) exp(cum_t - cum_s) dt_s x_s  +  D x_t
//   S_new = exp(cum_last) S     +  sum_s B_s exp(cum_last - cum_s) dt_s x_s
//
// (S the state the chunk starts from, [N][hd]). Every exponent is at most 0, so nothing
// overflows. The products run as tf32 mma (each operand rounded to 11 significant bits, 2^-11 of
// it at most: finer than the bf16 every GEMM of the pass reads its activations in, and than
// vLLM's bf16 products here) with f32 accumulators; the state stays in f32 registers from the
// first chunk to the last. Splitting each operand into its tf32 part and what rounding left
// (three mma a product, about f32's precision) made the scan slower than the sequential one on
// a batch of prompts (docs/ENGINE.md, session 24).
//
// One block per (head, segment), as mamba_ssm, its segments longest first; the state is read
// from the segment's slot once (zeros at position 0) and written back once. A chunk ends where a
// row's position is a multiple of MAMBA_SSD_ROWS or the segment ends, so the chunks of a sequence
// are the same whatever else its pass holds: a row's bits do not depend on its batch (they do
// on where a prompt was cut into passes, and they differ from the decode step's in the last
// bits: the order of the sums is another).
//
// Eight warps; the chunk's rows in tiles of 16, each tile's C . B columns and y channels shared
// among 8 / tiles warps; warp w also keeps the state's rows 16 w .. + 16 (every channel).
// Chunks of 32 rows (MAMBA_SSD_ROWS) leave a block 85 KB of shared memory and 120 registers a
// thread, so two blocks share a multiprocessor: the scan waits on its loads and its mma chains
// more than it computes, and at 64 rows (one block) it took 1.6-2x as long. Shared memory
// (plan.rs mamba_ssd_smem_bytes), row strides padded so that a warp's fragment loads fall in
// distinct banks: B and C [rows][N + 4], x [rows][hd + 8], the masked and decayed C . B
// [rows][rows + 4], the state [N][hd + 8], and per row cum, dt and the state update's weight
// exp(cum_last - cum_s) dt_s.
//
// MAMBA_SSD_ROWS, MAMBA_SSD_HD (most channels a head) and MAMBA_SSD_N (most state values a
// channel) are plan.rs's; a model past them takes mamba.cu's sequential scan.
static_assert(MAMBA_SSD_N == 128, "one 16-row tile of the state a warp, eight warps");
static_assert(MAMBA_SSD_HD % 32 == 0, "whole channel tiles for every warp of a row tile");

#define SSD_THREADS 256
#define SSD_BS (MAMBA_SSD_N + 4)
#define SSD_XS (MAMBA_SSD_HD + 8)

__device__ __forceinline__ unsigned tf32_of(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A fragment (16 x 8, row-major) of rows r, r + 8 (r = 16-row tile + lane / 4) at k-step k0
// (+ lane % 4, + 4) of a [rows][stride] array.
__device__ __forceinline__ void a_frag(unsigned (&f)[4], const float* m, int stride, int r, int k) {
    f[0] = tf32_of(m[r * stride + k]);
    f[1] = tf32_of(m[(r + 8) * stride + k]);
    f[2] = tf32_of(m[r * stride + k + 4]);
    f[3] = tf32_of(m[(r + 8) * stride + k + 4]);
}

// The B fragment (8 x 8, column-major) of column c (= 8-column tile + lane / 4) at k-step k (+ lane
// % 4, + 4) of a [k][stride] array.
__device__ __forceinline__ void b_frag(unsigned (&f)[2], const float* m, int stride, int k, int c) {
    f[0] = tf32_of(m[k * stride + c]);
    f[1] = tf32_of(m[(k + 4) * stride + c]);
}

// The B fragment of column c at k-step k of a [col][stride] array (its transpose).
__device__ __forceinline__ void b_frag_t(unsigned (&f)[2], const float* m, int stride, int k, int c) {
    f[0] = tf32_of(m[c * stride + k]);
    f[1] = tf32_of(m[c * stride + k + 4]);
}

extern "C" __global__ void __launch_bounds__(SSD_THREADS, 2) mamba_ssd(MAMBA_SSM_PARAMS) {
    constexpr int L = MAMBA_SSD_ROWS, PT = MAMBA_SSD_HD / 8;  // the state's channel tiles
    constexpr int SSD_MS = L + 4;
    // Row tiles of 16, warps a row tile (each its share of C . B's columns and of y's channels),
    // and rows of dt a lane of warp 0.
    constexpr int STRIPS = L / 16, WPS = 8 / STRIPS, GT = L / 8 / WPS, YT = PT / WPS, RPL = L / 32;
    static_assert(L == 32 || L == 64, "two or four row tiles, four or two warps each");
    extern __shared__ __align__(16) float sm[];
    float* bs = sm;
    float* cs = bs + L * SSD_BS;
    float* xs = cs + L * SSD_BS;
    float* ms = xs + L * SSD_XS;
    float* ss = ms + L * SSD_MS;
    float* cum = ss + MAMBA_SSD_N * SSD_XS;
    float* dts = cum + L;
    float* wst = dts + L;
    float* dec = wst + L;
    pdl_launch_dependents();
    const int h = blockIdx.x, seg = gridDim.y - 1 - blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const float ah = a[h], dh = d[h], dtb = dt_bias[h];
    const int g = h / (heads / groups);
    const int r0 = starts[seg], r1 = starts[seg + 1];
    if (r0 == r1) return;
    const bool fresh = positions[r0] == 0;
    float* st = ssm_state + ((size_t)slots[seg] * heads + h) * n_state * hd;
    // This warp's 16 rows of the state (n_a and n_a + 8 in each fragment), every channel.
    const int n_a = 16 * warp + gq;
    float sacc[PT][4];
#pragma unroll
    for (int j = 0; j < PT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = n_a + (e >> 1) * 8, p = 8 * j + 2 * tq + (e & 1);
            sacc[j][e] = (!fresh && n < n_state && p < hd) ? st[(size_t)n * hd + p] : 0.0f;
        }
    pdl_wait();
    // Zeros everywhere once: the columns past d_state and hd are never loaded.
    const int total = 2 * L * SSD_BS + L * SSD_XS + L * SSD_MS + MAMBA_SSD_N * SSD_XS + 3 * L + 4;
    for (int e = threadIdx.x; e < total; e += SSD_THREADS) sm[e] = 0.0f;
    __syncthreads();
    auto state_to_smem = [&]() {
#pragma unroll
        for (int j = 0; j < PT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) ss[(n_a + (e >> 1) * 8) * SSD_XS + 8 * j + 2 * tq + (e & 1)] = sacc[j][e];
    };
    state_to_smem();
    const size_t b_off = inner + (size_t)g * n_state, c_off = inner + (size_t)(groups + g) * n_state;
    const bool vec = ((conv_dim | inner | n_state | hd) & 3) == 0;
    const int kn = (n_state + 7) / 8;  // k-steps over the state
    const int m = warp % STRIPS, part = warp / STRIPS, t_a = 16 * m + gq, t_b = t_a + 8;
    for (int t0 = r0; t0 < r1;) {
        const int nt = min(L - positions[t0] % L, r1 - t0);
        // Stage B, C and x of the chunk's rows; rows past nt are zeros.
        if (vec) {
            const int q4 = n_state / 4, x4 = hd / 4;
            for (int e = threadIdx.x; e < L * q4; e += SSD_THREADS) {
                const int j = e / q4, c = 4 * (e % q4);
                const float* row = xbc + (size_t)(t0 + min(j, nt - 1)) * conv_dim;
                cp_async16(bs + j * SSD_BS + c, row + b_off + c, j < nt);
                cp_async16(cs + j * SSD_BS + c, row + c_off + c, j < nt);
            }
            for (int e = threadIdx.x; e < L * x4; e += SSD_THREADS) {
                const int j = e / x4, c = 4 * (e % x4);
                cp_async16(xs + j * SSD_XS + c, xbc + (size_t)(t0 + min(j, nt - 1)) * conv_dim + h * hd + c, j < nt);
            }
            cp_async_commit();
        } else {
            for (int e = threadIdx.x; e < L * n_state; e += SSD_THREADS) {
                const int j = e / n_state, c = e % n_state;
                const float* row = xbc + (size_t)(t0 + j) * conv_dim;
                bs[j * SSD_BS + c] = j < nt ? row[b_off + c] : 0.0f;
                cs[j * SSD_BS + c] = j < nt ? row[c_off + c] : 0.0f;
            }
            for (int e = threadIdx.x; e < L * hd; e += SSD_THREADS) {
                const int j = e / hd, c = e % hd;
                xs[j * SSD_XS + c] = j < nt ? xbc[(size_t)(t0 + j) * conv_dim + h * hd + c] : 0.0f;
            }
        }
        // dt and the running sum of dt A: warp 0, RPL rows a lane, a scan over the lanes.
        if (warp == 0) {
            float dv[RPL], cv[RPL];
            float run = 0.0f;
#pragma unroll
            for (int k = 0; k < RPL; k++) {
                const int j = RPL * lane + k;
                dv[k] = j < nt ? ssm_dt(zxbcdt[(size_t)(t0 + j) * in_dim + inner + conv_dim + h], dtb, dt_min) : 0.0f;
                run = k == 0 ? dv[k] * ah : run + dv[k] * ah;
                cv[k] = run;
            }
            float incl = run;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            float before = __shfl_up_sync(0xffffffffu, incl, 1);
            if (lane == 0) before = 0.0f;
#pragma unroll
            for (int k = 0; k < RPL; k++) {
                cv[k] = lane == 0 ? cv[k] : before + cv[k];
                cum[RPL * lane + k] = cv[k];
                dts[RPL * lane + k] = dv[k];
            }
            __syncwarp();
            const float last = cum[nt - 1];
#pragma unroll
            for (int k = 0; k < RPL; k++) {
                const int j = RPL * lane + k;
                wst[j] = j < nt ? dv[k] * expf(last - cv[k]) : 0.0f;
            }
            if (lane == 0) dec[0] = expf(last);
        }
        cp_async_wait<0>();
        __syncthreads();
        // C . B for this warp's rows and columns (those at or before its last row), and C . S for
        // its rows and channels: the same C fragments.
        float gacc[GT][4], yacc[YT][4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
#pragma unroll
            for (int j = 0; j < GT; j++) gacc[j][e] = 0.0f;
#pragma unroll
            for (int j = 0; j < YT; j++) yacc[j][e] = 0.0f;
        }
#pragma unroll 2
        for (int kk = 0; kk < kn; kk++) {
            unsigned af[4];
            a_frag(af, cs, SSD_BS, t_a, 8 * kk + tq);
#pragma unroll
            for (int j = 0; j < GT; j++) {
                const int s0 = 8 * (part * GT + j);
                if (s0 <= 16 * m + 15) {
                    unsigned bf[2];
                    b_frag_t(bf, bs, SSD_BS, 8 * kk + tq, s0 + gq);
                    mma_tf32(gacc[j], af, bf);
                }
            }
#pragma unroll
            for (int j = 0; j < YT; j++) {
                const int p0 = 8 * (part * YT + j);
                if (p0 < hd) {
                    unsigned bf[2];
                    b_frag(bf, ss, SSD_XS, 8 * kk + tq, p0 + gq);
                    mma_tf32(yacc[j], af, bf);
                }
            }
        }
        // The masked, decayed C . B with dt folded in: M[t][s] = (C_t . B_s) exp(cum_t - cum_s) dt_s,
        // s <= t.
#pragma unroll
        for (int j = 0; j < GT; j++) {
            const int s0 = 8 * (part * GT + j);
            if (s0 <= 16 * m + 15) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = e < 2 ? t_a : t_b, sc = s0 + 2 * tq + (e & 1);
                    ms[t * SSD_MS + sc] = sc <= t ? gacc[j][e] * expf(cum[t] - cum[sc]) * dts[sc] : 0.0f;
                }
            }
        }
        __syncthreads();
        // y = exp(cum_t) C . S + M x + D x.
        const float ea = expf(cum[t_a]), eb = expf(cum[t_b]);
#pragma unroll
        for (int j = 0; j < YT; j++) yacc[j][0] *= ea, yacc[j][1] *= ea, yacc[j][2] *= eb, yacc[j][3] *= eb;
        for (int ks = 0; ks < 2 * (m + 1); ks++) {
            unsigned af[4];
            a_frag(af, ms, SSD_MS, t_a, 8 * ks + tq);
#pragma unroll
            for (int j = 0; j < YT; j++) {
                const int p0 = 8 * (part * YT + j);
                if (p0 < hd) {
                    unsigned bf[2];
                    b_frag(bf, xs, SSD_XS, 8 * ks + tq, p0 + gq);
                    mma_tf32(yacc[j], af, bf);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < YT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = e < 2 ? t_a : t_b, p = 8 * (part * YT + j) + 2 * tq + (e & 1);
                if (t < nt && p < hd)
                    y[(size_t)(t0 + t) * inner + (size_t)h * hd + p] = yacc[j][e] + dh * xs[t * SSD_XS + p];
            }
        }
        // The state: S = exp(cum_last) S + (B^T w) x, w_s = exp(cum_last - cum_s) dt_s.
        if (16 * warp < n_state) {
            const float dl = dec[0];
#pragma unroll
            for (int j = 0; j < PT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sacc[j][e] *= dl;
            for (int ks = 0; ks < (nt + 7) / 8; ks++) {
                const int sa = 8 * ks + tq, sb = sa + 4;
                const float wa = wst[sa], wb = wst[sb];
                unsigned af[4] = {tf32_of(bs[sa * SSD_BS + n_a] * wa), tf32_of(bs[sa * SSD_BS + n_a + 8] * wa),
                                  tf32_of(bs[sb * SSD_BS + n_a] * wb), tf32_of(bs[sb * SSD_BS + n_a + 8] * wb)};
#pragma unroll
                for (int j = 0; j < PT; j++) {
                    if (8 * j < hd) {
                        unsigned bf[2];
                        b_frag(bf, xs, SSD_XS, sa, 8 * j + gq);
                        mma_tf32(sacc[j], af, bf);
                    }
                }
            }
        }
        __syncthreads();  // every read of this chunk's rows and of the state before it is done
        t0 += nt;
        if (t0 < r1) {
            state_to_smem();
            // The next chunk's staging waits on the barrier after its copies.
        }
    }
#pragma unroll
    for (int j = 0; j < PT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = n_a + (e >> 1) * 8, p = 8 * j + 2 * tq + (e & 1);
            if (n < n_state && p < hd) st[(size_t)n * hd + p] = sacc[j][e];
        }
}

