// Paged GQA attention for rows that each attend to their own sequence's positions
// 0..=positions[row] through a block table (decode: one row per sequence; prefill: one row per
// prompt token, all sharing one table). Split over the context (flash-decoding): block
// (row, kv_head, split) covers a contiguous share of the positions for the query heads of one
// KV group, with an online softmax; attn_combine merges the splits. How many splits a row uses
// depends on its context length alone (one per ATT_SPLIT_MIN positions, at most gridDim.z), so
// a row's result does not depend on the batch it is in, and one captured graph serves every
// step: blocks past a row's split count return at once.
#define ATT_MAXG 8   // query heads per KV head
#define ATT_MAXT 4   // head_dim <= 128: lane holds dims lane + 32 t
#define ATT_SPLIT_MIN 32

__device__ __forceinline__ int att_splits(int ctx, int max_splits) {
    return min(max_splits, max(1, (ctx + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN));
}

// One warp per block. Scores: a lane per position (the whole K row, 16-byte loads, against the
// group's queries in shared memory, so no shuffles per dot product); softmax across the warp;
// values: lanes across the head dimension, each position's weight broadcast by a shuffle.
// part_o: [rows][H][S][D] f32 (unnormalised), part_ml: [rows][H][S][2] (max, sum); S = gridDim.z.
extern "C" __global__ void __launch_bounds__(32)
attn_partial(const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache,
             const bf16* __restrict__ v_cache, const int* __restrict__ positions,
             const int* __restrict__ row_table, const int* __restrict__ block_tables, int max_blocks,
             int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
             float* __restrict__ part_o, float* __restrict__ part_ml) {
    extern __shared__ float qs[];  // [g][D], pre-scaled
    const int row = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int g = num_heads / num_kv_heads;
    const int lane = threadIdx.x;
    const int ctx = positions[row] + 1;
    const int used = att_splits(ctx, S);
    if (s >= used) return;
    const int per = (ctx + used - 1) / used;
    const int start = s * per;
    const int end = min(ctx, start + per);
    const int* table = block_tables + (size_t)row_table[row] * max_blocks;
    const float* q = qkv + (size_t)row * ld_qkv + (size_t)kvh * g * head_dim;
    for (int i = lane; i < g * head_dim; i += 32) qs[i] = q[i] * scale;
    __syncwarp();
    const size_t head_stride = (size_t)block_size * head_dim;
    const size_t block_stride = (size_t)num_kv_heads * head_stride;
    const bf16* kbase = k_cache + (size_t)kvh * head_stride;
    const bf16* vbase = v_cache + (size_t)kvh * head_stride;

    float m[ATT_MAXG], l[ATT_MAXG], acc[ATT_MAXG][ATT_MAXT];
#pragma unroll
    for (int h = 0; h < ATT_MAXG; h++) {
        m[h] = -INF_F;
        l[h] = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_MAXT; t++) acc[h][t] = 0.0f;
    }
    for (int base = start; base < end; base += 32) {
        const int pos = base + lane;
        const bool valid = pos < end;
        float sc[ATT_MAXG];
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) sc[h] = 0.0f;
        // This lane's position's row offset in the cache, shared with the value loop below so
        // that it does not look the block table up again, position by position.
        const long long off = valid ? (long long)table[pos / block_size] * (long long)block_stride +
                                          (long long)(pos % block_size) * head_dim
                                    : 0;
        if (valid) {
            const uint4* k4 = reinterpret_cast<const uint4*>(kbase + off);
            for (int c = 0; c < head_dim / 8; c++) {
                const uint4 kv = k4[c];
                const float k0 = bf_lo(kv.x), k1 = bf_hi(kv.x), k2 = bf_lo(kv.y), k3 = bf_hi(kv.y);
                const float k5 = bf_lo(kv.z), k6 = bf_hi(kv.z), k7 = bf_lo(kv.w), k8 = bf_hi(kv.w);
#pragma unroll
                for (int h = 0; h < ATT_MAXG; h++) {
                    if (h < g) {
                        const float4* qh = reinterpret_cast<const float4*>(qs + h * head_dim) + 2 * c;
                        const float4 a = qh[0], b = qh[1];
                        sc[h] += a.x * k0 + a.y * k1 + a.z * k2 + a.w * k3 + b.x * k5 + b.y * k6 + b.z * k7 + b.w * k8;
                    }
                }
            }
        }
        float p[ATT_MAXG];
#pragma unroll
        for (int h = 0; h < ATT_MAXG; h++) {
            p[h] = 0.0f;
            if (h < g) {
                const float sh = valid ? sc[h] : -INF_F;
                const float mnew = fmaxf(m[h], warp_max(sh));
                const float corr = expf(m[h] - mnew);  // 0 on the first chunk (m = -inf)
                p[h] = valid ? expf(sh - mnew) : 0.0f;
                l[h] = l[h] * corr + warp_sum(p[h]);
                m[h] = mnew;
#pragma unroll
                for (int t = 0; t < ATT_MAXT; t++) acc[h][t] *= corr;
            }
        }
        const int n = min(32, end - base);
#pragma unroll 8
        for (int j = 0; j < n; j++) {
            const bf16* v = vbase + __shfl_sync(0xffffffffu, off, j);
            float vd[ATT_MAXT];
#pragma unroll
            for (int t = 0; t < ATT_MAXT; t++) {
                const int d = lane + 32 * t;
                vd[t] = d < head_dim ? bf2f(v[d]) : 0.0f;
            }
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) {
                if (h < g) {
                    const float w = __shfl_sync(0xffffffffu, p[h], j);
#pragma unroll
                    for (int t = 0; t < ATT_MAXT; t++) acc[h][t] = fmaf(w, vd[t], acc[h][t]);
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < ATT_MAXG; h++) {
        if (h < g) {
            const size_t idx = ((size_t)row * num_heads + kvh * g + h) * S + s;
#pragma unroll
            for (int t = 0; t < ATT_MAXT; t++) {
                const int d = lane + 32 * t;
                if (d < head_dim) part_o[idx * head_dim + d] = acc[h][t];
            }
            if (lane == 0) {
                part_ml[idx * 2] = m[h];
                part_ml[idx * 2 + 1] = l[h];
            }
        }
    }
}

// out[row][h*D + d] = sum_s exp(m_s - M) o_s[d] / sum_s exp(m_s - M) l_s over the row's splits.
// Grid (rows, H); S is the partial kernel's gridDim.z.
extern "C" __global__ void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                        const int* __restrict__ positions, int S, int num_heads, int head_dim,
                                        float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    const int row = blockIdx.x, h = blockIdx.y;
    const int used = att_splits(positions[row] + 1, S);
    const size_t base = ((size_t)row * num_heads + h) * S;
    float M = -INF_F;
    for (int s = 0; s < used; s++) M = fmaxf(M, part_ml[(base + s) * 2]);
    float L = 0.0f;
    for (int s = 0; s < used; s++) L += expf(part_ml[(base + s) * 2] - M) * part_ml[(base + s) * 2 + 1];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < used; s++) o += expf(part_ml[(base + s) * 2] - M) * part_o[(base + s) * head_dim + d];
        const float v = o / L;
        const size_t at = ((size_t)row * num_heads + h) * head_dim + d;
        if (out_f32) out_f32[at] = v;
        if (out_bf16) out_bf16[at] = f2bf(v);
    }
}
