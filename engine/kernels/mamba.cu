// The Mamba-2 mixer's decode step (Nemotron-H), one token per row, in f32 as transformers'
// torch path computes it (engine/src/hybrid/mamba.rs is the CPU reference): the causal conv over
// each channel's window, the SSM state update and readout, the gated group RMSNorm. Each row's
// conv window and SSM state live in its sequence's state slot (`slots[row]`); a row at position
// 0 starts from zeros, so a prompt can be fed through the same step token by token.
//
// zxbcdt: in_proj's output per row, [rows][in_dim]: z (inner), x B C (conv_dim), dt (heads).

// One thread per (row, conv channel): out = silu(w . [window, x] + b); the window moves on.
// conv_state: [slots][conv_dim][K - 1], oldest first. xbc: [rows][conv_dim].
extern "C" __global__ void mamba_conv_step(const float* __restrict__ zxbcdt, int in_dim, int inner,
                                           int conv_dim, int k, const bf16* __restrict__ conv_w,
                                           const bf16* __restrict__ conv_b, float* __restrict__ conv_state,
                                           const int* __restrict__ slots, const int* __restrict__ positions,
                                           float* __restrict__ xbc) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    float* win = conv_state + ((size_t)slots[row] * conv_dim + c) * (k - 1);
    if (positions[row] == 0)
        for (int j = 0; j < k - 1; j++) win[j] = 0.0f;
    const float x = zxbcdt[(size_t)row * in_dim + inner + c];
    const bf16* w = conv_w + (size_t)c * k;
    float acc = 0.0f;
    for (int j = 0; j < k - 1; j++) acc += bf2f(w[j]) * win[j];
    acc += bf2f(w[k - 1]) * x;
    if (conv_b) acc += bf2f(conv_b[c]);
    xbc[(size_t)row * conv_dim + c] = acc / (1.0f + expf(-acc));
    for (int j = 0; j + 1 < k - 1; j++) win[j] = win[j + 1];
    win[k - 2] = x;
}

// softplus as torch computes it (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One block per (head, row), one thread per channel of the head (blockDim.x = head_dim):
// state = state * exp(dt A) + dt B x, y = state . C + D x. ssm_state: [slots][heads][N][hd] (a
// channel's N values are strided by hd, so a warp's reads of one n are contiguous). y: [rows][inner].
// dt_min: transformers clamps dt from below in its prefill scan only (0 in decode).
extern "C" __global__ void mamba_ssm_step(const float* __restrict__ zxbcdt, const float* __restrict__ xbc,
                                          int in_dim, int inner, int conv_dim, int heads, int hd, int n_state,
                                          int groups, const bf16* __restrict__ dt_bias,
                                          const float* __restrict__ a, const bf16* __restrict__ d,
                                          float* __restrict__ ssm_state, const int* __restrict__ slots,
                                          const int* __restrict__ positions, float dt_min,
                                          float* __restrict__ y) {
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, row = blockIdx.y, i = threadIdx.x;
    if (i >= hd) return;
    const float* zr = zxbcdt + (size_t)row * in_dim;
    const float* xr = xbc + (size_t)row * conv_dim;
    const int g = h / (heads / groups);
    const float* b = xr + inner + (size_t)g * n_state;
    const float* c = xr + inner + (size_t)groups * n_state + (size_t)g * n_state;
    const float dt = fmaxf(softplus(zr[inner + conv_dim + h] + bf2f(dt_bias[h])), dt_min);
    const float da = expf(dt * a[h]);
    const float x = xr[h * hd + i];
    float* s = ssm_state + ((size_t)slots[row] * heads + h) * n_state * hd + i;
    const bool fresh = positions[row] == 0;
    float acc = 0.0f;
    for (int n = 0; n < n_state; n++) {
        const float prev = fresh ? 0.0f : s[(size_t)n * hd];
        const float v = prev * da + dt * b[n] * x;
        s[(size_t)n * hd] = v;
        acc += v * c[n];
    }
    y[(size_t)row * inner + h * hd + i] = acc + x * bf2f(d[h]);
}

// One block per (group, row): y * silu(z), RMSNorm over the group's inner / groups channels,
// times the weight. Writes f32 (out_proj's decode GEMV input).
extern "C" __global__ void mamba_gated_norm(const float* __restrict__ y, const float* __restrict__ zxbcdt,
                                            int in_dim, int inner, int groups, const bf16* __restrict__ norm_w,
                                            float eps, float* __restrict__ out) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int g = blockIdx.x, row = blockIdx.y, gs = inner / groups;
    const float* yr = y + (size_t)row * inner + (size_t)g * gs;
    const float* zr = zxbcdt + (size_t)row * in_dim + (size_t)g * gs;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < gs; j += blockDim.x) {
        const float z = zr[j];
        const float v = yr[j] * (z / (1.0f + expf(-z)));
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)gs + eps);
    float* o = out + (size_t)row * inner + (size_t)g * gs;
    for (int j = threadIdx.x; j < gs; j += blockDim.x) {
        const float z = zr[j];
        const float v = yr[j] * (z / (1.0f + expf(-z)));
        o[j] = bf2f(norm_w[(size_t)g * gs + j]) * (v * inv);
    }
}

// Nemotron-H's MLP activation in place: relu(x)^2.
extern "C" __global__ void relu2(float* __restrict__ x, int n) {
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float r = fmaxf(x[i], 0.0f);
        x[i] = r * r;
    }
}
