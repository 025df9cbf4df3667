// Shared by every kernel file; the engine compiles common.cuh followed by all .cu files as one
// NVRTC program, so no include paths or CUDA headers are needed at run time.
//
// The constants the kernels share with the host (GEMV_WARPS, ATT_MAX_SPLITS, ...) are defined
// once, in engine/src/cuda/plan.rs (KERNEL_DEFINES), and handed to NVRTC as -D options.
#if !defined(GEMV_WARPS) || !defined(GEMV_MMA_U) || !defined(ATT_WARPS) || !defined(ATT_MAXG) || \
    !defined(ATT_SPLIT_MIN) || !defined(ATT_MAX_SPLITS) || !defined(MAX_HEAD_DIM) ||                 \
    !defined(MAMBA_MAX_WINDOW) || !defined(MAMBA_SSM_PER) || !defined(ATT_PF_WARPS) || !defined(ATT_PF_POS)
#error "compile with the engine's -D options (plan.rs KERNEL_DEFINES; kernels.rs options)"
#endif
static_assert(MAX_HEAD_DIM <= 128, "a lane holds two rotary frequencies (rope_kv.cu rope_freqs)");

// bf16 is kept as its raw 16 bits: widening is a shift, narrowing rounds to nearest even, as
// torch does.
typedef unsigned short bf16;

#define INF_F __int_as_float(0x7f800000)

__device__ __forceinline__ float bf2f(bf16 v) { return __uint_as_float(((unsigned)v) << 16); }

__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// The low and high bf16 of a 32-bit word, widened.
__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Four floats narrowed to bf16, packed for one 8-byte store (the inverse of bf_lo / bf_hi).
__device__ __forceinline__ uint2 bf4(float a, float b, float c, float d) {
    return make_uint2((unsigned)f2bf(a) | ((unsigned)f2bf(b) << 16), (unsigned)f2bf(c) | ((unsigned)f2bf(d) << 16));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Programmatic dependent launch (Hopper and later; no-ops elsewhere and when the kernel was not
// launched with the attribute). A kernel lets the next one launch at once (it then waits in its
// own pdl_wait), except attention_batch.cu's, where that cost a GEMV step 2.6 ms (session 45),
// and waits for the previous one before it reads anything that one wrote; only reads of
// constant data (weights) may come before pdl_wait.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// cp.async (sm_80 and later): copies into shared memory that overlap the thread's own work,
// committed in groups; wait_group N waits until at most N of the thread's groups are in flight
// (a __syncthreads after it makes every thread's copies visible).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem) : "memory");
}

// A paged cache's block size, for a position's block-table index and slot in its block: a shift
// and a mask where the size is a power of two (the engine's own pools), a division otherwise (a
// pool sized to vLLM's, e.g. 1,040). A division in each staged 16-byte copy cost the prefill
// attention 14% of its time on an H100 (docs/ENGINE.md, session 37). Used where the tensor-core
// kernels stage K/V; attention.cu (batch-1 decode) keeps its division: what a shift there would
// gain was not measurable against the GEMV tuning's noise.
struct CacheBlocks {
    int size, shift;
    bool pow2;
    __device__ explicit CacheBlocks(int block_size)
        : size(block_size), shift(__ffs(block_size) - 1), pow2((block_size & (block_size - 1)) == 0) {}
    __device__ int block(int p) const { return pow2 ? p >> shift : p / size; }
    __device__ int slot(int p) const { return pow2 ? p & (size - 1) : p % size; }
};

// 16 bytes, both addresses 16-byte aligned; fill false zeroes them and reads nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool fill) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    const int n = fill ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(n) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// One m16n8k16 bf16 mma into f32 accumulators, and the bf16 packing the tensor-core kernels
// (gemv.cu, attention_prefill.cu, attention_batch.cu) feed it with.
__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// lo into the low half, hi into the high, each rounded to nearest even: one instruction.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// hi = bf16(a), bf16(b) packed; lo = the same of what rounding left (a - hi is exact in f32).
__device__ __forceinline__ void split_bf16(float a, float b, unsigned& hi, unsigned& lo) {
    hi = pack_bf16(a, b);
    lo = pack_bf16(a - bf_lo(hi), b - bf_hi(hi));
}
