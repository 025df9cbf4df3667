// Decode attention on the tensor cores, for every step past batch 1 (on the GEMVs and on cuBLAS). attention.cu walks a position a lane
// group at a time on the CUDA cores, a chain of dependent loads and shuffles; at batch 32 it read
// the 8B's K/V at 0.7 TB/s (docs/ENGINE.md, sessions 15-17). Here the query heads of a KV group
// are the rows of an m16n8k16 tile (rows past them zero, never stored), and each warp streams
// chunks of 16 positions through two stages of its own shared memory by cp.async.
//
// Block (row, KV head, split). A split is a run of whole chunks: ATT_BATCH_SPLIT positions each,
// at most gridDim.z splits, in balanced shares of the row's chunks, so a row's splits, and with
// them its bits, depend on its context alone, whatever the batch. The four warps take every
// fourth chunk of the split, each with an online softmax of its own; the warps are merged in
// shared memory, and the splits, as attention.cu does, by the last block of the (row, KV head)
// to finish, from part_o [rows][H][S][D] and part_ml [rows][H][S][2] (counts [rows][KVH], zero
// between launches; the merging block resets its own).
//
// The engine's form (ROPE) also does rope_kv's work for its row, as attention.cu's decode does:
// bias, q/k norm and rotation of the group's query heads in shared memory, after the stages are
// issued; the last split's block writes the new position's K and V to the cache (rope_kv.cu's
// rope_head, so the same bits as rope_kv or a prefill would write) and lays them over its staged
// chunk, where the cache held the position's old contents. One launch where rope_kv and this were
// two: 4-7 us a layer less at batch 8 on an H100, alone (docs/ENGINE.md, session 41).
//
// q (f32, rotated) and p are split into
// two bf16 terms through two mma into f32 accumulators, and K and V are the cache's bf16, as in
// attention_prefill.cu. out: [rows][H * D], f32 and/or bf16 (null: not written). Dynamic shared
// memory: plan.rs attention_batch_smem_bytes.
#define ATT_BATCH_WARPS 4

// SPLIT: positions per split (the engine's ATT_BATCH_SPLIT; scripts/gemv-bench times others).
// ROPE: the rotation and K/V write folded in (the engine's); without it (scripts/gemv-bench's
// variants.cu only) q is read as rope_kv left it, which also wrote the new K and V.
template <int D, int SPLIT, bool ROPE>
__device__ __forceinline__ void attention_batch_body(
    const float* __restrict__ qkv, int ld_qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
    const int* __restrict__ positions, const int* __restrict__ row_table, const int* __restrict__ block_tables,
    int max_blocks, int num_heads, int num_kv_heads, int block_size, float scale, float* __restrict__ part_o,
    float* __restrict__ part_ml, int* __restrict__ counts, float* __restrict__ out_f32, bf16* __restrict__ out_bf16,
    const bf16* __restrict__ bias, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm, float eps,
    const float* __restrict__ inv_freq) {
    constexpr int KS = D / 16, DN = D / 8, LD = D + 8, STAGE = 2 * 16 * LD;
    extern __shared__ __align__(16) unsigned char att_batch_smem[];
    __shared__ int ticket;
    float freq[2] = {0.0f, 0.0f};
    if (ROPE) rope_freqs(inv_freq, D / 2, threadIdx.x & 31, freq);
    // No pdl_launch_dependents: the next kernel launches when this grid ends. Letting the GEMV
    // after it launch at this kernel's start cost Llama-3.1-8B's GEMV step at batch 8 2.6 ms
    // (8.95 against 5.99 ms, H100, session 45; the 1B's 2.4%).
    pdl_wait();
    // Block y holds query group y and reads KV head kvh: the same one but under FAULT_KV_GROUP.
    const int row = blockIdx.x, qg = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int kvh = att_kv_head(qg, num_kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = num_heads / num_kv_heads;
    bf16* stages = reinterpret_cast<bf16*>(att_batch_smem) + warp * 2 * STAGE;
    const int pos = positions[row], ctx = pos + 1, chunks = (ctx + 15) / 16;
    static_assert(SPLIT % 16 == 0, "a split is whole chunks of 16 positions");
    const int used = min(S, (ctx + SPLIT - 1) / SPLIT);
    if (z >= used) return;
    // used <= chunks, so no split is empty.
    const int c_begin = (int)((long long)z * chunks / used), c_end = (int)((long long)(z + 1) * chunks / used);
    const int* table = block_tables + (size_t)row_table[row] * max_blocks;
    const size_t head_stride = (size_t)block_size * D, block_stride = (size_t)num_kv_heads * head_stride;
    const CacheBlocks cb(block_size);
    const bf16* kb = k_cache + (size_t)kvh * head_stride;
    const bf16* vb = v_cache + (size_t)kvh * head_stride;
    // Chunk c's 16 positions of K and V into stage s, 16 bytes a copy; positions past the context
    // are zero-filled (masked below; a zero V keeps 0 * V finite). Where the cache's blocks are
    // whole chunks (block_size a multiple of 16, the engine's 16 among them), a chunk is one run
    // of 16 rows in one block: one table lookup, and each lane's copies at fixed strides from it.
    // A lookup per copy had made staging the larger half of the loop's instructions (ncu, session 43).
    // Two loops rather than one choosing per copy: that one spilled 28 bytes at D 128.
    const bool whole_chunks = block_size % 16 == 0;
    auto stage_chunk = [&](int c, int s) {
        bf16* kd = stages + s * STAGE;
        bf16* vd = kd + 16 * LD;
        constexpr int LANES_ROW = D / 8, ROWS_STEP = 32 / LANES_ROW;
        const int r0 = lane / LANES_ROW, col = (lane % LANES_ROW) * 8, p0 = c * 16;
        if (whole_chunks) {
            const size_t base = (size_t)table[cb.block(p0)] * block_stride + (size_t)cb.slot(p0) * D + col;
#pragma unroll
            for (int j = 0; j < 16 / ROWS_STEP; j++) {
                const int r = r0 + j * ROWS_STEP;
                const bool ok = p0 + r < ctx;
                const size_t off = ok ? base + (size_t)r * D : 0;
                cp_async16(kd + r * LD + col, kb + off, ok);
                cp_async16(vd + r * LD + col, vb + off, ok);
            }
        } else {
            for (int j = 0; j < 16 / ROWS_STEP; j++) {
                const int r = r0 + j * ROWS_STEP, p = p0 + r;
                const bool ok = p < ctx;
                const size_t off = ok ? (size_t)table[cb.block(p)] * block_stride + (size_t)cb.slot(p) * D + col : 0;
                cp_async16(kd + r * LD + col, kb + off, ok);
                cp_async16(vd + r * LD + col, vb + off, ok);
            }
        }
        cp_async_commit();
    };
    const int c0 = c_begin + warp;
    if (c0 < c_end) stage_chunk(c0, 0);

    // This lane's two tile rows (fragment rows gr and gr + 8) are query heads qg * g + gr and
    // + 8 of the group.
    const int gr = lane >> 2, c2 = 2 * (lane & 3);
    const float* q = qkv + (size_t)row * ld_qkv + (size_t)qg * g * D;
    // ROPE: the group's query heads [g][D] and the new k and v [2][D], f32, past the stages; the
    // new k and v as cached (bf16) past them.
    float* qs = reinterpret_cast<float*>(att_batch_smem + (size_t)ATT_BATCH_WARPS * 2 * STAGE * 2);
    bf16* kv_new = reinterpret_cast<bf16*>(qs + (g + 2) * D);
    const bool writes_kv = ROPE && z == used - 1;
    if (ROPE) {
        // 16 bytes a load, the queries and the new k and v in one loop: a float a thread had
        // waited for each of its loads in turn (ncu, session 43).
        const float4* q4 = reinterpret_cast<const float4*>(q);
        const float4* kv4 = reinterpret_cast<const float4*>(qkv + (size_t)row * ld_qkv + (size_t)(num_heads + kvh) * D);
        const int nq = g * D / 4, n = nq + (writes_kv ? D / 2 : 0);
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            reinterpret_cast<float4*>(qs)[i] =
                i < nq ? q4[i] : kv4[(i - nq) / (D / 4) * (num_kv_heads * D / 4) + (i - nq) % (D / 4)];
        __syncthreads();
        const RopeAngles rot = rope_angles(freq, pos + ATT_DECODE_ROPE_SHIFT);
        for (int h = warp; h < g; h += ATT_BATCH_WARPS)
            rope_head(qs + h * D, qg * g + h, num_heads, num_kv_heads, D, bias, q_norm, k_norm, eps, rot, lane);
        if (writes_kv && warp < 2)
            att_new_kv(qs + (g + warp) * D, warp, kvh, num_heads, num_kv_heads, D, bias, q_norm, k_norm, eps, rot,
                       lane, k_cache, v_cache,
                       (size_t)table[cb.block(pos)] * block_stride + (size_t)kvh * head_stride +
                           (size_t)cb.slot(pos) * D,
                       kv_new);
        __syncthreads();
    }
    unsigned qh[KS][4], ql[KS][4];
    const float* qsrc = ROPE ? qs : q;
    q_fragments<KS>(qh, ql, gr < g ? qsrc + gr * D : nullptr, gr + 8 < g ? qsrc + (gr + 8) * D : nullptr, scale, c2);
    float o[DN][4];
#pragma unroll
    for (int d = 0; d < DN; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float ma = -INF_F, mb = -INF_F, la = 0.0f, lb = 0.0f;  // la, lb: this lane's share of the sums
    int s = 0;
    for (int c = c0; c < c_end; c += ATT_BATCH_WARPS, s ^= 1) {
        if (c + ATT_BATCH_WARPS < c_end) {
            stage_chunk(c + ATT_BATCH_WARPS, s ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        bf16* kt = stages + s * STAGE;
        bf16* vt = kt + 16 * LD;
        if (writes_kv && c == pos / 16) {
            // The new position's k and v over what the cache held when the chunk was staged.
            for (int i = lane; i < D / 8; i += 32) {
                reinterpret_cast<uint4*>(kt + (pos % 16) * LD)[i] = reinterpret_cast<const uint4*>(kv_new)[i];
                reinterpret_cast<uint4*>(vt + (pos % 16) * LD)[i] = reinterpret_cast<const uint4*>(kv_new + D)[i];
            }
            __syncwarp();
        }
        // The chunk's 16 positions are two n-tiles of S and one k-step of P.V. Positions past the
        // context masked; the chunk's first position is in it, so the maxima are finite.
        float sc[2][4];
        tile_scores<KS, 2, LD>(sc, qh, ql, kt, lane);
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool in = c * 16 + n * 8 + c2 + e < ctx;
                sc[n][e] = in ? sc[n][e] : -INF_F;
                sc[n][2 + e] = in ? sc[n][2 + e] : -INF_F;
            }
        }
        tile_softmax<2, DN>(sc, o, ma, mb, la, lb);
        tile_pv<2, DN, LD>(o, sc, vt, lane);
        __syncwarp();  // every lane is done with stage s before the chunk after next fills it
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    // Merge the warps in the stages' memory: [warp][16 rows][WP] outputs, [warp][16 rows][2]
    // (max, sum); a warp that had no chunk has max -inf and weighs 0 (warp 0 always has one). Rows
    // WP = D + 8 floats apart put a store's eight fragment rows in different banks (D apart, all
    // eight had been in the same ones).
    constexpr int WP = D + 8;
    static_assert(ATT_BATCH_WARPS * 16 * (WP + 2) * 4 <= ATT_BATCH_WARPS * 2 * STAGE * 2, "the merge fits the stages");
    __syncthreads();
    float* wo = reinterpret_cast<float*>(att_batch_smem);
    float* wml = wo + ATT_BATCH_WARPS * 16 * WP;
#pragma unroll
    for (int d = 0; d < DN; d++) {
        *reinterpret_cast<float2*>(wo + (warp * 16 + gr) * WP + d * 8 + c2) = make_float2(o[d][0], o[d][1]);
        *reinterpret_cast<float2*>(wo + (warp * 16 + gr + 8) * WP + d * 8 + c2) = make_float2(o[d][2], o[d][3]);
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
        for (int w = 0; w < ATT_BATCH_WARPS; w++) M = fmaxf(M, wml[(w * 16 + h) * 2]);
        float L = 0.0f, acc = 0.0f;
        for (int w = 0; w < ATT_BATCH_WARPS; w++) {
            const float m = wml[(w * 16 + h) * 2];
            const float e = m == -INF_F ? 0.0f : expf(m - M);
            L += e * wml[(w * 16 + h) * 2 + 1];
            acc += e * wo[(w * 16 + h) * WP + d];
        }
        const size_t head = (size_t)row * num_heads + qg * g + h;
        if (used == 1) {
            att_store(out_f32, out_bf16, head * D + d, att_out(acc / L, pos));
        } else {
            part_o[(head * S + z) * D + d] = acc;
            if (d == 0) {
                part_ml[(head * S + z) * 2] = M;
                part_ml[(head * S + z) * 2 + 1] = L;
            }
        }
    }
    if (used == 1) return;
    // The last of the row's blocks for this KV head merges the splits, as attention.cu does. (A
    // loop over the splits here had waited for each L2 load in turn, twice, for each of a
    // thread's outputs in turn: 1.7-2.6 us a layer at batches 8 and 32, session 42.)
    if (!att_last_split(counts + (size_t)row * num_kv_heads + kvh, used, ticket)) return;
    att_merge_splits(part_o, part_ml, (size_t)row * num_heads + qg * g, g, D, S, used, pos, ATT_BATCH_WARPS, wo,
                     out_f32, out_bf16);
}

// NAME: the kernel for head dim D at SPLIT positions a split, with the rotation and K/V write
// folded in (ROPE, the engine's: inv_freq as attention.cu's decode takes it), or (scripts/
// gemv-bench's variants.cu only) its rows rotated and their K/V written by rope_kv before it.
// ROPE asks for three blocks a multiprocessor at D 128, what the other form gets unasked (168
// registers): unbounded, the rotation took D 128 to 204 registers and two blocks, and over long
// contexts it ran 3-6% slower than rope_kv and the other form together (H100, session 41). At
// D 64 and below it asks for four, what it had unasked until the one-lookup staging took D 64
// from 124 registers to 141 (three blocks: the 1B at batch 32 over short contexts 15.3 against
// 13.3 us, session 43); ptxas fits it in 126 without spilling.
#define ATT_BATCH_ROPE_KERNEL(NAME, D, SPLIT)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * ATT_BATCH_WARPS, (D) > 64 ? 3 : 4) NAME(          \
        const float* __restrict__ qkv, int ld_qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, \
        const int* __restrict__ positions, const int* __restrict__ row_table,                           \
        const int* __restrict__ block_tables, int max_blocks, int num_heads, int num_kv_heads,          \
        int block_size, float scale, float* __restrict__ part_o, float* __restrict__ part_ml,           \
        int* __restrict__ counts, float* __restrict__ out_f32, bf16* __restrict__ out_bf16,             \
        const bf16* __restrict__ bias, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm, \
        float eps, const float* __restrict__ inv_freq) {                                                \
        attention_batch_body<D, SPLIT, true>(qkv, ld_qkv, k_cache, v_cache, positions, row_table,       \
                                             block_tables, max_blocks, num_heads, num_kv_heads,         \
                                             block_size, scale, part_o, part_ml, counts, out_f32,       \
                                             out_bf16, bias, q_norm, k_norm, eps, inv_freq);            \
    }
#define ATT_BATCH_KERNEL(NAME, D, SPLIT)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATT_BATCH_WARPS) NAME(                            \
        const float* __restrict__ qkv, int ld_qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, \
        const int* __restrict__ positions, const int* __restrict__ row_table,                           \
        const int* __restrict__ block_tables, int max_blocks, int num_heads, int num_kv_heads,          \
        int block_size, float scale, float* __restrict__ part_o, float* __restrict__ part_ml,           \
        int* __restrict__ counts, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {           \
        attention_batch_body<D, SPLIT, false>(qkv, ld_qkv, k_cache, v_cache, positions, row_table,      \
                                              block_tables, max_blocks, num_heads, num_kv_heads,        \
                                              block_size, scale, part_o, part_ml, counts, out_f32,      \
                                              out_bf16, nullptr, nullptr, nullptr, 0.0f, nullptr);      \
    }
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d16, 16, ATT_BATCH_SPLIT)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d32, 32, ATT_BATCH_SPLIT)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d64, 64, ATT_BATCH_SPLIT)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d128, 128, ATT_BATCH_SPLIT)
