// Paged GQA attention for rows that each attend to their own sequence's positions
// 0..=positions[row] through a block table (decode: one row per sequence; prefill: one row per
// prompt token, all sharing one table). Split over the context (flash-decoding): block
// (row, kv_head, split) covers a contiguous share of the positions for the query heads of one
// KV group. Inside a block the warps take interleaved steps of positions, each with an online
// softmax of its own, and are merged in shared memory; across blocks, the last split of a
// (row, KV head) to finish merges the splits, so there is no separate combine pass.
// How many splits a row uses depends on its context length alone (one per ATT_SPLIT_MIN
// positions, at most gridDim.z), so a row's result does not depend on the batch it is in, and
// one captured graph serves every step: blocks past a row's split count return at once.
// ATT_MAXG (query heads per KV head at most: kernels for G = 1, 2, 4, 8, the next power of two),
// ATT_WARPS (warps per block), ATT_SPLIT_MIN (positions per split) and ATT_MAX_SPLITS (the grid's
// depth at most: one lane per split) are plan.rs's, defined by the engine (-D).
static_assert(ATT_MAXG == 8, "attention_g{1,2,4,8} below cover ATT_MAXG query heads per KV head");
static_assert(ATT_MAX_SPLITS <= 32, "the split merge gives each split one lane");

// The test-only fault injector (engine/src/fault.rs, docs/ENGINE.md), compiled in by -D:
// FAULT_ROPE_SHIFT rotates a decode step's q and k at position p + 1; FAULT_KV_GROUP has query
// group q read KV head (q + 1) % num_kv_heads; FAULT_NAN_PAST_512 makes the output NaN for query
// positions >= 512. Without them these helpers are the identity.
#ifdef FAULT_ROPE_SHIFT
#define ATT_DECODE_ROPE_SHIFT 1
#else
#define ATT_DECODE_ROPE_SHIFT 0
#endif

__device__ __forceinline__ int att_kv_head(int group, int num_kv_heads) {
#ifdef FAULT_KV_GROUP
    return (group + 1) % num_kv_heads;
#else
    return group;
#endif
}

__device__ __forceinline__ float att_out(float v, int pos) {
#ifdef FAULT_NAN_PAST_512
    if (pos >= 512) return __int_as_float(0x7fffffff);
#endif
    return v;
}

__device__ __forceinline__ void att_store(float* out_f32, bf16* out_bf16, size_t at, float v) {
    if (out_f32) out_f32[at] = v;
    if (out_bf16) out_bf16[at] = f2bf(v);
}

// Whether this block, its split's partial results written, is the last of the `used` split
// blocks counted at `count` to arrive (`ticket`: the block's shared slot): that one merges the
// splits and resets the count to zero for the next launch.
__device__ __forceinline__ bool att_last_split(int* count, int used, int& ticket) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(count, 1);
    __syncthreads();
    if (ticket != used - 1) return false;
    __threadfence();
    if (threadIdx.x == 0) *count = 0;
    return true;
}

// The splits' merge, by the last block to arrive (att_last_split) of a row's KV head: one warp
// per query head weighs the splits (lane j: split j), then each thread sums its dimensions'
// partial outputs with every split's load in flight at once (a loop over `used` had waited for
// each load in turn). heads: the group's first query head among all rows' (row * num_heads +
// qg * g); part_o [heads][S][head_dim] and part_ml [heads][S][2] as the splits wrote them;
// wsplit: [g][ATT_MAX_SPLITS] of shared memory that the block no longer reads.
__device__ __forceinline__ void att_merge_splits(const float* part_o, const float* part_ml,
                                                 size_t heads, int g, int head_dim, int S, int used, int pos,
                                                 int warps, float* wsplit, float* out_f32,
                                                 bf16* out_bf16) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int h = warp; h < g; h += warps) {
        const size_t base = (heads + h) * S;
        const float mj = lane < used ? __ldcg(part_ml + (base + lane) * 2) : -INF_F;
        const float lj = lane < used ? __ldcg(part_ml + (base + lane) * 2 + 1) : 0.0f;
        const float M = warp_max(mj);
        const float e = lane < used ? expf(mj - M) : 0.0f;
        wsplit[h * ATT_MAX_SPLITS + lane] = e / warp_sum(e * lj);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g * head_dim; i += blockDim.x) {
        const int h = i / head_dim, d = i - h * head_dim;
        const size_t base = (heads + h) * S;
        float v[ATT_MAX_SPLITS];
#pragma unroll
        for (int j = 0; j < ATT_MAX_SPLITS; j++) v[j] = j < used ? __ldcg(part_o + (base + j) * head_dim + d) : 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MAX_SPLITS; j++) o = fmaf(wsplit[h * ATT_MAX_SPLITS + j], v[j], o);
        att_store(out_f32, out_bf16, (heads + h) * head_dim + d, att_out(o, pos));
    }
}

// Decode's new position, by warp 0 (k) or 1 (v) of the block that holds it: its raw values at
// `v` (f32) get their bias, norm and rotation as rope_kv gives them (rope_head), and are written
// to the cache at `at` and, as cached (bf16), to kv_new[warp][head_dim] for the block's own use.
__device__ __forceinline__ void att_new_kv(float* v, int warp, int kvh, int num_heads, int num_kv_heads, int head_dim,
                                           const bf16* __restrict__ bias, const bf16* __restrict__ q_norm,
                                           const bf16* __restrict__ k_norm, float eps, const RopeAngles& rot, int lane,
                                           bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, size_t at,
                                           bf16* kv_new) {
    rope_head(v, num_heads + warp * num_kv_heads + kvh, num_heads, num_kv_heads, head_dim, bias, q_norm, k_norm, eps,
              rot, lane);
    bf16* dst = (warp == 0 ? k_cache : v_cache) + at;
    for (int d = lane; d < head_dim; d += 32) {
        const bf16 b = f2bf(v[d]);
        dst[d] = b;
        kv_new[warp * head_dim + d] = b;
    }
}

__device__ __forceinline__ int att_splits(int ctx, int max_splits) {
    return min(max_splits, max(1, (ctx + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN));
}

// Scores and values: a position's K and V rows are spread over a group of lanes, 16 bytes each,
// which hold the same 8 dimensions of the group's queries in registers; a score is summed over
// its group by shuffles. Decode's step is a chain of short dependent loads, so the work of one
// position is spread wide rather than looped over by one lane.
// part_o: [rows][H][S][D] f32 (unnormalised), part_ml: [rows][H][S][2] (max, sum); S = gridDim.z.
// counts: [rows][KVH] arrival tickets, zero between launches (the merging block resets its own).
// out: [rows][H * D], f32 and/or bf16 (null: not written).
// inv_freq null: q was rotated and k/v written by rope_kv (prefill); else this kernel does it
// (decode, one row per sequence).
// Dynamic shared memory (plan.rs attention_smem_bytes): queries [g][D], the warps' outputs
// [ATT_WARPS][g][D] and their (max, sum) [ATT_WARPS][g][2], all f32.
template <int G>
__device__ __forceinline__ void attention_body(const float* __restrict__ qkv, int ld_qkv, bf16* __restrict__ k_cache,
          bf16* __restrict__ v_cache, const int* __restrict__ positions,
          const int* __restrict__ row_table, const int* __restrict__ block_tables, int max_blocks,
          int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
          float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counts,
          float* __restrict__ out_f32, bf16* __restrict__ out_bf16, const bf16* __restrict__ bias,
          const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm, float eps,
          const float* __restrict__ inv_freq) {
    extern __shared__ float smem[];
    __shared__ int ticket;
    float freq[2] = {0.0f, 0.0f};
    if (inv_freq) rope_freqs(inv_freq, head_dim / 2, threadIdx.x & 31, freq);
    pdl_launch_dependents();
    pdl_wait();
    // Block y holds query group y (its g query heads) and reads KV head kvh: the same one but
    // under FAULT_KV_GROUP.
    const int row = blockIdx.x, qg = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int kvh = att_kv_head(qg, num_kv_heads);
    const int g = num_heads / num_kv_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gd = g * head_dim;
    // What depends only on the kernel before is loaded at once: the row's position and block
    // table, this group's queries and (decode) the new k and v. Nothing waits for any of it yet.
    constexpr int QPT = G * MAX_HEAD_DIM / (32 * ATT_WARPS);  // queries per thread at most
    const float* q = qkv + (size_t)row * ld_qkv + (size_t)qg * gd;
    const float* kv = qkv + (size_t)row * ld_qkv + (size_t)(num_heads + kvh) * head_dim;
    float qv[QPT];
#pragma unroll
    for (int k = 0; k < QPT; k++) {
        const int i = threadIdx.x + k * 32 * ATT_WARPS;
        qv[k] = i < gd ? q[i] : 0.0f;
    }
    const bool has_kv = inv_freq != nullptr && (int)threadIdx.x < head_dim;
    const float k_raw = has_kv ? kv[threadIdx.x] : 0.0f;
    const float v_raw = has_kv ? kv[(size_t)num_kv_heads * head_dim + threadIdx.x] : 0.0f;
    const int ctx = positions[row] + 1;
    const int* table = block_tables + (size_t)row_table[row] * max_blocks;
    const int used = att_splits(ctx, S);
    if (s >= used) return;
    // Balanced shares (plan.rs attention_split): with used <= ctx no split is empty. (Shares of
    // ceil(ctx / used) left the last splits empty for some lengths, and an empty split's
    // max of -inf made the merge NaN.)
    const int start = (int)((long long)s * ctx / used);
    const int end = (int)((long long)(s + 1) * ctx / used);
    float* qs = smem;                       // [g][D], pre-scaled
    float* wo = qs + gd;                    // [ATT_WARPS][g][D]
    float* wml = wo + ATT_WARPS * gd;       // [ATT_WARPS][g][2]
    __shared__ __align__(16) bf16 kv_new[2 * MAX_HEAD_DIM];  // decode: the new position's k and v, as cached
    const size_t head_stride = (size_t)block_size * head_dim;
    const size_t block_stride = (size_t)num_kv_heads * head_stride;
    const bf16* kbase = k_cache + (size_t)kvh * head_stride;
    const bf16* vbase = v_cache + (size_t)kvh * head_stride;
    // Decode (inv_freq set): this row's q heads of the group, and on the split holding the new
    // position its k and v, get their bias, norm and rotation here (rope_kv.cu's rope_head), and
    // k and v are written to the cache; this block takes the new position's k and v from shared
    // memory, so nothing waits for that write.
    const int pos = ctx - 1;
    const bool writes_kv = inv_freq != nullptr && s == used - 1;

    // A position's K (and V) row is read by `lpp` lanes, 8 dimensions (16 bytes) each, so a warp
    // takes 32 / lpp positions per step with one load of K and one of V per lane, and the loads
    // of the next step are in flight while this one is used.
    const int dl = head_dim >> 3;
    int lpp = 1;
    while (lpp < dl) lpp <<= 1;
    const int ppw = 32 / lpp, step = ppw * ATT_WARPS;
    const int sub = lane & (lpp - 1), slot = lane / lpp;
    const bool has_dims = sub < dl;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 kn = zero, vn = zero;
    int base = start + warp * ppw;
    auto fetch_in = [&](int p, int cache_block) {
        if (p < end && has_dims) {
            const long long off = (long long)cache_block * (long long)block_stride +
                                  (long long)(p % block_size) * head_dim + 8 * sub;
            kn = *reinterpret_cast<const uint4*>(kbase + off);
            vn = *reinterpret_cast<const uint4*>(vbase + off);
        } else {
            kn = zero;
            vn = zero;
        }
    };
    // A position's cache block, looked up a step before its K/V are loaded, so no load waits
    // for the block table.
    auto cache_block = [&](int p) { return p < end && has_dims ? table[p / block_size] : 0; };
    // The cache blocks of the new position and of the first two steps are loaded now and used
    // after the first barrier (the new position's K/V read there is stale and replaced below).
    const int new_block = writes_kv ? table[pos / block_size] : 0;
    const int first = base + slot;
    const int first_block = cache_block(first);
    int next_block = cache_block(first + step);

#pragma unroll
    for (int k = 0; k < QPT; k++) {
        const int i = threadIdx.x + k * 32 * ATT_WARPS;
        if (i < gd) qs[i] = inv_freq ? qv[k] : qv[k] * scale;
    }
    if (writes_kv && has_kv) {
        wo[threadIdx.x] = k_raw;
        wo[head_dim + threadIdx.x] = v_raw;
    }
    __syncthreads();
    fetch_in(first, first_block);
    if (inv_freq) {
        const RopeAngles rot = rope_angles(freq, pos + ATT_DECODE_ROPE_SHIFT);
        for (int h = warp; h < g; h += ATT_WARPS) {
            float* qh = qs + h * head_dim;
            rope_head(qh, qg * g + h, num_heads, num_kv_heads, head_dim, bias, q_norm, k_norm, eps, rot, lane);
            for (int d = lane; d < head_dim; d += 32) qh[d] *= scale;
        }
        if (writes_kv && warp < 2)
            att_new_kv(wo + warp * head_dim, warp, kvh, num_heads, num_kv_heads, head_dim, bias, q_norm, k_norm, eps,
                       rot, lane, k_cache, v_cache,
                       (size_t)new_block * block_stride + (size_t)kvh * head_stride +
                           (size_t)(pos % block_size) * head_dim,
                       kv_new);
        __syncthreads();
    }
    uint4 k_new = zero, v_new = zero;
    if (writes_kv && has_dims) {
        k_new = reinterpret_cast<const uint4*>(kv_new)[sub];
        v_new = reinterpret_cast<const uint4*>(kv_new + head_dim)[sub];
    }

    // Heads past g (g not a power of two) run on zero queries and are never written: no branch
    // on the head, so the compiler interleaves the heads' dependent chains.
    float qr[G][8], m[G], l[G], acc[G][8];
#pragma unroll
    for (int h = 0; h < G; h++) {
        m[h] = -INF_F;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            qr[h][j] = (h < g && has_dims) ? qs[h * head_dim + 8 * sub + j] : 0.0f;
            acc[h][j] = 0.0f;
        }
    }
    for (; base < end; base += step) {
        const bool valid = base + slot < end;
        uint4 k = kn, v = vn;
        if (writes_kv && base + slot == pos) {
            k = k_new;
            v = v_new;
        }
        fetch_in(base + step + slot, next_block);
        next_block = cache_block(base + 2 * step + slot);
        const float kf[8] = {bf_lo(k.x), bf_hi(k.x), bf_lo(k.y), bf_hi(k.y),
                             bf_lo(k.z), bf_hi(k.z), bf_lo(k.w), bf_hi(k.w)};
        const float vf[8] = {bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y),
                             bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w)};
        float sc[G];
#pragma unroll
        for (int h = 0; h < G; h++) {
            sc[h] = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) sc[h] = fmaf(qr[h][j], kf[j], sc[h]);
        }
        for (int o = lpp >> 1; o > 0; o >>= 1) {
#pragma unroll
            for (int h = 0; h < G; h++) sc[h] += __shfl_xor_sync(0xffffffffu, sc[h], o);
        }
        // Each slot keeps its own running max and sum, so a step needs no reduction across the
        // warp; the slots are merged once, below. A slot past the end keeps its state exactly.
#pragma unroll
        for (int h = 0; h < G; h++) {
            const float mnew = valid ? fmaxf(m[h], sc[h]) : m[h];
            const float corr = valid ? expf(m[h] - mnew) : 1.0f;  // 0 on the slot's first position
            const float p = valid ? expf(sc[h] - mnew) : 0.0f;
            l[h] = l[h] * corr + p;
            m[h] = mnew;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h][j] = fmaf(p, vf[j], acc[h][j] * corr);
        }
    }
    // Merge the warp's slots (a slot that had no position has max -inf and weighs 0): lanes with
    // the same `sub` hold the same dimensions. Every head and dimension at each shuffle level,
    // so the shuffles are independent and overlap.
    float M[G], lw[G];
#pragma unroll
    for (int h = 0; h < G; h++) M[h] = m[h];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int h = 0; h < G; h++) M[h] = fmaxf(M[h], __shfl_xor_sync(0xffffffffu, M[h], o));
    }
#pragma unroll
    for (int h = 0; h < G; h++) {
        const float e = m[h] == -INF_F ? 0.0f : expf(m[h] - M[h]);
        lw[h] = l[h] * e;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[h][j] *= e;
    }
    for (int o = lpp; o < 32; o <<= 1) {
#pragma unroll
        for (int h = 0; h < G; h++) {
            lw[h] += __shfl_xor_sync(0xffffffffu, lw[h], o);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], o);
        }
    }
#pragma unroll
    for (int h = 0; h < G; h++) {
        if (h < g) {
            if (slot == 0 && has_dims) {
#pragma unroll
                for (int j = 0; j < 8; j++) wo[(warp * g + h) * head_dim + 8 * sub + j] = acc[h][j];
            }
            if (lane == 0) {
                wml[(warp * g + h) * 2] = M[h];
                wml[(warp * g + h) * 2 + 1] = lw[h];
            }
        }
    }
    __syncthreads();
    // Merge the warps (a warp that had no position has max -inf and weighs 0; warp 0 always
    // has one): out = sum_w e_w o_w / sum_w e_w l_w with e_w = exp(m_w - M), warps in order.
    for (int i = threadIdx.x; i < gd; i += blockDim.x) {
        const int h = i / head_dim, d = i - h * head_dim;
        float M = -INF_F;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, wml[(w * g + h) * 2]);
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            const float e = expf(wml[(w * g + h) * 2] - M);
            L += e * wml[(w * g + h) * 2 + 1];
            o += e * wo[(w * g + h) * head_dim + d];
        }
        const int head = qg * g + h;
        if (used == 1) {
            att_store(out_f32, out_bf16, ((size_t)row * num_heads + head) * head_dim + d, att_out(o / L, pos));
        } else {
            const size_t idx = ((size_t)row * num_heads + head) * S + s;
            part_o[idx * head_dim + d] = o;
            if (d == 0) {
                part_ml[idx * 2] = M;
                part_ml[idx * 2 + 1] = L;
            }
        }
    }
    if (used == 1) return;
    // The last of the row's `used` split blocks for this KV head merges the splits, in order.
    if (!att_last_split(counts + (size_t)row * num_kv_heads + kvh, used, ticket)) return;
    // The warps' outputs are merged already, so their memory takes the splits' weights.
    att_merge_splits(part_o, part_ml, (size_t)row * num_heads + qg * g, g, head_dim, S, used, pos, ATT_WARPS, wo,
                     out_f32, out_bf16);
}

#define ATT_KERNEL(G)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attention_g##G(                       \
        const float* __restrict__ qkv, int ld_qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, \
        const int* __restrict__ positions, const int* __restrict__ row_table,                          \
        const int* __restrict__ block_tables, int max_blocks, int num_heads, int num_kv_heads,         \
        int head_dim, int block_size, float scale, float* __restrict__ part_o,                         \
        float* __restrict__ part_ml, int* __restrict__ counts, float* __restrict__ out_f32,            \
        bf16* __restrict__ out_bf16, const bf16* __restrict__ bias, const bf16* __restrict__ q_norm,   \
        const bf16* __restrict__ k_norm, float eps, const float* __restrict__ inv_freq) {              \
        attention_body<G>(qkv, ld_qkv, k_cache, v_cache, positions, row_table, block_tables,          \
                          max_blocks, num_heads, num_kv_heads, head_dim, block_size, scale, part_o,   \
                          part_ml, counts, out_f32, out_bf16, bias, q_norm, k_norm, eps, inv_freq);   \
    }
ATT_KERNEL(1)
ATT_KERNEL(2)
ATT_KERNEL(4)
ATT_KERNEL(8)
