// The Mamba-2 mixer's recurrent core (Nemotron-H), in f32 as transformers' torch path computes it
// (engine/src/hybrid/mamba.rs is the CPU reference): the causal conv over each channel's window,
// the SSM state update and readout, the gated group RMSNorm.
//
// One kernel serves decode and prefill: `seqs` sequences of `steps` consecutive rows each (decode:
// every row its own sequence, steps = 1; prefill: one sequence, steps = the chunk's tokens). A
// sequence's conv window and SSM state live in its state slot (`slots[s]`), are read once, carried
// through its rows in registers, and written back once; a sequence whose first row is at position
// 0 starts from zeros. The scan over a prefill chunk is sequential in its tokens: the chunked
// (SSD) form of transformers and vLLM sums the same recurrence in another order.
//
// zxbcdt: in_proj's output per row, [rows][in_dim]: z (inner), x B C (conv_dim), dt (heads).
//
// The slots, positions and states are read before pdl_wait (common.cuh): no kernel of the same
// step or prefill chunk writes them before this one (the states are this layer's own), and every
// step and chunk before it has finished, the host having read its tokens or synchronised
// (cuda/backend.rs), so the state's loads overlap the kernel before.

// MAMBA_MAX_WINDOW (the longest conv window a thread keeps in registers, conv_kernel - 1) and
// MAMBA_SSM_PER (state values per thread of the SSM kernel, d_state / split) are plan.rs's.

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

// One thread per (sequence, conv channel): out = silu(w . [window, x] + b) for each of the
// sequence's rows; the window moves on. conv_state: [slots][conv_dim][K - 1], oldest first.
// xbc: [rows][conv_dim].
extern "C" __global__ void mamba_conv(const float* __restrict__ zxbcdt, int steps, int in_dim, int inner,
                                      int conv_dim, int k, const bf16* __restrict__ conv_w,
                                      const bf16* __restrict__ conv_b, float* __restrict__ conv_state,
                                      const int* __restrict__ slots, const int* __restrict__ positions,
                                      float* __restrict__ xbc) {
    pdl_launch_dependents();
    const int s = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    float w[MAMBA_MAX_WINDOW + 1];
    for (int j = 0; j < k; j++) w[j] = bf2f(conv_w[(size_t)c * k + j]);
    const float bias = conv_b ? bf2f(conv_b[c]) : 0.0f;
    float* st = conv_state + ((size_t)slots[s] * conv_dim + c) * (k - 1);
    const bool fresh = positions[s * steps] == 0;
    float win[MAMBA_MAX_WINDOW];
    for (int j = 0; j < k - 1; j++) win[j] = fresh ? 0.0f : st[j];
    pdl_wait();
    for (int t = 0; t < steps; t++) {
        const size_t row = (size_t)s * steps + t;
        const float x = zxbcdt[row * in_dim + inner + c];
        float acc = 0.0f;
        for (int j = 0; j < k - 1; j++) acc += w[j] * win[j];
        acc += w[k - 1] * x;
        acc += bias;
        xbc[row * conv_dim + c] = silu_f(acc);
        for (int j = 0; j + 1 < k - 1; j++) win[j] = win[j + 1];
        win[k - 2] = x;
    }
    for (int j = 0; j < k - 1; j++) st[j] = win[j];
}

// softplus as torch computes it (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One block per (head, sequence), `split` threads per channel of the head (blockDim.x = head_dim
// x split, split a power of two <= 32 dividing d_state): thread (i, q) keeps the state values
// n = q * per .. (q + 1) * per of channel i in registers. Per row: state = state * exp(dt A) +
// dt B x, y = state . C + D x, the split's partial sums added by shuffles in a fixed order.
// ssm_state: [slots][heads][N][hd] (a channel's N values strided by hd). y: [rows][inner].
// dt_min: transformers clamps dt from below in its prefill scan only (0 in decode). dt_bias, A
// (= -exp(A_log)) and D per head are f32, as vLLM keeps A and D.
extern "C" __global__ void mamba_ssm(const float* __restrict__ zxbcdt, const float* __restrict__ xbc,
                                     int steps, int in_dim, int inner, int conv_dim, int heads, int hd,
                                     int n_state, int groups, int split, const float* __restrict__ dt_bias,
                                     const float* __restrict__ a, const float* __restrict__ d,
                                     float* __restrict__ ssm_state, const int* __restrict__ slots,
                                     const int* __restrict__ positions, float dt_min, float* __restrict__ y) {
    pdl_launch_dependents();
    const int h = blockIdx.x, s = blockIdx.y;
    const int i = threadIdx.x / split, q = threadIdx.x % split;
    const int per = n_state / split, n0 = q * per;
    const float ah = a[h], dh = d[h], dtb = dt_bias[h];
    const int g = h / (heads / groups);
    float* st = ssm_state + ((size_t)slots[s] * heads + h) * n_state * hd + i;
    const bool fresh = positions[s * steps] == 0;
    float v[MAMBA_SSM_PER];
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++)
        if (j < per) v[j] = fresh ? 0.0f : st[(size_t)(n0 + j) * hd];
    pdl_wait();
    for (int t = 0; t < steps; t++) {
        const size_t row = (size_t)s * steps + t;
        const float* zr = zxbcdt + row * in_dim;
        const float* xr = xbc + row * conv_dim;
        const float* b = xr + inner + (size_t)g * n_state + n0;
        const float* c = xr + inner + (size_t)groups * n_state + (size_t)g * n_state + n0;
        const float dt = fmaxf(softplus(zr[inner + conv_dim + h] + dtb), dt_min);
        const float da = expf(dt * ah);
        const float x = xr[h * hd + i];
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
        if (q == 0) y[row * inner + h * hd + i] = acc + x * dh;
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
