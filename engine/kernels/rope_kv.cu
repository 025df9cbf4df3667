// After the q/k/v projection, for each row (token): add the q/k/v biases (Qwen2), apply the
// per-head q/k RMSNorm (Qwen3), rotate q and k (Hugging Face rotate_half convention, f32
// angles as transformers computes them), and write k and v into the row's paged KV block.
// q stays in `qkv` (rotated in place) for the attention kernel. Prefill only: the decode
// attention kernels (attention.cu, attention_batch.cu) do this inside themselves, through the
// same rope_head, so a K/V row has the same bits whichever wrote it.
//
// qkv: [rows][(H + 2*KVH) * D] f32. Cache layout per layer: [block][kv_head][slot][D] bf16.
// One block per row; each warp takes one head at a time.

// A lane's rotation angles: dimensions i = lane and lane + 32 of the first half of a head
// (head_dim <= 128), as sin and cos of pos * inv_freq[i] in f32, as transformers computes them.
struct RopeAngles { float s[2], c[2]; };

// inv_freq is constant: the attention kernel loads it before waiting for the kernel before.
__device__ __forceinline__ void rope_freqs(const float* __restrict__ inv_freq, int half, int lane, float (&f)[2]) {
#pragma unroll
    for (int k = 0; k < 2; k++) f[k] = lane + 32 * k < half ? inv_freq[lane + 32 * k] : 0.0f;
}

__device__ __forceinline__ RopeAngles rope_angles(const float (&f)[2], int pos) {
    RopeAngles r;
#pragma unroll
    for (int k = 0; k < 2; k++) sincosf((float)pos * f[k], &r.s[k], &r.c[k]);
    return r;
}

// Head h (0..H-1: q, then k, then v) of one row, in place, by one warp: bias, q/k norm, RoPE.
// The decode attention kernel does the same for its own heads (attention.cu), so a K row is the
// same bits whether prefill or decode wrote it.
__device__ __forceinline__ void rope_head(float* v, int h, int num_heads, int num_kv_heads, int head_dim,
                                          const bf16* __restrict__ bias, const bf16* __restrict__ q_norm,
                                          const bf16* __restrict__ k_norm, float eps, const RopeAngles& rot,
                                          int lane) {
    const int half = head_dim / 2;
    if (bias) {
        for (int d = lane; d < head_dim; d += 32) v[d] += bf2f(bias[h * head_dim + d]);
        __syncwarp();
    }
    const bool is_q = h < num_heads;
    const bool is_k = !is_q && h < num_heads + num_kv_heads;
    if (is_q || is_k) {
        const bf16* nw = is_q ? q_norm : k_norm;
        if (nw) {
            float ss = 0.0f;
            for (int d = lane; d < head_dim; d += 32) ss += v[d] * v[d];
            const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
            __syncwarp();
            for (int d = lane; d < head_dim; d += 32) v[d] = bf2f(nw[d]) * (v[d] * inv);
            __syncwarp();
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int i = lane + 32 * k;
            if (i < half) {
                const float a = v[i], b = v[i + half];
                v[i] = a * rot.c[k] - b * rot.s[k];
                v[i + half] = b * rot.c[k] + a * rot.s[k];
            }
        }
        __syncwarp();
    }
}

extern "C" __global__ void rope_kv(float* __restrict__ qkv, const bf16* __restrict__ bias,
                                   const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm, float eps,
                                   const float* __restrict__ inv_freq, const int* __restrict__ positions,
                                   const int* __restrict__ row_table, const int* __restrict__ block_tables,
                                   int max_blocks, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                   int num_heads, int num_kv_heads, int head_dim, int block_size) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x;
    const int pos = positions[row];
    const int total_heads = num_heads + 2 * num_kv_heads;
    float* r = qkv + (size_t)row * total_heads * head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int block = block_tables[(size_t)row_table[row] * max_blocks + pos / block_size];
    const int slot = pos % block_size;
    float f[2];
    rope_freqs(inv_freq, head_dim / 2, lane, f);
    const RopeAngles rot = rope_angles(f, pos);
    for (int h = warp; h < total_heads; h += nwarps) {
        float* v = r + h * head_dim;
        rope_head(v, h, num_heads, num_kv_heads, head_dim, bias, q_norm, k_norm, eps, rot, lane);
        if (h >= num_heads) {
            const bool is_k = h < num_heads + num_kv_heads;
            const int kvh = is_k ? h - num_heads : h - num_heads - num_kv_heads;
            bf16* dst = (is_k ? k_cache : v_cache) +
                        (((size_t)block * num_kv_heads + kvh) * block_size + slot) * head_dim;
            for (int d = lane; d < head_dim; d += 32) dst[d] = f2bf(v[d]);
        }
    }
}
