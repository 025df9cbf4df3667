// The Mamba-2 mixer's recurrent core (Nemotron-H), in f32 as transformers' torch path computes it
// (engine/src/hybrid/mamba.rs is the CPU reference): the causal conv over each channel's window,
// the SSM state update and readout, the gated group RMSNorm.
//
// The kernels take `segments` runs of consecutive rows, segment s the rows starts[s] ..
// starts[s + 1] of one sequence (decode: every row its own sequence, one step; prefill: each
// prompt's rows in the chunk, one or many sequences). A sequence's conv window and SSM state live
// in its state slot (`slots[s]`), are read once, carried through its rows in registers, and
// written back once; a segment whose first row is at position 0 starts from zeros. The scans here
// are sequential in their tokens: the decode step's (mamba_ssm_step, one row a segment), and
// prefill's for heads past the chunked scan's tiles (mamba_ssm) (mamba_ssd.cu sums the same recurrence in chunks on the tensor
// cores, as transformers and vLLM do, for every other prefill). The conv has no recurrence
// (a row's window is the inputs before it), so prefill cuts it into chunks of rows that run at
// once, each row's sum the same as in a sequential pass.
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

// One thread per (chunk, conv channel): out = silu(w . [window, x] + b) for each of the chunk's
// rows, the window moving on. conv_state: [slots][conv_dim][K - 1], oldest first. xbc:
// [rows][conv_dim]. The window and weights are register arrays indexed by constants (unrolled,
// predicated by k), and the inputs of MAMBA_CONV_AHEAD rows are loaded before the first of them
// is used.
//
// rows_per = 0 (decode): block y is segment y, all of its rows in turn. rows_per > 0 (prefill):
// each segment is cut into chunks of rows_per rows and block y is the y-th chunk over the
// segments in order, so a long prompt's conv runs on as many multiprocessors as it has chunks.
// A chunk's window is the rows_per >= K - 1 rows' inputs before it, all in the segment past its
// first chunk; so only the first chunk reads the slot's window, and it alone writes the new one
// (the segment's last K - 1 inputs), with no other block reading the slot. Every row's sum is the
// same expression in the same order whatever the chunking.
extern "C" __global__ void mamba_conv(const float* __restrict__ zxbcdt, const int* __restrict__ starts,
                                      int segments, int rows_per, int in_dim, int inner, int conv_dim,
                                      int k, const bf16* __restrict__ conv_w, const bf16* __restrict__ conv_b,
                                      float* __restrict__ conv_state, const int* __restrict__ slots,
                                      const int* __restrict__ positions, float* __restrict__ xbc) {
    pdl_launch_dependents();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    int s = blockIdx.y, chunk = 0;
    if (rows_per > 0) {
        int left = blockIdx.y;
        for (s = 0; s < segments; s++) {
            const int n = (starts[s + 1] - starts[s] + rows_per - 1) / rows_per;
            if (left < n) break;
            left -= n;
        }
        if (s == segments) return;
        chunk = left;
    }
    const int r0 = starts[s], r1 = starts[s + 1];
    const int t_begin = rows_per > 0 ? r0 + chunk * rows_per : r0;
    const int t_end = rows_per > 0 ? min(r1, t_begin + rows_per) : r1;
    float w[MAMBA_MAX_WINDOW + 1];
#pragma unroll
    for (int j = 0; j < MAMBA_MAX_WINDOW + 1; j++) w[j] = j < k ? bf2f(conv_w[(size_t)c * k + j]) : 0.0f;
    const float bias = conv_b ? bf2f(conv_b[c]) : 0.0f;
    float* st = conv_state + ((size_t)slots[s] * conv_dim + c) * (k - 1);
    const bool fresh = positions[r0] == 0;
    float win[MAMBA_MAX_WINDOW];
#pragma unroll
    for (int j = 0; j < MAMBA_MAX_WINDOW; j++) win[j] = (j < k - 1 && chunk == 0 && !fresh) ? st[j] : 0.0f;
    pdl_wait();
    if (chunk > 0) {
#pragma unroll
        for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
            if (j < k - 1) win[j] = zxbcdt[(size_t)(t_begin - (k - 1) + j) * in_dim + inner + c];
    }
    for (int t0 = t_begin; t0 < t_end; t0 += MAMBA_CONV_AHEAD) {
        float xs[MAMBA_CONV_AHEAD];
#pragma unroll
        for (int u = 0; u < MAMBA_CONV_AHEAD; u++)
            xs[u] = t0 + u < t_end ? zxbcdt[(size_t)(t0 + u) * in_dim + inner + c] : 0.0f;
#pragma unroll
        for (int u = 0; u < MAMBA_CONV_AHEAD; u++) {
            if (t0 + u < t_end) {
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
    if (chunk > 0) return;
    if (t_end == r1) {
        // The whole segment was this chunk's: the window has moved to its end.
#pragma unroll
        for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
            if (j < k - 1) st[j] = win[j];
    } else {
        // Longer than a chunk (so longer than the window): its last K - 1 inputs.
#pragma unroll
        for (int j = 0; j < MAMBA_MAX_WINDOW; j++)
            if (j < k - 1) st[j] = zxbcdt[(size_t)(r1 - (k - 1) + j) * in_dim + inner + c];
    }
}

// softplus as torch computes it (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// A row's time step: dt = softplus(dt_raw + dt_bias), clamped from below at dt_min.
__device__ __forceinline__ float ssm_dt(float dt_raw, float dtb, float dt_min) {
    return fmaxf(softplus(dt_raw + dtb), dt_min);
}

// One row of the recurrence for thread (i, q) of CH channels, their state values n0 .. n0 + per
// in `v`: v = v * da + dt B x (da = exp(dt A)), and `acc` gets the thread's share of y = v . C
// (split_sum adds the split's shares in a fixed order). `b` and `c` point at
// this thread's `per` values of B and C, read once for all CH channels; VEC: 16-byte aligned, read
// four at a time (prefill's staged copies, padded to whole float4s, and decode's rows where the
// model's widths keep them aligned), else one at a time (decode, straight from global memory).
// Each channel's expressions run in the same order whatever CH and VEC, so decode and prefill
// agree bit for bit.
// FULL: per is MAMBA_SSM_PER (every d_state of 32 or more), so its bounds fold away.
template <int CH, bool VEC, bool FULL>
__device__ __forceinline__ void ssm_rows_of(float (&v)[CH][MAMBA_SSM_PER], int per_, const float* b,
                                            const float* c, float dt, float da, const float (&x)[CH],
                                            float (&acc)[CH]) {
    const int per = FULL ? MAMBA_SSM_PER : per_;
    float dtx[CH];
#pragma unroll
    for (int k = 0; k < CH; k++) dtx[k] = dt * x[k], acc[k] = 0.0f;
    if (VEC) {
#pragma unroll
        for (int j4 = 0; j4 < MAMBA_SSM_PER; j4 += 4) {
            if (j4 < per) {
                const float4 b4 = *reinterpret_cast<const float4*>(b + j4);
                const float4 c4 = *reinterpret_cast<const float4*>(c + j4);
                const float bv[4] = {b4.x, b4.y, b4.z, b4.w}, cv[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (j4 + e < per) {
#pragma unroll
                        for (int k = 0; k < CH; k++) {
                            v[k][j4 + e] = fmaf(v[k][j4 + e], da, dtx[k] * bv[e]);
                            acc[k] = fmaf(v[k][j4 + e], cv[e], acc[k]);
                        }
                    }
                }
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < MAMBA_SSM_PER; j++) {
            if (j < per) {
#pragma unroll
                for (int k = 0; k < CH; k++) {
                    v[k][j] = fmaf(v[k][j], da, dtx[k] * b[j]);
                    acc[k] = fmaf(v[k][j], c[j], acc[k]);
                }
            }
        }
    }
}

template <int CH, bool VEC>
__device__ __forceinline__ void ssm_rows(float (&v)[CH][MAMBA_SSM_PER], int per, const float* b, const float* c,
                                         float dt, float da, const float (&x)[CH], float (&acc)[CH]) {
    if (per == MAMBA_SSM_PER)
        ssm_rows_of<CH, VEC, true>(v, per, b, c, dt, da, x, acc);
    else
        ssm_rows_of<CH, VEC, false>(v, per, b, c, dt, da, x, acc);
}

// y of a channel: its `split` shares of v . C added split / 2 apart, then split / 4 ..., 1 (share
// q takes q + o's while q < o), plus D x. The prefill scan's split is one warp's neighbouring
// lanes (shuffles); the decode step's is a block's warps (split_sum_shared), in the same order,
// so the two agree bit for bit.
template <int CH>
__device__ __forceinline__ void split_sum_shuffled(float (&acc)[CH], const float (&x)[CH], float dh, int split,
                                                   float (&out)[CH]) {
#pragma unroll
    for (int k = 0; k < CH; k++) {
        // split / 2 down to 1, unrolled: the split is a power of two <= 32.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            if (o < split) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
        out[k] = acc[k] + x[k] * dh;
    }
}

// The decode step's split_sum: share q of channel i at part[q * hd + i]; thread (i, 0) gets y.
// Every thread of the block calls it (it synchronises them).
__device__ __forceinline__ float split_sum_shared(float* part, float acc, float x, float dh, int i, int q, int hd,
                                                  int split) {
    part[q * hd + i] = acc;
    __syncthreads();
    for (int o = split / 2; o > 0; o >>= 1) {
        if (q < o) part[q * hd + i] = part[q * hd + i] + part[(q + o) * hd + i];
        __syncthreads();
    }
    const float out = part[i] + x * dh;
    __syncthreads();  // before the next row writes its shares
    return out;
}

// The prefill scan stages its rows in shared memory, `tile` rows at a time, two tiles deep: the
// next tile's inputs arrive by cp.async while this one is scanned. Per row: the group's B and C,
// each thread's `per` values of them in a region of its own (whole float4s plus four words, as
// plan.rs mamba_scan_tile_floats counts them, so a quarter-warp's 16-byte reads of the split's
// regions fall in different banks), the head's x, and dt and exp(dt A), computed once per row
// rather than by every thread.
// Dynamic shared memory: 2 x mamba_scan_tile_floats floats (plan.rs mamba_scan_smem_bytes).
//
// One block per (head, segment), `split` threads per channel of the head (split a power of two
// <= 32 dividing d_state): thread (i, q), thread i * split + q (a channel's split in neighbouring
// lanes), keeps the state values n = q * per .. (q + 1) * per of `ch` channels, i + k * (hd / ch)
// for k < ch, in registers, so blockDim.x = hd / ch x split. It takes MAMBA_SCAN_CH channels
// where the head allows (plan.rs mamba_scan_channels), so each B and C value a thread reads from
// shared memory serves that many (docs/ENGINE.md, session 21). Per row: state = state *
// exp(dt A) + dt B x, y = state . C + D x. ssm_state: [slots][heads][N][hd] (a channel's N values
// strided by hd). y: [rows][inner]. dt_min: transformers clamps dt from below in its prefill scan
// only (0 in decode). dt_bias, A (= -exp(A_log)) and D per head are f32, as vLLM keeps A and D.
// The prefill scans' parameters (mamba_ssd.cu takes the same).
#define MAMBA_SSM_PARAMS                                                                                \
    const float *__restrict__ zxbcdt, const float *__restrict__ xbc, const int *__restrict__ starts,   \
        int in_dim, int inner, int conv_dim, int heads, int hd, int n_state, int groups, int split,     \
        int tile, const float *__restrict__ dt_bias, const float *__restrict__ a,                       \
        const float *__restrict__ d, float *__restrict__ ssm_state, const int *__restrict__ slots,      \
        const int *__restrict__ positions, float dt_min, float *__restrict__ y

extern "C" __global__ void mamba_ssm(MAMBA_SSM_PARAMS) {
    constexpr int CH = MAMBA_SCAN_CH;
    extern __shared__ __align__(16) float staged[];
    pdl_launch_dependents();
    // A pass holds its prompts shortest first (plan.rs prefill_passes), and blocks start in the
    // order of their index: prefill takes its segments from the last, so the longest scans start
    // first and the short ones fill in behind them (as attention_prefill's tiles do), rather than
    // the longest starting in the last wave.
    const int h = blockIdx.x, s = gridDim.y - 1 - blockIdx.y;
    const int i = threadIdx.x / split, q = threadIdx.x % split;
    const int hdc = (int)blockDim.x / split, ch = hd / hdc;  // channels a thread, and their stride
    const int per = n_state / split, n0 = q * per;
    const float ah = a[h], dh = d[h], dtb = dt_bias[h];
    const int g = h / (heads / groups);
    float* st = ssm_state + ((size_t)slots[s] * heads + h) * n_state * hd + i;
    const int r0 = starts[s], r1 = starts[s + 1];
    const bool fresh = positions[r0] == 0;
    float v[CH][MAMBA_SSM_PER];
#pragma unroll
    for (int k = 0; k < CH; k++)
#pragma unroll
        for (int j = 0; j < MAMBA_SSM_PER; j++)
            if (j < per) v[k][j] = (fresh || k >= ch) ? 0.0f : st[(size_t)(n0 + j) * hd + k * hdc];
    pdl_wait();
    const size_t b_off = inner + (size_t)g * n_state, c_off = inner + (size_t)(groups + g) * n_state;
    // A tile's floats: [tile][B regions | C regions], [tile][hd] x, [tile] dt, [tile] exp(dt A).
    const int region = ((per + 3) & ~3) + 4, padded = split * region, bc = 2 * padded;
    const int tile_floats = (tile * (bc + hd + 2) + 3) & ~3;
    // Stages rows t0 .. t0 + nt into buffer `buf`: one cp.async group per thread.
    auto stage = [&](int t0, int nt, float* buf) {
        float* sx = buf + (size_t)tile * bc;
        float* sdt = sx + (size_t)tile * hd;
        for (int col = threadIdx.x; col < 2 * n_state; col += blockDim.x) {
            const int which = col >= n_state, m = col - which * n_state;
            const int at = which * padded + (m / per) * region + m % per;
            const float* src = xbc + (size_t)t0 * conv_dim + (which ? c_off : b_off) + m;
            for (int tt = 0; tt < nt; tt++) cp_async4(buf + tt * bc + at, src + (size_t)tt * conv_dim);
        }
        for (int e = threadIdx.x; e < nt * hd; e += blockDim.x) {
            const int tt = e / hd, xc = e % hd;
            cp_async4(sx + tt * hd + xc, xbc + (size_t)(t0 + tt) * conv_dim + h * hd + xc);
        }
        for (int tt = threadIdx.x; tt < nt; tt += blockDim.x)
            cp_async4(sdt + tt, zxbcdt + (size_t)(t0 + tt) * in_dim + inner + conv_dim + h);
        cp_async_commit();
    };
    const int ntiles = (r1 - r0 + tile - 1) / tile;
    if (ntiles > 0) stage(r0, min(tile, r1 - r0), staged);
    for (int it = 0; it < ntiles; it++) {
        const int t0 = r0 + it * tile, nt = min(tile, r1 - t0);
        float* buf = staged + (size_t)(it & 1) * tile_floats;
        // The next tile's copies go out before this one is waited for; its buffer was
        // consumed in the iteration before (the barrier at the end of it).
        if (it + 1 < ntiles) {
            stage(t0 + tile, min(tile, r1 - t0 - tile), staged + (size_t)((it + 1) & 1) * tile_floats);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float* sx = buf + (size_t)tile * bc;
        float* sdt = sx + (size_t)tile * hd;
        float* sda = sdt + tile;
        for (int tt = threadIdx.x; tt < nt; tt += blockDim.x) {
            const float dt = ssm_dt(sdt[tt], dtb, dt_min);
            sdt[tt] = dt;
            sda[tt] = expf(dt * ah);
        }
        __syncthreads();
        const float* bq = buf + q * region;
#pragma unroll 2
        for (int tt = 0; tt < nt; tt++) {
            float x[CH], acc[CH], out[CH];
#pragma unroll
            for (int k = 0; k < CH; k++) x[k] = k < ch ? sx[tt * hd + i + k * hdc] : 0.0f;
            ssm_rows<CH, true>(v, per, bq + tt * bc, bq + tt * bc + padded, sdt[tt], sda[tt], x, acc);
            split_sum_shuffled<CH>(acc, x, dh, split, out);
            if (q == 0) {
#pragma unroll
                for (int k = 0; k < CH; k++)
                    if (k < ch) y[(size_t)(t0 + tt) * inner + h * hd + i + k * hdc] = out[k];
            }
        }
        __syncthreads();  // before the next iteration stages into the buffer before this one
    }
#pragma unroll
    for (int k = 0; k < CH; k++)
#pragma unroll
        for (int j = 0; j < MAMBA_SSM_PER; j++)
            if (k < ch && j < per) st[(size_t)(n0 + j) * hd + k * hdc] = v[k][j];
}

// The decode step, two forms with the same bits: one row a segment, an item a (segment, head).
//
// Thread (i, q) is thread q * hd + i, so a warp's loads and stores of the state (a value n of the
// head's channels, [N][hd]) are whole 128-byte lines; it keeps state values n = q * per ..
// (q + 1) * per of channel i in registers, and the split's shares of y, in different warps, are
// added through shared memory (split_sum_shared) in the prefill scan's shuffles' order, so the
// forms and the prefill scan give the same bits.
//
// mamba_ssm_step: a block per item, its state loaded before pdl_wait, 4 KiB of shared memory, so
// it leaves the decode GEMVs' split of L1 and shared memory alone; the GEMV path runs it.
// 80 registers, three blocks of 256 a multiprocessor.
extern "C" __global__ void __maxnreg__(80)
    mamba_ssm_step(const float* __restrict__ zxbcdt, const float* __restrict__ xbc, const int* __restrict__ starts,
                   int segments, int in_dim, int inner, int conv_dim, int heads, int hd, int n_state, int groups,
                   int split, const float* __restrict__ dt_bias, const float* __restrict__ a,
                   const float* __restrict__ d, float* __restrict__ ssm_state, const int* __restrict__ slots,
                   const int* __restrict__ positions, float dt_min, float* __restrict__ y) {
    __shared__ float part[1024];
    pdl_launch_dependents();
    const int h = blockIdx.x, s = blockIdx.y;
    const int i = threadIdx.x % hd, q = threadIdx.x / hd;
    const int per = n_state / split, n0 = q * per;
    const float ah = a[h], dh = d[h], dtb = dt_bias[h];
    const int g = h / (heads / groups);
    float* st = ssm_state + ((size_t)slots[s] * heads + h) * n_state * hd + i;
    const int row = starts[s];
    const bool fresh = positions[row] == 0;
    float v[1][MAMBA_SSM_PER];
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++)
        if (j < per) v[0][j] = fresh ? 0.0f : st[(size_t)(n0 + j) * hd];
    pdl_wait();
    const float* xr = xbc + (size_t)row * conv_dim;
    const float dt = ssm_dt(zxbcdt[(size_t)row * in_dim + inner + conv_dim + h], dtb, dt_min);
    const float *b = xr + inner + (size_t)g * n_state + n0, *c = xr + inner + (size_t)(groups + g) * n_state + n0;
    const float x[1] = {xr[h * hd + i]};
    float acc[1];
    // B and C four at a time where every thread's share starts 16-byte aligned.
    if (((conv_dim | inner | n_state | per) & 3) == 0)
        ssm_rows<1, true>(v, per, b, c, dt, expf(dt * ah), x, acc);
    else
        ssm_rows<1, false>(v, per, b, c, dt, expf(dt * ah), x, acc);
    const float out = split_sum_shared(part, acc[0], x[0], dh, i, q, hd, split);
    if (q == 0) y[(size_t)row * inner + h * hd + i] = out;
#pragma unroll
    for (int j = 0; j < MAMBA_SSM_PER; j++)
        if (j < per) st[(size_t)(n0 + j) * hd] = v[0][j];
}

// mamba_ssm_step_staged: persistent. Block b takes items b, b + gridDim.x, ... (item = segment *
// heads + head; the grid is what fits on the GPU at once, load.rs mamba_step_function), and each
// item's state and inputs are staged into shared memory by cp.async one item ahead, so the state
// stream does not stop while an item computes or waits on its slot. Alone on an H100 at batch 32
// it streams the states at 87% of the device's copy rate where mamba_ssm_step does at 77%
// (docs/ENGINE.md, session 27); but its 69 KiB of shared memory a block (on the 8B's heads) ask
// the multiprocessors for another split of L1, which the GEMV path's kernels then ask back,
// draining the SMs each time: Nemotron-H-8B's batch-1 token took 12% longer with it. The cuBLAS
// path, whose GEMMs take large shared memory themselves, runs it, and launches it without PDL
// (ops.rs): resident early, its blocks held the kernels before it back (the batch-8 step 1.2-1.9%
// shorter without, docs/ENGINE.md, session 32), so its pdl_wait is then a no-op.
//
// A stage (plan.rs mamba_step_stage_floats): the state [N][hd], then x [hd], B [N], C [N], dt,
// the row's position (an int's bits), A, D and dt_bias of the head, rounded up to whole float4s.
// Dynamic shared memory: two stages, then blockDim.x floats for the split's shares.
// Up to 768 threads a block (a head's channels x split), so 80 registers, no spill, and three
// blocks of 256 a multiprocessor, as shared memory allows on the 8B's heads.
extern "C" __global__ void __launch_bounds__(768, 1)
    mamba_ssm_step_staged(const float* __restrict__ zxbcdt, const float* __restrict__ xbc, const int* __restrict__ starts,
                   int segments, int in_dim, int inner, int conv_dim, int heads, int hd, int n_state, int groups,
                   int split, const float* __restrict__ dt_bias, const float* __restrict__ a,
                   const float* __restrict__ d, float* __restrict__ ssm_state, const int* __restrict__ slots,
                   const int* __restrict__ positions, float dt_min, float* __restrict__ y) {
    extern __shared__ __align__(16) float sm[];
    pdl_launch_dependents();
    const int items = heads * segments;
    int it = blockIdx.x;
    if (it >= items) return;
    const int i = threadIdx.x % hd, q = threadIdx.x / hd;
    const int per = n_state / split, n0 = q * per;
    const int hs = n_state * hd, in_floats = hd + 2 * n_state + 5;
    const int stage_floats = hs + ((in_floats + 3) & ~3);
    float* part = sm + 2 * stage_floats;
    // The state is this layer's own (no kernel of the step writes it before this one), so it is
    // staged before pdl_wait; the inputs are the kernels' before.
    auto stage_state = [&](int item, int slot, float* buf) {
        const float* src = ssm_state + ((size_t)slot * heads + item % heads) * hs;
        for (int e = threadIdx.x * 4; e < hs; e += blockDim.x * 4) cp_async16(buf + e, src + e, true);
    };
    auto stage_inputs = [&](int item, int row, float* buf) {
        const int h = item % heads, g = h / (heads / groups);
        float* in = buf + hs;
        const float* xr = xbc + (size_t)row * conv_dim;
        for (int e = threadIdx.x; e < in_floats; e += blockDim.x) {
            const float* src;
            if (e < hd)
                src = xr + h * hd + e;
            else if (e < hd + n_state)
                src = xr + inner + (size_t)g * n_state + (e - hd);
            else if (e < hd + 2 * n_state)
                src = xr + inner + (size_t)(groups + g) * n_state + (e - hd - n_state);
            else if (e == hd + 2 * n_state)
                src = zxbcdt + (size_t)row * in_dim + inner + conv_dim + h;
            else if (e == hd + 2 * n_state + 1)
                src = reinterpret_cast<const float*>(positions + row);
            else if (e == hd + 2 * n_state + 2)
                src = a + h;
            else if (e == hd + 2 * n_state + 3)
                src = d + h;
            else
                src = dt_bias + h;
            cp_async4(in + e, src);
        }
    };
    // Each item's slot and row are read an item ahead of its staging, which is an item ahead of
    // its use.
    int slot_c = slots[it / heads], row_c = starts[it / heads];
    stage_state(it, slot_c, sm);
    cp_async_commit();
    pdl_wait();
    stage_inputs(it, row_c, sm);
    cp_async_commit();
    int nx = it + gridDim.x, slot_n = 0, row_n = 0;
    if (nx < items) slot_n = slots[nx / heads], row_n = starts[nx / heads];
    const bool vec = ((hd | n_state | per) & 3) == 0;
    for (int k = 0; it < items; k++) {
        float* buf = sm + (size_t)(k & 1) * stage_floats;
        int slot_nn = 0, row_nn = 0;
        if (nx < items) {
            float* nb = sm + (size_t)((k + 1) & 1) * stage_floats;
            stage_state(nx, slot_n, nb);
            stage_inputs(nx, row_n, nb);
            cp_async_commit();
            const int nn = nx + gridDim.x;
            if (nn < items) slot_nn = slots[nn / heads], row_nn = starts[nn / heads];
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = it % heads;
        const float *sx = buf + hs, *sb = sx + hd, *sc = sb + n_state;
        const bool fresh = reinterpret_cast<const int*>(sc)[n_state + 1] == 0;
        const float ah = sc[n_state + 2], dh = sc[n_state + 3], dtb = sc[n_state + 4];
        float v[1][MAMBA_SSM_PER];
#pragma unroll
        for (int j = 0; j < MAMBA_SSM_PER; j++)
            if (j < per) v[0][j] = fresh ? 0.0f : buf[(n0 + j) * hd + i];
        const float dt = ssm_dt(sc[n_state], dtb, dt_min);
        const float x[1] = {sx[i]};
        float acc[1];
        if (vec)
            ssm_rows<1, true>(v, per, sb + n0, sc + n0, dt, expf(dt * ah), x, acc);
        else
            ssm_rows<1, false>(v, per, sb + n0, sc + n0, dt, expf(dt * ah), x, acc);
        // Its barriers also end every thread's reads of `buf` before the next item refills it.
        const float out = split_sum_shared(part, acc[0], x[0], dh, i, q, hd, split);
        if (q == 0) y[(size_t)row_c * inner + h * hd + i] = out;
        float* st = ssm_state + ((size_t)slot_c * heads + h) * hs + i;
#pragma unroll
        for (int j = 0; j < MAMBA_SSM_PER; j++)
            if (j < per) st[(size_t)(n0 + j) * hd] = v[0][j];
        it = nx, slot_c = slot_n, row_c = row_n;
        nx += gridDim.x, slot_n = slot_nn, row_n = row_nn;
    }
}

// y * silu(z) of four channels from j0 of a group's row: one 16-byte load of each where `vec`
// (the rows and groups start 16-byte aligned), else one at a time, zero past the group's end.
__device__ __forceinline__ void gated4(const float* yr, const float* zr, int j0, int gs, bool vec,
                                       float (&v)[4]) {
    if (vec) {
        const float4 y4 = *reinterpret_cast<const float4*>(yr + j0);
        const float4 z4 = *reinterpret_cast<const float4*>(zr + j0);
        v[0] = y4.x * silu_f(z4.x), v[1] = y4.y * silu_f(z4.y);
        v[2] = y4.z * silu_f(z4.z), v[3] = y4.w * silu_f(z4.w);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = j0 + k < gs ? yr[j0 + k] * silu_f(zr[j0 + k]) : 0.0f;
    }
}

// One block per (group, row): y * silu(z), RMSNorm over the group's inner / groups channels,
// times the weight, into f32 (the decode GEMV's input) and/or bf16 (the prefill GEMM's); a null
// output is not written. Each thread takes four consecutive channels at a time (from 4 x its
// index, a block's width apart), so a group of 1,024 channels is 256 threads of one 16-byte load
// of y and of z each; the second pass reads them again from L1. Decode and prefill launch it
// alike (ops.rs), so a row's sum of squares runs in one order in both.
extern "C" __global__ void mamba_gated_norm(const float* __restrict__ y, const float* __restrict__ zxbcdt,
                                            int in_dim, int inner, int groups, const bf16* __restrict__ norm_w,
                                            float eps, float* __restrict__ out_f32, bf16* __restrict__ out_bf16) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int g = blockIdx.x, row = blockIdx.y, gs = inner / groups;
    const float* yr = y + (size_t)row * inner + (size_t)g * gs;
    const float* zr = zxbcdt + (size_t)row * in_dim + (size_t)g * gs;
    const bool vec = ((gs | inner | in_dim) & 3) == 0;
    float ss = 0.0f;
    for (int j0 = 4 * threadIdx.x; j0 < gs; j0 += 4 * blockDim.x) {
        float v[4];
        gated4(yr, zr, j0, gs, vec, v);
#pragma unroll
        for (int k = 0; k < 4; k++) ss += v[k] * v[k];
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)gs + eps);
    const size_t o = (size_t)row * inner + (size_t)g * gs;
    const bf16* wg = norm_w + (size_t)g * gs;
    for (int j0 = 4 * threadIdx.x; j0 < gs; j0 += 4 * blockDim.x) {
        float v[4];
        gated4(yr, zr, j0, gs, vec, v);
        if (vec) {
            const uint2 w2 = *reinterpret_cast<const uint2*>(wg + j0);
            const float w[4] = {bf_lo(w2.x), bf_hi(w2.x), bf_lo(w2.y), bf_hi(w2.y)};
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = w[k] * (v[k] * inv);
            if (out_f32) *reinterpret_cast<float4*>(out_f32 + o + j0) = make_float4(v[0], v[1], v[2], v[3]);
            if (out_bf16) *reinterpret_cast<uint2*>(out_bf16 + o + j0) = bf4(v[0], v[1], v[2], v[3]);
        } else {
            for (int k = 0; k < 4 && j0 + k < gs; k++) {
                const float r = bf2f(wg[j0 + k]) * (v[k] * inv);
                if (out_f32) out_f32[o + j0 + k] = r;
                if (out_bf16) out_bf16[o + j0 + k] = f2bf(r);
            }
        }
    }
}

// Nemotron-H's MLP activation: relu(x)^2 of `n` bf16 values of the up GEMM's output (bf16, as
// vLLM's GEMM writes it), computed in f32 and rounded to bf16: the down GEMM's input. Four values
// a thread, 8-byte loads and stores where both pointers allow (one at a time otherwise), as
// swiglu.cu.
__device__ __forceinline__ float relu2_f(float x) {
    const float r = fmaxf(x, 0.0f);
    return r * r;
}

extern "C" __global__ void relu2(const bf16* __restrict__ x, int n, bf16* __restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    const int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    if (i0 + 4 <= n && (((size_t)x | (size_t)out) & 7) == 0) {
        const uint2 x4 = *reinterpret_cast<const uint2*>(x + i0);
        *reinterpret_cast<uint2*>(out + i0) =
            bf4(relu2_f(bf_lo(x4.x)), relu2_f(bf_hi(x4.x)), relu2_f(bf_lo(x4.y)), relu2_f(bf_hi(x4.y)));
    } else {
        for (int i = i0; i < min(i0 + 4, n); i++) out[i] = f2bf(relu2_f(bf2f(x[i])));
    }
}

