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
// `att`, without its rotation (after rope_kv, as the engine ran it before session 41) and with
// it (ROPE, the engine's form at 256).
ATT_BATCH_KERNEL(attention_batch_d64, 64, ATT_BATCH_SPLIT)
ATT_BATCH_KERNEL(attention_batch_d128, 128, ATT_BATCH_SPLIT)
ATT_BATCH_KERNEL(attention_batch_s64_d64, 64, 64)
ATT_BATCH_KERNEL(attention_batch_s128_d64, 64, 128)
ATT_BATCH_KERNEL(attention_batch_s64_d128, 128, 64)
ATT_BATCH_KERNEL(attention_batch_s128_d128, 128, 128)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s64_d64, 64, 64)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s128_d64, 64, 128)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s64_d128, 128, 64)
ATT_BATCH_ROPE_KERNEL(attention_batch_rope_s128_d128, 128, 128)

// A persistent decode step (`seq`'s `persistent` sets; an experiment, not the engine's): one
// kernel runs every layer's four GEMVs (q/k/v with its norm, o, gate/up with its norm and SwiGLU,
// down) with the engine's own bodies and splits, so the same sums as the launched kernels. Each
// op's blocks walk its row groups as a launched GEMV's grid of `nb` blocks would; where a launched
// GEMV waits for the kernel before it (PDL), the op waits at a grid-wide barrier, its first step of
// weights already issued. The grid must be resident all at once (run.cpp sizes it by occupancy).
//
// The barriers, `bar` zeroed before each launch, its words on lines of their own (32 words apart):
// BAR_NONE waits for nothing (the bound: the step with barriers free; its sums read activations
// mid-update, so its bits are not checked). BAR_ONE: every block adds to one counter and polls it
// (release add, acquire load). BAR_FLAG: every block adds to one counter (acq_rel, the old value
// returned); the last to arrive releases a flag on another line, which the others poll, so the
// polling does not queue with the adds. BAR_TREE: BAR_FLAG with the adds spread over
// BAR_SUB counters (block % BAR_SUB), the last of each adding to a top counter.
// Each gives up (trap) after a second, so a grid that is not all resident fails, not hangs.
#define BAR_NONE 0
#define BAR_ONE 1
#define BAR_FLAG 2
#define BAR_TREE 3
#define BAR_SUB 8

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned* p) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
}

__device__ __forceinline__ void spin_until(const unsigned* p, unsigned at_least) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (ld_acquire(p) < at_least) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 1000000000ull) __trap();
    }
}

// Barrier number `gen` (1, 2, ...) of the launch, in two halves: `grid_arrive` once the block's
// writes of the op before are issued, `grid_wait` before it reads what other blocks wrote. The
// block barriers around thread 0's release and acquire extend both to every thread of the block.
template <int KIND>
__device__ __forceinline__ void grid_arrive(unsigned* bar, unsigned gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned n = gridDim.x;
        unsigned* flag = bar + 32 * (BAR_SUB + 1);
        if (KIND == BAR_ONE) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        } else if (KIND == BAR_FLAG) {
            if (atom_add_acq_rel(bar) == gen * n - 1)
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(gen) : "memory");
        } else if (KIND == BAR_TREE) {
            const unsigned sub = blockIdx.x % BAR_SUB;
            const unsigned members = n / BAR_SUB + (sub < n % BAR_SUB ? 1u : 0u);
            bool last = atom_add_acq_rel(bar + 32 * (1 + sub)) == gen * members - 1;
            if (last) last = atom_add_acq_rel(bar) == gen * BAR_SUB - 1;
            if (last) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(gen) : "memory");
        }
    }
}

template <int KIND>
__device__ __forceinline__ void grid_wait(unsigned* bar, unsigned gen) {
    if (threadIdx.x == 0) {
        if (KIND == BAR_ONE)
            spin_until(bar, gen * gridDim.x);
        else
            spin_until(bar + 32 * (BAR_SUB + 1), gen);
    }
    __syncthreads();
}

template <int KIND>
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned gen) {
    grid_arrive<KIND>(bar, gen);
    grid_wait<KIND>(bar, gen);
}

// One op of the persistent step: blocks [0, blocks) walk the row groups; activations are read
// plainly (another block of this kernel wrote them). gen 0: the step's first op, no wait. SPLIT:
// the block arrives before it issues its first weights and waits after (else it does both after:
// a release waits for the thread's loads in flight, the first weights among them).
template <int KIND, bool SPLIT>
struct StepGrid {
    static constexpr bool coherent = true;
    unsigned* bar;
    unsigned gen;
    int blocks;
    __device__ __forceinline__ int block() const { return blockIdx.x; }
    __device__ __forceinline__ int count() const { return blocks; }
    __device__ __forceinline__ void arrive() const {
        if (SPLIT && KIND != BAR_NONE && gen) grid_arrive<KIND>(bar, gen);
    }
    __device__ __forceinline__ void wait() const {
        if (KIND == BAR_NONE || !gen) return;
        if (SPLIT)
            grid_wait<KIND>(bar, gen);
        else
            grid_barrier<KIND>(bar, gen);
    }
};

template <int MODE, int KIND, bool SPLIT>
__device__ __forceinline__ void step_op(const bf16* W, const float* x, float* y, int rows, int cols, int ks, int nb,
                                        const bf16* gamma, float eps, unsigned* bar, unsigned& gen) {
    const StepGrid<KIND, SPLIT> g{bar, gen, nb};
    if ((int)blockIdx.x < nb) {
        gemv_stream<1, MODE, 4, 1, StepGrid<KIND, SPLIT>>(W, x, y, rows, cols, cols, rows, ks, gamma, eps, g);
    } else {
        g.arrive();
        g.wait();
    }
    gen++;
}

// wpool: L layers of [q/k/v (qkvw x H), o (H x q), gate/up (2I x H), down (H x I)], per_layer
// bytes apart, as seq's graph lays them out. ks*, nb*: each op's split and blocks. GU: gate/up's
// mode, 4 (SwiGLU, as the engine) or 3 (`lean`: a plain normed GEMV of 2I rows, down reading the
// first I; every op's body then fits 64 registers, so four blocks a multiprocessor, as the launched
// q/k/v, o and down kernels have; run.cpp times it against the same ops launched).
#define STEP_PERSISTENT(NAME, MINB, KIND, SPLIT, GU)                                                    \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB) NAME(                           \
        const bf16* __restrict__ wpool, unsigned long long per_layer, int L, int H, int qkvw, int q,    \
        int I, float* x, float* qkv, const float* attn, float* act, const bf16* __restrict__ gamma,    \
        float eps, int ks0, int ks1, int ks2, int ks3, int nb0, int nb1, int nb2, int nb3,             \
        unsigned* bar) {                                                                                \
        unsigned gen = 0;                                                                               \
        for (int l = 0; l < L; l++) {                                                                   \
            const bf16* wq = wpool + (size_t)l * (per_layer / 2);                                       \
            const bf16* wo = wq + (size_t)qkvw * H;                                                     \
            const bf16* wgu = wo + (size_t)H * q;                                                       \
            const bf16* wd = wgu + (size_t)2 * I * H;                                                   \
            step_op<3, KIND, SPLIT>(wq, x, qkv, qkvw, H, ks0, nb0, gamma, eps, bar, gen);               \
            step_op<1, KIND, SPLIT>(wo, attn, x, H, q, ks1, nb1, gamma, eps, bar, gen);                 \
            step_op<GU, KIND, SPLIT>(wgu, x, act, GU == 4 ? I : 2 * I, H, ks2, nb2, gamma, eps, bar,    \
                                     gen);                                                              \
            step_op<1, KIND, SPLIT>(wd, act, x, H, I, ks3, nb3, gamma, eps, bar, gen);                  \
        }                                                                                               \
    }
STEP_PERSISTENT(step_persistent_none, 2, BAR_NONE, false, 4)
STEP_PERSISTENT(step_persistent_one, 2, BAR_ONE, false, 4)
STEP_PERSISTENT(step_persistent_flag, 2, BAR_FLAG, false, 4)
STEP_PERSISTENT(step_persistent_one_split, 2, BAR_ONE, true, 4)
STEP_PERSISTENT(step_persistent_flag_split, 2, BAR_FLAG, true, 4)
STEP_PERSISTENT(step_persistent_tree_split, 2, BAR_TREE, true, 4)
STEP_PERSISTENT(step_lean_none_4, 4, BAR_NONE, false, 3)
STEP_PERSISTENT(step_lean_one_4, 4, BAR_ONE, true, 3)
STEP_PERSISTENT(step_lean_one_2, 2, BAR_ONE, true, 3)

// The barriers alone: `count` of them back to back on a grid of the persistent step's size.
#define BARRIERS_ONLY(NAME, KIND)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 2) NAME(unsigned* bar, int count) {  \
        for (int gen = 1; gen <= count; gen++) grid_barrier<KIND>(bar, gen);                            \
    }
BARRIERS_ONLY(barriers_one, BAR_ONE)
BARRIERS_ONLY(barriers_flag, BAR_FLAG)
BARRIERS_ONLY(barriers_tree, BAR_TREE)
