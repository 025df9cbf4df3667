// Paged GQA attention for rows that each attend to their own sequence's positions
// 0..=positions[row] through a block table (decode: one row per sequence; prefill: one row per
// prompt token, all sharing one table). Split over the context (flash-decoding): block
// (row, kv_head, split) covers a contiguous share of the positions for the query heads of one
// KV group, with an online softmax; attn_combine merges the splits. How many splits a row uses
// depends on its context length alone (one per ATT_SPLIT_MIN positions, at most gridDim.z), so
// a row's result does not depend on the batch it is in, and one captured graph serves every
// step: blocks past a row's split count return at once.
#define ATT_TILE 64
#define ATT_MAXG 16
#define ATT_MAXJ 8  // head_dim <= 256
#define ATT_THREADS 128
#define ATT_SPLIT_MIN 32

__device__ __forceinline__ int att_splits(int ctx, int max_splits) {
    return min(max_splits, max(1, (ctx + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN));
}

// part_o: [rows][H][S][D] f32 (unnormalised), part_ml: [rows][H][S][2] (max, sum); S = gridDim.z.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_partial(const float* __restrict__ qkv, int ld_qkv, const bf16* __restrict__ k_cache,
             const bf16* __restrict__ v_cache, const int* __restrict__ positions,
             const int* __restrict__ row_table, const int* __restrict__ block_tables, int max_blocks,
             int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
             float* __restrict__ part_o, float* __restrict__ part_ml) {
    extern __shared__ float smem[];
    const int row = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int g = num_heads / num_kv_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float* qs = smem;                    // [g][D], pre-scaled
    float* sc = smem + g * head_dim;     // [g][ATT_TILE]
    const int ctx = positions[row] + 1;
    const int used = att_splits(ctx, S);
    if (s >= used) return;
    const int per = (ctx + used - 1) / used;
    const int start = s * per;
    const int end = min(ctx, start + per);
    const int* table = block_tables + (size_t)row_table[row] * max_blocks;
    const float* q = qkv + (size_t)row * ld_qkv + (size_t)kvh * g * head_dim;
    for (int i = threadIdx.x; i < g * head_dim; i += blockDim.x) qs[i] = q[i] * scale;
    __syncthreads();

    float m[ATT_MAXG], l[ATT_MAXG], acc[ATT_MAXG][2];
#pragma unroll
    for (int h = 0; h < ATT_MAXG; h++) { m[h] = -INF_F; l[h] = 0.0f; acc[h][0] = 0.0f; acc[h][1] = 0.0f; }

    for (int t0 = start; t0 < end; t0 += ATT_TILE) {
        const int n = min(ATT_TILE, end - t0);
        // Scores: a warp per position, lanes across the head dimension.
        for (int p = warp; p < n; p += nwarps) {
            const int pos = t0 + p;
            const bf16* k = k_cache + (((size_t)table[pos / block_size] * num_kv_heads + kvh) * block_size +
                                       pos % block_size) * head_dim;
            float kv[ATT_MAXJ];
#pragma unroll
            for (int j = 0; j < ATT_MAXJ; j++) {
                const int d = lane + 32 * j;
                kv[j] = d < head_dim ? bf2f(k[d]) : 0.0f;
            }
            for (int h = 0; h < g; h++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < ATT_MAXJ; j++) {
                    const int d = lane + 32 * j;
                    if (d < head_dim) dot = fmaf(qs[h * head_dim + d], kv[j], dot);
                }
                dot = warp_sum(dot);
                if (lane == 0) sc[h * ATT_TILE + p] = dot;
            }
        }
        __syncthreads();
        // Online softmax: every thread keeps the same running max and sum per head.
        float corr[ATT_MAXG], mnew[ATT_MAXG];
        for (int h = 0; h < g; h++) {
            float mt = -INF_F;
            for (int p = 0; p < n; p++) mt = fmaxf(mt, sc[h * ATT_TILE + p]);
            mnew[h] = fmaxf(m[h], mt);
            corr[h] = expf(m[h] - mnew[h]);  // exp(-inf) = 0 on the first tile
        }
        __syncthreads();
        for (int i = threadIdx.x; i < g * n; i += blockDim.x) {
            const int h = i / n, p = i % n;
            sc[h * ATT_TILE + p] = expf(sc[h * ATT_TILE + p] - mnew[h]);
        }
        __syncthreads();
        for (int h = 0; h < g; h++) {
            float sum = 0.0f;
            for (int p = 0; p < n; p++) sum += sc[h * ATT_TILE + p];
            l[h] = l[h] * corr[h] + sum;
            m[h] = mnew[h];
            acc[h][0] *= corr[h];
            acc[h][1] *= corr[h];
        }
        // Values: a thread per head dimension (two when head_dim > 128), every head of the group.
        for (int p = 0; p < n; p++) {
            const int pos = t0 + p;
            const bf16* v = v_cache + (((size_t)table[pos / block_size] * num_kv_heads + kvh) * block_size +
                                       pos % block_size) * head_dim;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int d = threadIdx.x + ATT_THREADS * j;
                if (d < head_dim) {
                    const float vd = bf2f(v[d]);
                    for (int h = 0; h < g; h++) acc[h][j] = fmaf(sc[h * ATT_TILE + p], vd, acc[h][j]);
                }
            }
        }
        __syncthreads();
    }
    for (int h = 0; h < g; h++) {
        const size_t idx = ((size_t)row * num_heads + kvh * g + h) * S + s;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int d = threadIdx.x + ATT_THREADS * j;
            if (d < head_dim) part_o[idx * head_dim + d] = acc[h][j];
        }
        if (threadIdx.x == 0) {
            part_ml[idx * 2] = m[h];
            part_ml[idx * 2 + 1] = l[h];
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
