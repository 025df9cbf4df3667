// Prefill attention on the tensor cores (flash attention over the paged cache). A block takes a
// tile of up to 16 * ATT_PF_WARPS consecutive rows of one prompt (its query positions
// consecutive, from positions[first]) for one query head, each warp 16 of the rows, and walks
// the K/V positions 0 .. the tile's last position in tiles of ATT_PF_POS, staged in shared
// memory by cp.async two tiles deep, with an online softmax per row.
//
// Exactness: q (f32, rotated by rope_kv) and the probabilities p are each split into two bf16
// terms (hi, and what rounding left) through two mma into f32 accumulators, as the tensor-core
// GEMVs split their activations (gemv.cu): about 16 bits of each kept; K and V are the cache's
// bf16 exactly. A row's result depends on its own query and the positions up to its own alone:
// an mma's output row reads its own A row only, K/V tiles start at position 0 whatever tile the
// row is in, and a K/V tile past a row's position (every score masked) leaves its state exactly
// as it was (max unchanged, correction exactly 1, probabilities 0), so the row's bits do not
// depend on where its prompt was cut or what shares its pass; a warp whose rows all precede a
// K/V tile skips it for that reason.
//
// tiles: [n][2] (first row, rows) per block x; out: [rows][num_heads * D], bf16 and/or f32
// (null: not written). Dynamic shared memory: plan.rs attention_prefill_smem_bytes.
static_assert(ATT_PF_POS % 16 == 0, "a K/V tile is whole k-steps of the P.V mma");

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// The tensor-core attention's steps on a warp's 16 query rows (attention_prefill.cu, and decode's
// attention_batch.cu): each lane holds fragment rows a (lane / 4) and b (+ 8) of the scores of
// NT n-tiles of 8 positions, s[n][0..1] row a's and s[n][2..3] row b's, columns 2 (lane % 4)
// and + 1.

// The A fragments of rows a and b of Q, scaled, each value split in two bf16 terms (hi, and
// what rounding left): qa and qb are the rows (null: a row of zeros), c2 the lane's column.
template <int KS>
__device__ __forceinline__ void q_fragments(unsigned (&qh)[KS][4], unsigned (&ql)[KS][4], const float* qa,
                                            const float* qb, float scale, int c2) {
    const float2 zero = make_float2(0.0f, 0.0f);
    auto at = [&](const float* r, int d) { return r ? *reinterpret_cast<const float2*>(r + d) : zero; };
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const float2 a0 = at(qa, kk * 16 + c2), a1 = at(qb, kk * 16 + c2);
        const float2 a2 = at(qa, kk * 16 + 8 + c2), a3 = at(qb, kk * 16 + 8 + c2);
        split_bf16(a0.x * scale, a0.y * scale, qh[kk][0], ql[kk][0]);
        split_bf16(a1.x * scale, a1.y * scale, qh[kk][1], ql[kk][1]);
        split_bf16(a2.x * scale, a2.y * scale, qh[kk][2], ql[kk][2]);
        split_bf16(a3.x * scale, a3.y * scale, qh[kk][3], ql[kk][3]);
    }
}

// S = Q K^T over NT positions of the stage `kt` (rows of LD bf16), q split in two bf16 terms.
template <int KS, int NT, int LD>
__device__ __forceinline__ void tile_scores(float (&s)[NT][4], const unsigned (&qh)[KS][4], const unsigned (&ql)[KS][4],
                                            const bf16* kt, int lane) {
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    // ldmatrix's four 8x8 matrices are two n-tiles (positions) by two halves of the k-step
    // (dimensions), each lane's fragments as the mma wants them.
    const int kr = (lane & 7) + ((lane >> 4) << 3), kc = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned b[4];
            ldmatrix_x4(b, kt + (n * 8 + kr) * LD + kk * 16 + kc);
            mma_bf16(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], b[0], b[1]);
            mma_bf16(s[n], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], b[0], b[1]);
            mma_bf16(s[n + 1], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], b[2], b[3]);
            mma_bf16(s[n + 1], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], b[2], b[3]);
        }
    }
}

// e^x, or with EXP2 2^x in one instruction (the scores then in base 2: Q scaled by log2(e) too).
template <bool EXP2>
__device__ __forceinline__ float softmax_exp(float x) {
    if (!EXP2) return expf(x);
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// The online softmax of rows a and b over masked scores (-inf where masked; at least one of each
// row's scores so far finite): the running maxima ma, mb and this lane's shares of the sums la, lb
// and the outputs o are rescaled, and s becomes the probabilities. EXP2: the scores are in base 2.
template <int NT, int DN, bool EXP2 = false>
__device__ __forceinline__ void tile_softmax(float (&s)[NT][4], float (&o)[DN][4], float& ma, float& mb, float& la,
                                             float& lb) {
    float ta = -INF_F, tb = -INF_F;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        ta = fmaxf(ta, fmaxf(s[n][0], s[n][1]));
        tb = fmaxf(tb, fmaxf(s[n][2], s[n][3]));
    }
    ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 1));
    ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 2));
    tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 1));
    tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 2));
    const float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
    // 0 on the first scores; 1 exactly where the maximum stays (ex2.approx is not promised to be
    // exact there), so a tile past a row's position leaves its state as it was.
    const float ca = EXP2 && ma == na ? 1.0f : softmax_exp<EXP2>(ma - na);
    const float cb = EXP2 && mb == nb ? 1.0f : softmax_exp<EXP2>(mb - nb);
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
    for (int n = 0; n < NT; n++) {
        s[n][0] = softmax_exp<EXP2>(s[n][0] - na);
        s[n][1] = softmax_exp<EXP2>(s[n][1] - na);
        s[n][2] = softmax_exp<EXP2>(s[n][2] - nb);
        s[n][3] = softmax_exp<EXP2>(s[n][3] - nb);
        la += s[n][0] + s[n][1];
        lb += s[n][2] + s[n][3];
    }
}

// O += P V over the NT positions of the stage `vt`: two n-tiles of P are one k-step as an A
// fragment, split in two bf16 terms; V's fragments by ldmatrix.trans (positions as k, dimensions
// as n).
template <int NT, int DN, int LD>
__device__ __forceinline__ void tile_pv(float (&o)[DN][4], const float (&s)[NT][4], const bf16* vt, int lane) {
    const int vr = (lane & 7) + (((lane >> 3) & 1) << 3), vc = (lane >> 4) * 8;
#pragma unroll
    for (int kp = 0; kp < NT / 2; kp++) {
        unsigned ph[4], pl[4];
        split_bf16(s[2 * kp][0], s[2 * kp][1], ph[0], pl[0]);
        split_bf16(s[2 * kp][2], s[2 * kp][3], ph[1], pl[1]);
        split_bf16(s[2 * kp + 1][0], s[2 * kp + 1][1], ph[2], pl[2]);
        split_bf16(s[2 * kp + 1][2], s[2 * kp + 1][3], ph[3], pl[3]);
#pragma unroll
        for (int d = 0; d < DN; d += 2) {
            unsigned b[4];
            ldmatrix_x4_trans(b, vt + (kp * 16 + vr) * LD + d * 8 + vc);
            mma_bf16(o[d], ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
            mma_bf16(o[d], pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
            mma_bf16(o[d + 1], ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
            mma_bf16(o[d + 1], pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
        }
    }
}

template <int D>
__device__ __forceinline__ void attention_prefill_body(
    const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ positions, const int* __restrict__ row_table,
    const int* __restrict__ block_tables, int max_blocks, const int* __restrict__ tiles, int num_heads,
    int num_kv_heads, int block_size, float scale, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    constexpr int KS = D / 16;          // k-steps of Q.K over the head dimension
    constexpr int DN = D / 8;           // n-tiles of P.V's output
    constexpr int NT = ATT_PF_POS / 8;  // n-tiles of Q.K over a K tile's positions
    constexpr int LD = D + 8;           // a staged row, padded: ldmatrix's 8 rows hit 8 bank groups
    constexpr int CHUNKS = ATT_PF_POS * D / 8;
    static_assert(D % 16 == 0 && D <= MAX_HEAD_DIM, "head dim in whole k-steps");
    extern __shared__ __align__(16) unsigned char att_pf_smem[];
    bf16* ks = reinterpret_cast<bf16*>(att_pf_smem);  // [2][ATT_PF_POS][LD]
    bf16* vs = ks + 2 * ATT_PF_POS * LD;              // [2][ATT_PF_POS][LD]
    pdl_launch_dependents();
    pdl_wait();
    const int head = blockIdx.y;
    const int first = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = att_kv_head(head / (num_heads / num_kv_heads), num_kv_heads);
    const int pos0 = positions[first];
    const int ctx = pos0 + count;  // the tile's rows attend to positions 0 .. ctx - 1
    const int* table = block_tables + (size_t)row_table[first] * max_blocks;
    const size_t head_stride = (size_t)block_size * D;
    const size_t block_stride = (size_t)num_kv_heads * head_stride;
    const bf16* kb = k_cache + (size_t)kvh * head_stride;
    const bf16* vb = v_cache + (size_t)kvh * head_stride;

    const CacheBlocks cb(block_size);
    // Positions past the context are zero-filled: their scores are masked, and a zero V keeps
    // 0 * V finite.
    auto stage_tile = [&](int j, int stage) {
        bf16* kd = ks + stage * ATT_PF_POS * LD;
        bf16* vd = vs + stage * ATT_PF_POS * LD;
        for (int c = threadIdx.x; c < CHUNKS; c += blockDim.x) {
            const int r = c / (D / 8), col = (c % (D / 8)) * 8;
            const int p = j * ATT_PF_POS + r;
            const bool ok = p < ctx;
            const size_t off = ok ? (size_t)table[cb.block(p)] * block_stride + (size_t)cb.slot(p) * D + col : 0;
            cp_async16(kd + r * LD + col, kb + off, ok);
            cp_async16(vd + r * LD + col, vb + off, ok);
        }
        cp_async_commit();
    };
    const int n_kv = (ctx + ATT_PF_POS - 1) / ATT_PF_POS;
    stage_tile(0, 0);

    // This thread's two rows of the warp's 16 (mma fragment rows g and g + 8), as query
    // positions; rows past the tile's count repeat its last row and are never stored.
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    const int ra = warp * 16 + g, rb = ra + 8;
    const int pa = pos0 + ra, pb = pos0 + rb;
    const float* qa = qkv + (size_t)(first + min(ra, count - 1)) * ld_qkv + (size_t)head * D;
    const float* qb = qkv + (size_t)(first + min(rb, count - 1)) * ld_qkv + (size_t)head * D;
    unsigned qh[KS][4], ql[KS][4];
    // Scores in base 2 (ex2 is one instruction, expf several): Q scaled by log2(e) as well.
    q_fragments<KS>(qh, ql, qa, qb, scale * 1.44269504088896341f, c2);
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float ma = -INF_F, mb = -INF_F, la = 0.0f, lb = 0.0f;  // la, lb: this lane's share of the sums
    const int warp_last = pos0 + min(warp * 16 + 15, count - 1);

    for (int j = 0; j < n_kv; j++) {
        if (j + 1 < n_kv) {
            stage_tile(j + 1, (j + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int p0 = j * ATT_PF_POS;
        if (p0 <= warp_last) {
            const bf16* kt = ks + (j & 1) * ATT_PF_POS * LD;
            const bf16* vt = vs + (j & 1) * ATT_PF_POS * LD;
            float s[NT][4];
            tile_scores<KS, NT, LD>(s, qh, ql, kt, lane);
            // Causal mask (where the tile reaches past the warp's first row), then the online
            // softmax of rows a and b (a quad of lanes holds a row). Position 0 is in tile 0 and
            // every row's, so the maxima are finite from there on.
            if (p0 + ATT_PF_POS - 1 > pos0 + warp * 16) {
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int p = p0 + n * 8 + c2 + e;
                        s[n][e] = p <= pa ? s[n][e] : -INF_F;
                        s[n][2 + e] = p <= pb ? s[n][2 + e] : -INF_F;
                    }
                }
            }
            tile_softmax<NT, DN, true>(s, o, ma, mb, la, lb);
            tile_pv<NT, DN, LD>(o, s, vt, lane);
        }
        __syncthreads();  // the stage just read is the one the next iteration fills
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    const int ld_out = num_heads * D;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rb : ra;
        if (r >= count) continue;
        const float inv = 1.0f / (half ? lb : la);  // one division a row, not one an output
        const int pos = half ? pb : pa;
        const size_t at = (size_t)(first + r) * ld_out + (size_t)head * D + c2;
#pragma unroll
        for (int d = 0; d < DN; d++) {
            const float v0 = att_out(o[d][2 * half] * inv, pos), v1 = att_out(o[d][2 * half + 1] * inv, pos);
            if (out_f32) *reinterpret_cast<float2*>(out_f32 + at + d * 8) = make_float2(v0, v1);
            if (out_bf16) *reinterpret_cast<unsigned*>(out_bf16 + at + d * 8) = pack_bf16(v0, v1);
        }
    }
}

#define ATT_PF_KERNEL(D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * ATT_PF_WARPS) attention_prefill_d##D(              \
        const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache,                     \
        const bf16* __restrict__ v_cache, const int* __restrict__ positions,                             \
        const int* __restrict__ row_table, const int* __restrict__ block_tables, int max_blocks,         \
        const int* __restrict__ tiles, int num_heads, int num_kv_heads, int block_size, float scale,     \
        float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {                                      \
        attention_prefill_body<D>(qkv, ld_qkv, k_cache, v_cache, positions, row_table, block_tables,    \
                                  max_blocks, tiles, num_heads, num_kv_heads, block_size, scale, out_f32, \
                                  out_bf16);                                                             \
    }
ATT_PF_KERNEL(16)
ATT_PF_KERNEL(32)
ATT_PF_KERNEL(64)
ATT_PF_KERNEL(128)
