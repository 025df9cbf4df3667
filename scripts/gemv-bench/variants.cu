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

// attention_batch.cu at other split lengths than the engine's ATT_BATCH_SPLIT, for run.cpp's
// `att` (the same kernel otherwise).
ATT_BATCH_KERNEL(attention_batch_s64_d64, 64, 64)
ATT_BATCH_KERNEL(attention_batch_s128_d64, 64, 128)
ATT_BATCH_KERNEL(attention_batch_s64_d128, 128, 64)
ATT_BATCH_KERNEL(attention_batch_s128_d128, 128, 128)

// attention_batch.cu doing rope_kv's work itself (ROPE), as attention.cu's decode does, at splits
// of 64, 128 and 256 positions: against attention.cu with its RoPE, so neither side pays a
// launch the other does not.
#define ATT_BATCH_ROPE_KERNEL(NAME, D, SPLIT)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * ATT_BATCH_WARPS) NAME(                            \
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
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d64, 64, 256)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s64_d64, 64, 64)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s128_d64, 64, 128)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_d128, 128, 256)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s64_d128, 128, 64)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s128_d128, 128, 128)
