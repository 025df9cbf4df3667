// The Mamba-2 mixer's recurrent core (Nemotron-H), in f32 as transformers' torch path computes it
// (engine/src/hybrid/mamba.rs is the CPU reference): the causal conv over each channel's window,
// the SSM state update and readout, the gated group RMSNorm.
//
// One kernel serves decode and prefill: `segments` runs of consecutive rows, segment s the rows
// starts[s] .. starts[s + 1] of one sequence (decode: every row its own sequence, one step;
// prefill: each prompt's rows in the chunk, one or many sequences). A sequence's conv window and
// SSM state live in its state slot (`slots[s]`), are read once, carried through its rows in
// registers, and written back once; a segment whose first row is at position 0 starts from
// zeros. The scan over a prefill segment is sequential in its tokens: the chunked (SSD) form of
// transformers and vLLM sums the same recurrence in another order.
//
// zxbcdt: in_proj's output per row, [rows][in_dim]: z (inner), x B C (conv_dim), dt (heads).
//
// The slots, starts, positions and states are read before pdl_wait (common.cuh): no kernel of the
// same step or prefill chunk writes them before this one (the states are this layer's own), and
// every step and chunk before it has finished, the host having read its tokens or synchronised
// (cuda/backend.rs), so the state's loads overlap the kernel before.

// MAMBA_MAX_WINDOW (the longest conv window a thread keeps in registers, conv_kernel - 1) and
// MAMBA_SSM_PER (state values per thread of the SSM kernel, d_state / split) are plan.rs's.

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

// Rows of a segment's conv input loaded at once, ahead of their use.
#define MAMBA_CONV_AHEAD 8

// One thread per (segment, conv channel): out = silu(w . [window, x] + b) for each of the
// segment's rows; the window moves on. conv_state: [slots][conv_dim][K - 1], oldest first.
// xbc: [rows][conv_dim]. The window and weights are register arrays indexed by constants
// (unrolled, predicated by k), and the inputs of MAMBA_CONV_AHEAD rows are loaded before the
// first of them is used.
extern "C" __global__ void mamba_conv(const float* __restrict__ zxbcdt, const int* __restrict__ starts,
                                      int in_dim, int inner, int conv_dim, int k,
                                      const bf16* __restrict__ conv_w, const bf16* __restrict__ conv_b,
                                      float* __restrict__ conv_state, const int* __restrict__ slots,
                                      const int* __restrict__ positions, float* __restrict__ xbc) {
    pdl_launch_dependents();
    const int s = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    float w[MAMBA_MAX_WINDOW + 1];
#pragma unroll
    for (int j = 0; j < MAMBA_MAX_WINDOW + 1; j++) w[j] = j < k ? bf2f(conv_w[(size_t)c * k + j]) : 0.0f;
    const float bias = conv_b ? bf2f(conv_b[c]) : 0.0f;
    float* st = conv_state + ((size_t)slots[s] * conv_dim + c) * (k - 1);
    const int r0 = starts[s], r1 = starts[s + 1];
    const bool fresh = positions[r0] == 0;
    float win[MAMBA_MAX_WINDOW];
#pragma unroll
    for (int j = 0; j < MAMBA_MAX_WINDOW; j++) win[j] = (j < k - 1 && !fresh) ? st[j] : 0.0f;
    pdl_wait();
    for (int t0 = r0; t0 < r1; t0 += MAMBA_CONV_AHEAD) {
        float xs[MAMBA_CONV_AHEAD];
#pragma unroll
        for (int u = 0; u < MAMBA_CONV_AHEAD; u++)
            xs[u] = t0 + u < r1 ? zxbcdt[(size_t)(t0 + u) * in_dim + inner + c] : 0.0f;
#pragma unroll
        for (int u = 0; u < MAMBA_CONV_AHEAD; u++) {
            if (t0 + u < r1) {
                const float x = xs[u];
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
                    if (j < k - 1) acc += w[j] * win[j];
#pragma unroll
                for (int j = 0; j < MAMBA_MAX_WINDOW + 1; j++)
                    if (j == k - 1) acc += w[j] * x;
                acc += bias;
                xbc[(size_t)(t0 + u) * conv_dim + c] = silu_f(acc);
#pragma unroll
                for (int j = 0; j + 1 < MAMBA_MAX_WINDOW; j++)
                    if (j + 1 < k - 1) win[j] = win[j + 1];
#pragma unroll
                for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
                    if (j == k - 2) win[j] = x;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
        if (j < k - 1) st[j] = win[j];
}

// softplus as torch computes it (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One row of a channel's recurrence for thread (i, q), its state values n0 .. n0 + per in `v`:
// v = v * exp(dt A) + dt B x, then the split's share of y = v . C, its `split` parts added by
// shuffles in a fixed order; returns that sum plus D x. `b` and `c` point at this thread's
// `per` values of B and C (`stride` apart), dt_raw is in_proj's dt before its bias.
__device__ __forceinline__ float ssm_row(float (&v)[MAMBA_SSM_PER], int per, const float* b, const float* c,
                                         float dt_raw, float x, float dtb, float ah, float dh, float dt_min,
                                         int split) {
    const float dt = fmaxf(softplus(dt_raw + dtb), dt_min);
    const float da = expf(dt * ah);
    const float dtx = dt * x;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++) {
        if (j < per) {
            v[j] = v[j] * da + dtx * b[j];
            acc += v[j] * c[j];
        }
    }
    for (int o = split / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc + x * dh;
}

// Prefill rows staged per tile in shared memory (`tile` rows at a time; 0: read straight from
// global memory, as decode's single row is): the group's B and C, the head's x and its dt, loaded
// by the whole block at once, so a row's scan waits on shared memory rather than on a round trip
// to L2. B and C are stored with one pad word after each thread's `per` values so the split's
// threads read different banks. Dynamic shared memory: tile * (2 (n_state + split) + hd + 1)
// floats (plan.rs mamba_scan_tile).
//
// One block per (head, segment), `split` threads per channel of the head (blockDim.x = head_dim x
// split, split a power of two <= 32 dividing d_state): thread (i, q) keeps the state values
// n = q * per .. (q + 1) * per of channel i in registers. Per row: state = state * exp(dt A) +
// dt B x, y = state . C + D x. ssm_state: [slots][heads][N][hd] (a channel's N values strided
// by hd). y: [rows][inner]. dt_min: transformers clamps dt from below in its prefill scan only (0
// in decode). dt_bias, A (= -exp(A_log)) and D per head are f32, as vLLM keeps A and D.
extern "C" __global__ void mamba_ssm(const float* __restrict__ zxbcdt, const float* __restrict__ xbc,
                                     const int* __restrict__ starts, int in_dim, int inner, int conv_dim,
                                     int heads, int hd, int n_state, int groups, int split, int tile,
                                     const float* __restrict__ dt_bias, const float* __restrict__ a,
                                     const float* __restrict__ d, float* __restrict__ ssm_state,
                                     const int* __restrict__ slots, const int* __restrict__ positions,
                                     float dt_min, float* __restrict__ y) {
    extern __shared__ float staged[];
    pdl_launch_dependents();
    const int h = blockIdx.x, s = blockIdx.y;
    const int i = threadIdx.x / split, q = threadIdx.x % split;
    const int per = n_state / split, n0 = q * per;
    const float ah = a[h], dh = d[h], dtb = dt_bias[h];
    const int g = h / (heads / groups);
    float* st = ssm_state + ((size_t)slots[s] * heads + h) * n_state * hd + i;
    const int r0 = starts[s], r1 = starts[s + 1];
    const bool fresh = positions[r0] == 0;
    float v[MAMBA_SSM_PER];
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++)
        if (j < per) v[j] = fresh ? 0.0f : st[(size_t)(n0 + j) * hd];
    pdl_wait();
    const size_t b_off = inner + (size_t)g * n_state, c_off = inner + (size_t)(groups + g) * n_state;
    if (tile == 0) {
        for (int row = r0; row < r1; row++) {
            const float* xr = xbc + (size_t)row * conv_dim;
            const float out = ssm_row(v, per, xr + b_off + n0, xr + c_off + n0,
                                      zxbcdt[(size_t)row * in_dim + inner + conv_dim + h], xr[h * hd + i],
                                      dtb, ah, dh, dt_min, split);
            if (q == 0) y[(size_t)row * inner + h * hd + i] = out;
        }
    } else {
        // [tile][B, padded | C, padded], then [tile][hd] x, then [tile] dt.
        const int padded = n_state + split, bc = 2 * padded;
        float* sbc = staged;
        float* sx = staged + (size_t)tile * bc;
        float* sdt = sx + (size_t)tile * hd;
        for (int t0 = r0; t0 < r1; t0 += tile) {
            const int nt = min(tile, r1 - t0);
            __syncthreads();  // the tile before is consumed
            for (int e = threadIdx.x; e < nt * 2 * n_state; e += blockDim.x) {
                const int tt = e / (2 * n_state), k = e % (2 * n_state);
                const int which = k / n_state, m = k % n_state;
                const float* xr = xbc + (size_t)(t0 + tt) * conv_dim;
                sbc[tt * bc + which * padded + m + m / per] = xr[(which ? c_off : b_off) + m];
            }
            for (int e = threadIdx.x; e < nt * hd; e += blockDim.x)
                sx[e] = xbc[(size_t)(t0 + e / hd) * conv_dim + h * hd + e % hd];
            for (int e = threadIdx.x; e < nt; e += blockDim.x)
                sdt[e] = zxbcdt[(size_t)(t0 + e) * in_dim + inner + conv_dim + h];
            __syncthreads();
            const int p0 = n0 + q;  // n0 + n0 / per: this thread's values start after q pads
            for (int tt = 0; tt < nt; tt++) {
                const float out = ssm_row(v, per, sbc + tt * bc + p0, sbc + tt * bc + padded + p0, sdt[tt],
                                          sx[tt * hd + i], dtb, ah, dh, dt_min, split);
                if (q == 0) y[(size_t)(t0 + tt) * inner + h * hd + i] = out;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++)
        if (j < per) st[(size_t)(n0 + j) * hd] = v[j];
}

// One block per (group, row): y * silu(z), RMSNorm over the group's inner / groups channels,
// times the weight, into f32 (the decode GEMV's input) and/or bf16 (the prefill GEMM's); a null
// output is not written.
extern "C" __global__ void mamba_gated_norm(const float* __restrict__ y, const float* __restrict__ zxbcdt,
                                            int in_dim, int inner, int groups, const bf16* __restrict__ norm_w,
                                            float eps, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int g = blockIdx.x, row = blockIdx.y, gs = inner / groups;
    const float* yr = y + (size_t)row * inner + (size_t)g * gs;
    const float* zr = zxbcdt + (size_t)row * in_dim + (size_t)g * gs;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < gs; j += blockDim.x) {
        const float v = yr[j] * silu_f(zr[j]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)gs + eps);
    const size_t o = (size_t)row * inner + (size_t)g * gs;
    for (int j = threadIdx.x; j < gs; j += blockDim.x) {
        const float v = bf2f(norm_w[(size_t)g * gs + j]) * ((yr[j] * silu_f(zr[j])) * inv);
        if (out_f32) out_f32[o + j] = v;
        if (out_bf16) out_bf16[o + j] = f2bf(v);
    }
}

// Nemotron-H's MLP activation: relu(x)^2 of `n` values, into f32 (in place in decode) and/or bf16
// (the prefill GEMM's input); a null output is not written.
extern "C" __global__ void relu2(const float* __restrict__ x, int n, float* __restrict__ out_f32,
                                 bf16* __restrict__ out_bf16) {
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float r = fmaxf(x[i], 0.0f);
        if (out_f32) out_f32[i] = r * r;
        if (out_bf16) out_bf16[i] = f2bf(r * r);
    }
}
