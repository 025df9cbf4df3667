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

// mmas_m<MODE>_b<B>_u<U>: gemv.cu's tensor-core GEMV (the engine's mode 7 is mode 1 at U 4) at
// other modes and widths U (16-byte loads per lane per weight row per step). Measured on the
// H200 (docs/ENGINE.md): at batch 8 2.5-4x faster than the CUDA cores on every Llama-3.2-1B and
// -3.1-8B matrix; at batch 1 slower on all but the 8B's o and down.
#define MMAS(B, MODE, U)                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) mmas_m##MODE##_b##B##_u##U(        \
        const bf16* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows,     \
        int cols, int ldx, int ldy, int ksplit, const bf16* __restrict__ gamma, float eps,            \
        float2* __restrict__ parts) {                                                                 \
        gemv_mma<B, MODE, U>(W, x, y, rows, cols, ldx, ldy, ksplit, gamma, eps, parts);               \
    }
// Gate/up stops at U 2: two weight rows per output at U 4 would hold 128 registers of loads.
#define MMAS_B(B) MMAS(B, 1, 1) MMAS(B, 1, 2) MMAS(B, 1, 4) MMAS(B, 1, 8) MMAS(B, 3, 1) MMAS(B, 3, 2) \
    MMAS(B, 3, 4) MMAS(B, 3, 8) MMAS(B, 4, 1) MMAS(B, 4, 2)
MMAS_B(1)
MMAS_B(8)

// attention_tc_d<D>: decode attention on the tensor cores, a candidate for the batch sizes where
// the engine's attention.cu is slow (docs/ENGINE.md, session 16), timed and checked against
// attention.cu by run.cpp's `att`. Block (row, KV head, split): a split is `split_chunks` chunks
// of 16 positions of the row's context (a row's split count its context's alone, at most
// gridDim.z, the last taking the rest); the group's query heads are the rows of an m16n8k16 tile (rows past them zero, never
// stored); each of the four warps streams every fourth chunk of the split through two stages of
// its own shared memory by cp.async, with an online softmax per head; the warps are merged in
// shared memory, and the splits, as attention.cu does, by the last block of the (row, KV head)
// to finish, from part_o [rows][H][gridDim.z][D] and part_ml [..][2] (counts [rows][KVH], zero
// between launches). q and p are split into two bf16 terms, K and V are the cache's bf16, as in
// attention_prefill.cu. Dynamic shared memory: ATT_TC_WARPS x 2 stages x (K, V) x 16 x (D + 8)
// bf16.
#define ATT_TC_WARPS 4
template <int D>
__device__ __forceinline__ void attention_tc_body(
    const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const int* __restrict__ positions, const int* __restrict__ row_table, const int* __restrict__ block_tables,
    int max_blocks, int num_heads, int num_kv_heads, int block_size, float scale, int split_chunks,
    float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counts, float* __restrict__ out) {
    constexpr int KS = D / 16, DN = D / 8, LD = D + 8, STAGE = 2 * 16 * LD;
    extern __shared__ __align__(16) unsigned char att_tc_smem[];
    __shared__ int ticket;
    const int row = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = num_heads / num_kv_heads;
    bf16* stages = reinterpret_cast<bf16*>(att_tc_smem) + warp * 2 * STAGE;
    const int ctx = positions[row] + 1, chunks = (ctx + 15) / 16;
    const int used = min(S, (chunks + split_chunks - 1) / split_chunks);
    if (z >= used) return;
    // The last split takes what is left, should the grid hold fewer splits than the context.
    const int c_end = z == used - 1 ? chunks : (z + 1) * split_chunks;
    const int* table = block_tables + (size_t)row_table[row] * max_blocks;
    const size_t head_stride = (size_t)block_size * D, block_stride = (size_t)num_kv_heads * head_stride;
    const bf16* kb = k_cache + (size_t)kvh * head_stride;
    const bf16* vb = v_cache + (size_t)kvh * head_stride;
    // Chunk c's 16 positions of K and V into stage s, 16 bytes a copy; positions past the context
    // zero-filled (masked below; a zero V keeps 0 * V finite).
    auto stage_chunk = [&](int c, int s) {
        bf16* kd = stages + s * STAGE;
        bf16* vd = kd + 16 * LD;
        for (int i = lane; i < 16 * (D / 8); i += 32) {
            const int r = i / (D / 8), col = (i % (D / 8)) * 8, p = c * 16 + r;
            const bool ok = p < ctx;
            const size_t off = ok ? (size_t)table[p / block_size] * block_stride + (size_t)(p % block_size) * D + col : 0;
            cp_async16(kd + r * LD + col, kb + off, ok);
            cp_async16(vd + r * LD + col, vb + off, ok);
        }
        cp_async_commit();
    };
    const int c0 = z * split_chunks + warp;
    if (c0 < c_end) stage_chunk(c0, 0);

    // This lane's two tile rows (fragment rows gr and gr + 8) are query heads kvh * g + gr and
    // + 8 of the group.
    const int gr = lane >> 2, c2 = 2 * (lane & 3);
    const float* q = qkv + (size_t)row * ld_qkv + (size_t)kvh * g * D;
    const float2 zero2 = make_float2(0.0f, 0.0f);
    auto qpair = [&](int h, int d) { return h < g ? *reinterpret_cast<const float2*>(q + h * D + d) : zero2; };
    unsigned qh[KS][4], ql[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const float2 a0 = qpair(gr, kk * 16 + c2), a1 = qpair(gr + 8, kk * 16 + c2);
        const float2 a2 = qpair(gr, kk * 16 + 8 + c2), a3 = qpair(gr + 8, kk * 16 + 8 + c2);
        split_bf16(a0.x * scale, a0.y * scale, qh[kk][0], ql[kk][0]);
        split_bf16(a1.x * scale, a1.y * scale, qh[kk][1], ql[kk][1]);
        split_bf16(a2.x * scale, a2.y * scale, qh[kk][2], ql[kk][2]);
        split_bf16(a3.x * scale, a3.y * scale, qh[kk][3], ql[kk][3]);
    }
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float ma = -INF_F, mb = -INF_F, la = 0.0f, lb = 0.0f;  // la, lb: this lane's share of the sums
    const int kr = (lane & 7) + ((lane >> 4) << 3), kc = ((lane >> 3) & 1) * 8;
    const int vr = (lane & 7) + (((lane >> 3) & 1) << 3), vc = (lane >> 4) * 8;
    int s = 0;
    for (int c = c0; c < c_end; c += ATT_TC_WARPS, s ^= 1) {
        if (c + ATT_TC_WARPS < c_end) {
            stage_chunk(c + ATT_TC_WARPS, s ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        const bf16* kt = stages + s * STAGE;
        const bf16* vt = kt + 16 * LD;
        // S = Q K^T over the chunk's 16 positions: two n-tiles.
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            unsigned b[4];
            ldmatrix_x4(b, kt + kr * LD + kk * 16 + kc);
            mma_bf16(sc[0], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], b[0], b[1]);
            mma_bf16(sc[0], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], b[0], b[1]);
            mma_bf16(sc[1], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], b[2], b[3]);
            mma_bf16(sc[1], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], b[2], b[3]);
        }
        // Positions past the context masked; the chunk's first position is in it, so the
        // maxima are finite.
        float ta = -INF_F, tb = -INF_F;
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool in = c * 16 + n * 8 + c2 + e < ctx;
                sc[n][e] = in ? sc[n][e] : -INF_F;
                sc[n][2 + e] = in ? sc[n][2 + e] : -INF_F;
                ta = fmaxf(ta, sc[n][e]);
                tb = fmaxf(tb, sc[n][2 + e]);
            }
        }
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 1));
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 2));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 1));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 2));
        const float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
        const float ca = expf(ma - na), cb = expf(mb - nb);  // 0 on the warp's first chunk
        ma = na;
        mb = nb;
        la *= ca;
        lb *= cb;
#pragma unroll
        for (int d = 0; d < DN; d++) {
            o[d][0] *= ca;
            o[d][1] *= ca;
            o[d][2] *= cb;
            o[d][3] *= cb;
        }
#pragma unroll
        for (int n = 0; n < 2; n++) {
            sc[n][0] = expf(sc[n][0] - na);
            sc[n][1] = expf(sc[n][1] - na);
            sc[n][2] = expf(sc[n][2] - nb);
            sc[n][3] = expf(sc[n][3] - nb);
            la += sc[n][0] + sc[n][1];
            lb += sc[n][2] + sc[n][3];
        }
        // O += P V: the chunk's two n-tiles of S are one k-step of P.
        unsigned ph[4], pl[4];
        split_bf16(sc[0][0], sc[0][1], ph[0], pl[0]);
        split_bf16(sc[0][2], sc[0][3], ph[1], pl[1]);
        split_bf16(sc[1][0], sc[1][1], ph[2], pl[2]);
        split_bf16(sc[1][2], sc[1][3], ph[3], pl[3]);
#pragma unroll
        for (int d = 0; d < DN; d += 2) {
            unsigned b[4];
            ldmatrix_x4_trans(b, vt + vr * LD + d * 8 + vc);
            mma_bf16(o[d], ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
            mma_bf16(o[d], pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
            mma_bf16(o[d + 1], ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
            mma_bf16(o[d + 1], pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
        }
        __syncwarp();  // every lane is done with stage s before the next chunk but one fills it
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    // Merge the warps in the stages' memory: [warp][16 rows][D] outputs, [warp][16 rows][2]
    // (max, sum); a warp that had no chunk has max -inf and weighs 0 (warp 0 always has one).
    __syncthreads();
    float* wo = reinterpret_cast<float*>(att_tc_smem);
    float* wml = wo + ATT_TC_WARPS * 16 * D;
#pragma unroll
    for (int d = 0; d < DN; d++) {
        *reinterpret_cast<float2*>(wo + (warp * 16 + gr) * D + d * 8 + c2) = make_float2(o[d][0], o[d][1]);
        *reinterpret_cast<float2*>(wo + (warp * 16 + gr + 8) * D + d * 8 + c2) = make_float2(o[d][2], o[d][3]);
    }
    if ((lane & 3) == 0) {
        wml[(warp * 16 + gr) * 2] = ma;
        wml[(warp * 16 + gr) * 2 + 1] = la;
        wml[(warp * 16 + gr + 8) * 2] = mb;
        wml[(warp * 16 + gr + 8) * 2 + 1] = lb;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g * D; i += blockDim.x) {
        const int h = i / D, d = i - h * D;
        float M = -INF_F;
        for (int w = 0; w < ATT_TC_WARPS; w++) M = fmaxf(M, wml[(w * 16 + h) * 2]);
        float L = 0.0f, acc = 0.0f;
        for (int w = 0; w < ATT_TC_WARPS; w++) {
            const float m = wml[(w * 16 + h) * 2];
            const float e = m == -INF_F ? 0.0f : expf(m - M);
            L += e * wml[(w * 16 + h) * 2 + 1];
            acc += e * wo[(w * 16 + h) * D + d];
        }
        const size_t head = (size_t)row * num_heads + kvh * g + h;
        if (used == 1) {
            out[head * D + d] = acc / L;
        } else {
            part_o[(head * S + z) * D + d] = acc;
            if (d == 0) {
                part_ml[(head * S + z) * 2] = M;
                part_ml[(head * S + z) * 2 + 1] = L;
            }
        }
    }
    if (used == 1) return;
    // The last of the row's blocks for this KV head merges the splits, in order.
    __threadfence();
    __syncthreads();
    int* count = counts + (size_t)row * num_kv_heads + kvh;
    if (threadIdx.x == 0) ticket = atomicAdd(count, 1);
    __syncthreads();
    if (ticket != used - 1) return;
    __threadfence();
    if (threadIdx.x == 0) *count = 0;
    for (int i = threadIdx.x; i < g * D; i += blockDim.x) {
        const int h = i / D, d = i - h * D;
        const size_t head = (size_t)row * num_heads + kvh * g + h;
        float M = -INF_F;
        for (int j = 0; j < used; j++) M = fmaxf(M, __ldcg(part_ml + (head * S + j) * 2));
        float L = 0.0f, acc = 0.0f;
        for (int j = 0; j < used; j++) {
            const float e = expf(__ldcg(part_ml + (head * S + j) * 2) - M);
            L += e * __ldcg(part_ml + (head * S + j) * 2 + 1);
            acc += e * __ldcg(part_o + (head * S + j) * D + d);
        }
        out[head * D + d] = acc / L;
    }
}

#define ATT_TC_KERNEL(D)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATT_TC_WARPS) attention_tc_d##D(                  \
        const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache,                    \
        const bf16* __restrict__ v_cache, const int* __restrict__ positions,                            \
        const int* __restrict__ row_table, const int* __restrict__ block_tables, int max_blocks,        \
        int num_heads, int num_kv_heads, int block_size, float scale, int split_chunks,                 \
        float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counts,              \
        float* __restrict__ out) {                                                                      \
        attention_tc_body<D>(qkv, ld_qkv, k_cache, v_cache, positions, row_table, block_tables,        \
                             max_blocks, num_heads, num_kv_heads, block_size, scale, split_chunks,      \
                             part_o, part_ml, counts, out);                                             \
    }
ATT_TC_KERNEL(64)
ATT_TC_KERNEL(128)
