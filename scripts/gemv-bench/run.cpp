// Times decode GEMV kernels (scripts/gemv-bench/variants.cu and the engine's gemv.cu) on the
// shapes of the 1B and 8B units, as the engine runs them: back-to-back launches with
// programmatic dependent launch, captured in a CUDA graph, rotating over enough weight copies
// that the 50 MB L2 holds none of them. Prints one TSV line per (shape, kernel, ksplit, grid).
// With the filter `seq`: a whole decode step of each model (embedding, every layer's GEMVs and
// attention, final norm, lm_head and argmax) in one graph at 16 and 1000 positions, with one
// part left out at a time, and with other GEMV choices.
// Here (NVRTC from the Python environment):  python3 compile.py kernels.cubin
// On the GPU box (nvcc there):  nvcc -O2 -std=c++17 run.cpp -lcuda -o /tmp/gb
//                               /tmp/gb kernels.cubin [filter | seq]
// seq takes SEQ_MODEL (1b, 8b), SEQ_CTX (16, 64, 256, 1000) and SEQ_VARIANT (full, no_att, ...)
// from the environment to run one part only. SEQ_VARIANT=persistent: only the step's GEMVs, in one
// persistent kernel with grid barriers (variants.cu step_persistent_*) against the same GEMVs
// launched one by one, and the barriers alone (docs/ENGINE.md, session 36).
// With the filter `att`: decode attention alone at batches 1, 8 and 32 over a paged cache, the
// engine's attention.cu (a block per split) against its attention_batch.cu (tensor cores) at
// splits of 256 (the engine's), 64 and 128 positions, each row's context 1,000 + 64 or 16 + 64
// positions alternating (engine bench's prompt lengths halfway through its batch runs), all
// long or all short, each 32 splits deep as the engine launches them (attention.cu without its
// folded RoPE, attention_batch.cu without the rope_kv launch it needs before it); then both
// with the rotation and K/V write folded in (engine_rope, batch_rope*: attention_batch.cu's
// ROPE instantiations in variants.cu, against engine_rope's output), and the cuBLAS step's pair
// rope_kv + attention_batch.cu (rope_kv+batch*, maxdiff -1: not checked): time
// per launch, K/V read rate, and the largest difference from the engine's output relative to its
// largest magnitude. ATT_ONLY=model,batch,contexts (e.g. 8b,8,mixed) runs that case alone.
#include <cuda.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#define CK(x)                                                                         \
    do {                                                                              \
        CUresult r_ = (x);                                                            \
        if (r_ != CUDA_SUCCESS) {                                                     \
            const char* s_ = nullptr;                                                 \
            cuGetErrorString(r_, &s_);                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static CUmodule mod;
static CUstream stream;
static int sms;

static CUfunction fn(const std::string& name) {
    CUfunction f;
    if (cuModuleGetFunction(&f, mod, name.c_str()) != CUDA_SUCCESS) return nullptr;
    return f;
}

static void launch(CUfunction f, unsigned grid, unsigned block, void** args, bool pdl) {
    CUlaunchConfig cfg = {};
    cfg.gridDimX = grid; cfg.gridDimY = 1; cfg.gridDimZ = 1;
    cfg.blockDimX = block; cfg.blockDimY = 1; cfg.blockDimZ = 1;
    cfg.hStream = stream;
    CUlaunchAttribute attr = {};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cuLaunchKernelEx(&cfg, f, args, nullptr));
}


static CUevent ge0, ge1;
template <class F> static float time_ms_g(F&& body, int reps) {
    body(); CK(cuStreamSynchronize(stream));
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cuEventRecord(ge0, stream)); body(); CK(cuEventRecord(ge1, stream));
        CK(cuEventSynchronize(ge1));
        float ms; CK(cuEventElapsedTime(&ms, ge0, ge1)); t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Shape { const char* name; int rows, cols, mode; };

// The engine's choice for its streaming GEMVs at batch 1 (plan.rs gemv_ksplit).
static int engine_ksplit(int rows, int cols, bool gate_up = false) {
    const int chunks = cols / 8;
    const bool two = chunks % 2 == 0 && chunks / 2 >= 32;
    return two && (rows < 8192 || (gate_up && (chunks / 2) % 32 == 0)) ? 2 : 1;
}


// One decode step's layers (no lm_head) as the engine runs them, in one graph with PDL:
// qkv GEMV (norm folded), attention (rope + KV write folded), o GEMV, gate/up GEMV, down GEMV.
struct Model { const char* name; int H, heads, kvh, D, I, L; };
struct Pick { std::string kernel; int ksplit; bool mma = false; };
// Blocks of 256 threads of `f` resident on the whole GPU at once.
static int resident(CUfunction f) {
    int occ = 0;
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&occ, f, 256, 0));
    return occ * sms;
}
// The persistent grid of a streaming GEMV, as plan.rs gemv_grid: one block per group of 8 / ks
// rows while they all fit on the GPU at once, else as few blocks as walk the groups in the same
// number of rounds as the `fit` resident blocks would.
static unsigned balanced_grid(int rows, int ks, int fit) {
    const int rpb = 8 / ks, groups = (rows + rpb - 1) / rpb;
    const int rounds = (groups + fit - 1) / fit;
    return (groups + rounds - 1) / rounds;
}
static unsigned stream_grid(CUfunction f, int rows, int ks) { return balanced_grid(rows, ks, resident(f)); }
// The persistent grid of the streaming tensor-core candidate: groups of 8 / ks tiles of 16 rows.
static unsigned mma_grid(CUfunction f, int rows, int ks) { return balanced_grid(rows / 16, ks, resident(f)); }
// The engine's first tensor-core rule (a residual GEMV of 4,096+ rows in whole tiles and steps
// ran mode 7, 8 warps per tile), kept as this bench's fixed reference; the engine now times the
// kernels per shape and batch at load (engine/src/cuda/tune.rs).
static bool engine_mma(int rows, int cols) { return rows >= 4096 && rows % 16 == 0 && cols % 1024 == 0; }
static Pick engine_residual(int rows, int cols) {
    return engine_mma(rows, cols) ? Pick{"gemv_m7_b1", 8, true} : Pick{"gemv_m1_b1", engine_ksplit(rows, cols)};
}
static void seq_bench() {
    const Model models[] = {{"1b", 2048, 32, 8, 64, 8192, 16}, {"8b", 4096, 32, 8, 128, 14336, 32}};
    for (const Model& m : models) {
        if (getenv("SEQ_MODEL") && strcmp(getenv("SEQ_MODEL"), m.name) != 0) continue;
        const int q = m.heads * m.D, kv = m.kvh * m.D, qkvw = q + 2 * kv;
        const size_t wq = (size_t)qkvw * m.H * 2, wo = (size_t)m.H * q * 2, wgu = (size_t)2 * m.I * m.H * 2,
                     wd = (size_t)m.H * m.I * 2, per_layer = wq + wo + wgu + wd;
        CUdeviceptr wpool, x, qkvb, attn, act, gamma, kc, vc, pos, rowt, tables, part_o, part_ml, counts, invf;
        CK(cuMemAlloc(&wpool, per_layer * m.L));
        size_t n = per_layer * m.L / 2; unsigned seed = 5; float sc = 0.02f, off = 0.0f;
        { void* a[] = {&wpool, &n, &seed, &sc, &off}; launch(fn("fill_bf16"), 8192, 256, a, false); }
        const int blocks = 64, bs = 16;
        const size_t cache = (size_t)blocks * m.kvh * bs * m.D * 2;
        CK(cuMemAlloc(&kc, cache * m.L)); CK(cuMemAlloc(&vc, cache * m.L));
        { size_t nc = cache * m.L / 2; unsigned s1 = 3; float a1 = 1.0f, o1 = 0.0f;
          void* a[] = {&kc, &nc, &s1, &a1, &o1}; launch(fn("fill_bf16"), 4096, 256, a, false);
          void* b[] = {&vc, &nc, &s1, &a1, &o1}; launch(fn("fill_bf16"), 4096, 256, b, false); }
        CK(cuMemAlloc(&x, m.H * 4)); CK(cuMemAlloc(&qkvb, qkvw * 4)); CK(cuMemAlloc(&attn, q * 4));
        CK(cuMemAlloc(&act, 2 * m.I * 4)); CK(cuMemAlloc(&gamma, m.H * 2));  // 2I: the lean gate/up's rows
        { size_t nx = m.H; unsigned s3 = 11; void* c[] = {&x, &nx, &s3}; launch(fn("fill_f32"), 16, 256, c, false);
          size_t ng = m.H; unsigned s2 = 9; float sc2 = 0.2f, off2 = 1.0f;
          void* b[] = {&gamma, &ng, &s2, &sc2, &off2}; launch(fn("fill_bf16"), 16, 256, b, false); }
        CK(cuMemAlloc(&pos, 4)); CK(cuMemAlloc(&rowt, 4)); CK(cuMemAlloc(&tables, blocks * 4));
        CK(cuMemAlloc(&part_o, (size_t)m.heads * 32 * m.D * 4)); CK(cuMemAlloc(&part_ml, (size_t)m.heads * 32 * 2 * 4));
        CK(cuMemAlloc(&counts, m.kvh * 4)); CK(cuMemsetD8(counts, 0, m.kvh * 4)); CK(cuMemsetD8(rowt, 0, 4));
        const int vocab = 128256, lks = 1;  // plan.rs lm_head_ksplit for 128256 rows
        const unsigned head_blocks = (vocab + 8 / lks - 1) / (8 / lks);
        CUdeviceptr head, xn, parts, tokens;
        CK(cuMemAlloc(&head, (size_t)vocab * m.H * 2)); CK(cuMemAlloc(&xn, m.H * 4));
        CK(cuMemAlloc(&parts, head_blocks * 8)); CK(cuMemAlloc(&tokens, 4)); CK(cuMemsetD8(tokens, 0, 4));
        { size_t nh = (size_t)vocab * m.H; unsigned s4 = 13; float a4 = 0.02f, o4 = 0.0f;
          void* a[] = {&head, &nh, &s4, &a4, &o4}; launch(fn("fill_bf16"), 4096, 256, a, false); }
        std::vector<int> tb(blocks); for (int i = 0; i < blocks; i++) tb[i] = i;
        CK(cuMemcpyHtoD(tables, tb.data(), blocks * 4));
        std::vector<float> inv(m.D / 2); for (int i = 0; i < m.D / 2; i++) inv[i] = std::pow(500000.0f, -2.0f * i / m.D);
        CK(cuMemAlloc(&invf, inv.size() * 4)); CK(cuMemcpyHtoD(invf, inv.data(), inv.size() * 4));
        CK(cuCtxSynchronize());
        const int g = m.heads / m.kvh, gd = g * m.D;
        const unsigned att_smem = 4 * (gd + 4 * gd + 4 * g * 2);
        CUfunction fatt = fn(m.heads / m.kvh == 4 ? "attention_g4" : "attention_g8");
        CK(cuFuncSetAttribute(fatt, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 * 1024));
        // Kernel choice per matrix: qkv, o, gate_up, down.
        std::vector<std::pair<std::string, std::vector<Pick>>> sets = {
            {"engine", {{"gemv_m3_b1", engine_ksplit(qkvw, m.H)}, engine_residual(m.H, q),
                        {"gemv_m4_b1", engine_ksplit(m.I, m.H, true)}, engine_residual(m.H, m.I)}},
            {"cuda_cores", {{"gemv_m3_b1", engine_ksplit(qkvw, m.H)}, {"gemv_m1_b1", engine_ksplit(m.H, q)},
                            {"gemv_m4_b1", engine_ksplit(m.I, m.H, true)}, {"gemv_m1_b1", engine_ksplit(m.H, m.I)}}},
            {"gu_k1", {{"gemv_m3_b1", engine_ksplit(qkvw, m.H)}, {"gemv_m1_b1", engine_ksplit(m.H, q)},
                       {"gemv_m4_b1", 1}, {"gemv_m1_b1", engine_ksplit(m.H, m.I)}}},
        };
        // The streaming tensor-core candidate at one (ksplit, U) for every matrix (gate/up U <= 2).
        for (int u : {2, 4, 8}) {
            const std::string us = std::to_string(u), u4 = std::to_string(std::min(u, 2));
            sets.push_back({"mmas_k8_u" + us, {{"mmas_m3_b1_u" + us, 8, true}, {"mmas_m1_b1_u" + us, 8, true},
                                              {"mmas_m4_b1_u" + u4, 8, true}, {"mmas_m1_b1_u" + us, 8, true}}});
        }
        float eps = 1e-5f, scale = 1.0f / std::sqrt((float)m.D);
        for (int ctx : {16, 64, 256, 1000}) {
            if (getenv("SEQ_CTX") && atoi(getenv("SEQ_CTX")) != ctx) continue;
            int p = ctx - 1; CK(cuMemcpyHtoD(pos, &p, 4));
            for (auto& [setname, picks] : sets) {
                const bool is_engine = setname == "engine";
                for (const char* variant : {"full", "no_att", "no_head", "no_edges", "att_only"}) {
                    if (!is_engine && strcmp(variant, "full") != 0 && strcmp(variant, "no_att") != 0) continue;
                    if (getenv("SEQ_VARIANT") && strcmp(getenv("SEQ_VARIANT"), variant) != 0) continue;
                    const bool with_att = strcmp(variant, "no_att") != 0;
                    const bool with_head = strcmp(variant, "no_head") != 0 && strcmp(variant, "att_only") != 0;
                    const bool with_edges = strcmp(variant, "no_edges") != 0 && strcmp(variant, "att_only") != 0;
                    const bool with_gemv = strcmp(variant, "att_only") != 0;
                    CUgraph gr; CUgraphExec ge;
                    CK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
                    auto gemv = [&](const Pick& pk, CUdeviceptr w, CUdeviceptr xin, CUdeviceptr yout, int rows, int cols) {
                        CUfunction f = fn(pk.kernel);
                        if (!f) { fprintf(stderr, "missing %s\n", pk.kernel.c_str()); exit(1); }
                        int r = rows, c = cols, k = pk.ksplit; CUdeviceptr parts = 0;
                        void* a[] = {&w, &xin, &yout, &r, &c, &c, &r, &k, &gamma, &eps, &parts};
                        launch(f, pk.mma ? mma_grid(f, rows, k) : stream_grid(f, rows, k), 256, a, true);
                    };
                    auto plain = [&](const char* name, unsigned grid, unsigned block, void** a) {
                        launch(fn(name), grid, block, a, true);
                    };
                    int hid = m.H;
                    if (with_edges) { void* a[] = {&head, &tokens, &x, &hid}; plain("embed_gather", 1, 256, a); }
                    for (int l = 0; l < m.L; l++) {
                        CUdeviceptr base = wpool + l * per_layer;
                        if (with_gemv) gemv(picks[0], base, x, qkvb, qkvw, m.H);
                        if (with_att) {
                            CUdeviceptr kcl = kc + l * cache, vcl = vc + l * cache, nul = 0;
                            int ld = qkvw, mb = blocks, nh = m.heads, nk = m.kvh, hd = m.D, bsz = bs;
                            void* a[] = {&qkvb, &ld, &kcl, &vcl, &pos, &rowt, &tables, &mb, &nh, &nk, &hd, &bsz, &scale,
                                         &part_o, &part_ml, &counts, &attn, &nul, &nul, &nul, &nul, &eps, &invf};
                            CUlaunchConfig cfg = {};
                            cfg.gridDimX = 1; cfg.gridDimY = m.kvh; cfg.gridDimZ = 32;  // plan.rs MAX_SPLITS
                            cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1;
                            cfg.sharedMemBytes = att_smem; cfg.hStream = stream;
                            CUlaunchAttribute attr = {};
                            attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                            attr.value.programmaticStreamSerializationAllowed = 1;
                            cfg.attrs = &attr; cfg.numAttrs = 1;
                            CK(cuLaunchKernelEx(&cfg, fatt, a, nullptr));
                        }
                        if (with_gemv) {
                            gemv(picks[1], base + wq, attn, x, m.H, q);
                            gemv(picks[2], base + wq + wo, x, act, m.I, m.H);
                            gemv(picks[3], base + wq + wo + wgu, act, x, m.H, m.I);
                        }
                    }
                    if (with_edges) {
                        CUdeviceptr nul = 0;
                        void* a[] = {&x, &gamma, &eps, &hid, &xn, &nul};
                        plain("rmsnorm", 1, 256, a);
                    }
                    if (with_head) {
                        int rows = vocab, cols = m.H, k = lks; CUdeviceptr nul = 0;
                        void* a[] = {&head, &xn, &nul, &rows, &cols, &cols, &rows, &k, &gamma, &eps, &parts};
                        plain("gemv_m5_b1", head_blocks, 256, a);
                        int np = head_blocks, adv = 0;
                        void* b[] = {&parts, &np, &tokens, &pos, &adv};
                        plain("argmax_final", 1, 1024, b);
                    }
                    CK(cuStreamEndCapture(stream, &gr));
                    CK(cuGraphInstantiate(&ge, gr, 0));
                    const int reps = 10;
                    float ms = time_ms_g([&] { for (int i = 0; i < reps; i++) CK(cuGraphLaunch(ge, stream)); }, 7);
                    float ms_sync = time_ms_g([&] {
                        for (int i = 0; i < reps; i++) { CK(cuGraphLaunch(ge, stream)); CK(cuStreamSynchronize(stream)); }
                    }, 5);
                    printf("seq\t%s\tctx%d\t%s\t%s\tstep_us %.1f\tstep_us_with_host_sync %.1f\n",
                           m.name, ctx, setname.c_str(), variant, ms * 1e3 / reps, ms_sync * 1e3 / reps);
                    fflush(stdout);
                    CK(cuGraphExecDestroy(ge)); CK(cuGraphDestroy(gr));
                }
            }
        }
        // The persistent step (variants.cu step_persistent_<barrier>) against the same GEMVs
        // launched one by one in a graph with PDL (no attention, embedding, final norm or lm_head
        // in either), each from the same x: its time, and whether it leaves the same bits in x, the
        // residual stream after every layer; then each barrier alone, as many as the step has.
        // `lean`: gate/up as a plain normed GEMV of 2I rows in both forms (variants.cu
        // step_lean_*), so the persistent kernel fits four blocks a multiprocessor.
        if (!getenv("SEQ_VARIANT") || strcmp(getenv("SEQ_VARIANT"), "persistent") == 0)
        for (const bool lean : {false, true}) {
            const std::vector<Pick> picks = {{"gemv_m3_b1", engine_ksplit(qkvw, m.H)}, {"gemv_m1_b1", engine_ksplit(m.H, q)},
                                             lean ? Pick{"gemv_m3_b1", engine_ksplit(2 * m.I, m.H)}
                                                  : Pick{"gemv_m4_b1", engine_ksplit(m.I, m.H, true)},
                                             {"gemv_m1_b1", engine_ksplit(m.H, m.I)}};
            const int rows[4] = {qkvw, m.H, lean ? 2 * m.I : m.I, m.H}, cols[4] = {m.H, q, m.H, m.I};
            const unsigned bar_words = 32 * 10;  // variants.cu: BAR_SUB + 2 counters, a line each
            CUdeviceptr x0, bar;
            CK(cuMemAlloc(&x0, m.H * 4)); CK(cuMemAlloc(&bar, 4 * bar_words));
            CK(cuMemcpyDtoD(x0, x, m.H * 4));
            std::vector<float> want(m.H), got(m.H);
            // `step` captured into a graph: run once from x0 (`check`, after it), then its time a
            // launch, the median of seven runs of ten.
            auto graph_us = [&](const std::function<void()>& step, const std::function<void()>& check) {
                CUgraph gr; CUgraphExec ge;
                CK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
                step();
                CK(cuStreamEndCapture(stream, &gr));
                CK(cuGraphInstantiate(&ge, gr, 0));
                CK(cuMemcpyDtoD(x, x0, m.H * 4));
                CK(cuGraphLaunch(ge, stream)); CK(cuStreamSynchronize(stream));
                check();
                const int reps = 10;
                float ms = time_ms_g([&] { for (int i = 0; i < reps; i++) CK(cuGraphLaunch(ge, stream)); }, 7);
                CK(cuGraphExecDestroy(ge)); CK(cuGraphDestroy(gr));
                return ms * 1e3f / reps;
            };
            auto timed = [&](const char* label, const std::function<void()>& step, int grid) {
                const bool first = grid == 0;
                const char* same = "reference";
                const float us = graph_us(step, [&] {
                    CK(cuMemcpyDtoH(first ? want.data() : got.data(), x, m.H * 4));
                    if (!first)
                        same = strstr(label, "_none") ? "not checked"
                               : memcmp(want.data(), got.data(), m.H * 4) == 0 ? "yes" : "NO";
                });
                printf("persistent\t%s\t%s\tstep_us %.1f\tblocks %d\tsame_bits %s\n", m.name, label, us, grid,
                       same);
                fflush(stdout);
            };
            timed(lean ? "lean_launched" : "launched", [&] {
                for (int l = 0; l < m.L; l++) {
                    CUdeviceptr base = wpool + l * per_layer;
                    CUdeviceptr w[4] = {base, base + wq, base + wq + wo, base + wq + wo + wgu};
                    CUdeviceptr in[4] = {x, attn, x, act}, out[4] = {qkvb, x, act, x};
                    for (int o = 0; o < 4; o++) {
                        CUfunction f = fn(picks[o].kernel);
                        int r = rows[o], c = cols[o], k = picks[o].ksplit; CUdeviceptr nul = 0;
                        void* a[] = {&w[o], &in[o], &out[o], &r, &c, &c, &r, &k, &gamma, &eps, &nul};
                        launch(f, stream_grid(f, rows[o], k), 256, a, true);
                    }
                }
            }, 0);
            const std::vector<std::string> kernels =
                lean ? std::vector<std::string>{"step_lean_none_4", "step_lean_one_4", "step_lean_one_2"}
                     : std::vector<std::string>{"step_persistent_none", "step_persistent_one", "step_persistent_flag",
                                                "step_persistent_one_split", "step_persistent_flag_split",
                                                "step_persistent_tree_split"};
            for (const std::string& name : kernels) {
                CUfunction f = fn(name);
                const int grid = resident(f);
                int nb[4], ks[4];
                for (int o = 0; o < 4; o++) {
                    ks[o] = picks[o].ksplit;
                    nb[o] = balanced_grid(rows[o], ks[o], grid);
                }
                unsigned long long pl = per_layer; int L = m.L, H = m.H, qw = qkvw, qq = q, I = m.I;
                void* a[] = {&wpool, &pl, &L, &H, &qw, &qq, &I, &x, &qkvb, &attn, &act, &gamma, &eps,
                             &ks[0], &ks[1], &ks[2], &ks[3], &nb[0], &nb[1], &nb[2], &nb[3], &bar};
                timed(name.c_str(), [&] {
                    CK(cuMemsetD32Async(bar, 0, bar_words, stream));
                    launch(f, grid, 256, a, false);
                }, grid);
            }
            if (!lean)
            for (const std::string name : {"barriers_one", "barriers_flag", "barriers_tree"}) {
                CUfunction f = fn(name);
                int count = 4 * m.L - 1;
                const int grid = std::min(resident(f), 2 * sms);
                void* a[] = {&bar, &count};
                const float us = graph_us([&] {
                    CK(cuMemsetD32Async(bar, 0, bar_words, stream));
                    launch(f, grid, 256, a, false);
                }, [] {});
                printf("barriers\t%s\t%s\tus_each %.2f\tblocks %d\tcount %d\n", m.name, name.c_str(), us / count,
                       grid, count);
                fflush(stdout);
            }
            CK(cuMemcpyDtoD(x, x0, m.H * 4));
            CK(cuMemFree(x0)); CK(cuMemFree(bar));
        }
        for (CUdeviceptr d : {head, xn, parts, tokens}) CK(cuMemFree(d));
        for (CUdeviceptr d : {wpool, x, qkvb, attn, act, gamma, kc, vc, pos, rowt, tables, part_o, part_ml, counts, invf}) CK(cuMemFree(d));
    }
}

// Decode attention alone (the filter `att`, described at the top).
static void att_bench() {
    struct AttModel { const char* name; int heads, kvh, D; };
    const AttModel models[] = {{"8b", 32, 8, 128}, {"1b", 32, 8, 64}};
    const int bs = 16;
    printf("att\tmodel\tbatch\tcontexts\tkernel\tus\tKV_GB/s\tmaxdiff\n");
    for (const AttModel& m : models) {
        const int g = m.heads / m.kvh, gd = g * m.D, ld = (m.heads + 2 * m.kvh) * m.D;
        char name[32];
        snprintf(name, sizeof name, "attention_g%d", g);
        CUfunction feng = fn(name);
        // attention_batch.cu at the engine's split and (variants.cu) at 64 and 128 positions.
        std::vector<std::pair<std::string, CUfunction>> tcs;
        for (const char* v : {"", "_s64", "_s128"}) {
            snprintf(name, sizeof name, "attention_batch%s_d%d", v, m.D);
            tcs.push_back({std::string("batch") + v, fn(name)});
        }
        if (!feng) { fprintf(stderr, "att: missing a kernel for %s\n", m.name); exit(1); }
        for (auto& t : tcs) if (!t.second) { fprintf(stderr, "att: missing %s for %s\n", t.first.c_str(), m.name); exit(1); }
        const unsigned eng_smem = 4 * (gd + 4 * gd + 4 * g * 2);  // plan.rs attention_smem_bytes
        const unsigned tc_smem = 4 * 2 * 2 * 16 * (m.D + 8) * 2;   // plan.rs attention_batch_smem_bytes
        for (auto& t : tcs) CK(cuFuncSetAttribute(t.second, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, tc_smem));
        for (int B : {1, 8, 32}) {
            for (const char* mix : {"mixed", "long", "short"}) {
                if (B == 1 && strcmp(mix, "mixed") == 0) continue;  // row 0 is long: "long"
                // ATT_ONLY=model,batch,contexts (e.g. 8b,8,mixed): that case alone, for a profiler.
                if (const char* only = getenv("ATT_ONLY")) {
                    char want[64];
                    snprintf(want, sizeof want, "%s,%d,%s", m.name, B, mix);
                    if (strcmp(only, want) != 0) continue;
                }
                std::vector<int> ctx(B);
                for (int r = 0; r < B; r++)
                    ctx[r] = strcmp(mix, "short") == 0 ? 80 : (strcmp(mix, "long") == 0 || r % 2 == 0) ? 1064 : 80;
                const int max_blocks = (1064 + bs - 1) / bs;
                int nblocks = 0;
                for (int c : ctx) nblocks += (c + bs - 1) / bs;
                // Each row's blocks scattered over the cache: block i of row r at a stride.
                std::vector<int> tables((size_t)B * max_blocks, 0);
                { int next = 0; std::vector<int> order(nblocks);
                  for (int i = 0; i < nblocks; i++) order[i] = (int)((i * 7919ll) % nblocks);
                  for (int r = 0; r < B; r++)
                      for (int b = 0; b < (ctx[r] + bs - 1) / bs; b++) tables[(size_t)r * max_blocks + b] = order[next++]; }
                const size_t cache = (size_t)nblocks * m.kvh * bs * m.D;
                // Copies of the cache, one per timed launch in turn, as a step's layers each read
                // their own: batch 8's K/V (19 MB) would otherwise be served from the 50 MB L2.
                const int copies = (int)std::max<size_t>(1, (size_t)(256u << 20) / (cache * 4) + 1);
                CUdeviceptr kc, vc, kc0, vc0, qkv, pos, rowt, tab, part_o, part_ml, counts, oeng, otc;
                CK(cuMemAlloc(&kc0, cache * 2 * copies)); CK(cuMemAlloc(&vc0, cache * 2 * copies));
                kc = kc0; vc = vc0;
                int turn = 0;
                auto next_copy = [&] {
                    turn = (turn + 1) % copies;
                    kc = kc0 + (size_t)turn * cache * 2; vc = vc0 + (size_t)turn * cache * 2;
                };
                CK(cuMemAlloc(&qkv, (size_t)B * ld * 4));
                CK(cuMemAlloc(&pos, B * 4)); CK(cuMemAlloc(&rowt, B * 4)); CK(cuMemAlloc(&tab, tables.size() * 4));
                CK(cuMemAlloc(&part_o, (size_t)B * m.heads * 32 * m.D * 4));
                CK(cuMemAlloc(&part_ml, (size_t)B * m.heads * 32 * 2 * 4));
                CK(cuMemAlloc(&counts, (size_t)B * m.kvh * 4)); CK(cuMemsetD8(counts, 0, (size_t)B * m.kvh * 4));
                const size_t nout = (size_t)B * m.heads * m.D;
                CK(cuMemAlloc(&oeng, nout * 4)); CK(cuMemAlloc(&otc, nout * 4));
                { size_t n = cache * copies; unsigned s1 = 3, s2 = 4; float k_sc = 2.0f, v_sc = 1.0f, off = 0.0f;
                  void* a[] = {&kc, &n, &s1, &k_sc, &off}; launch(fn("fill_bf16"), 4096, 256, a, false);
                  void* b[] = {&vc, &n, &s2, &v_sc, &off}; launch(fn("fill_bf16"), 4096, 256, b, false);
                  size_t nq = (size_t)B * ld; unsigned s3 = 5;
                  void* c[] = {&qkv, &nq, &s3}; launch(fn("fill_f32"), 256, 256, c, false); }
                std::vector<int> p(B), rt(B);
                for (int r = 0; r < B; r++) { p[r] = ctx[r] - 1; rt[r] = r; }
                CK(cuMemcpyHtoD(pos, p.data(), B * 4)); CK(cuMemcpyHtoD(rowt, rt.data(), B * 4));
                CK(cuMemcpyHtoD(tab, tables.data(), tables.size() * 4));
                CK(cuStreamSynchronize(stream));
                float scale = 1.0f / std::sqrt((float)m.D), eps = 0.0f;
                int ldq = ld, mb = max_blocks, nh = m.heads, nk = m.kvh, hd = m.D, bsz = bs;
                CUdeviceptr nul = 0;
                // The engine as decode launches it (32 splits deep), without its RoPE and K/V write
                // (inv_freq null: q as given, the row's position already in the cache).
                void* ea[] = {&qkv, &ldq, &kc, &vc, &pos, &rowt, &tab, &mb, &nh, &nk, &hd, &bsz, &scale,
                              &part_o, &part_ml, &counts, &oeng, &nul, &nul, &nul, &nul, &eps, &nul};
                void* ta[] = {&qkv, &ldq, &kc, &vc, &pos, &rowt, &tab, &mb, &nh, &nk, &bsz, &scale,
                              &part_o, &part_ml, &counts, &otc, &nul};
                auto launch3 = [&](CUfunction f, unsigned z, unsigned smem, void** a) {
                    CUlaunchConfig cfg = {};
                    cfg.gridDimX = B; cfg.gridDimY = m.kvh; cfg.gridDimZ = z;
                    cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1;
                    cfg.sharedMemBytes = smem; cfg.hStream = stream;
                    CK(cuLaunchKernelEx(&cfg, f, a, nullptr));
                };
                auto eng = [&] { next_copy(); launch3(feng, 32, eng_smem, ea); };
                turn = copies - 1;  // the checked launches read copy 0
                eng(); CK(cuStreamSynchronize(stream));
                std::vector<float> a(nout), b(nout);
                CK(cuMemcpyDtoH(a.data(), oeng, nout * 4));
                double big = 0;
                for (float v : a) big = std::max(big, (double)std::fabs(v));
                double kv_bytes = 0;
                for (int c : ctx) kv_bytes += 2.0 * c * m.kvh * m.D * 2;
                const int reps = 20;
                auto report = [&](const std::string& kname, const std::function<void()>& body, double diff) {
                    const float ms = time_ms_g([&] { for (int i = 0; i < reps; i++) body(); }, 7);
                    const double us = ms * 1e3 / reps;
                    printf("att\t%s\t%d\t%s\t%s\t%.1f\t%.0f\t%.2e\n", m.name, B, mix, kname.c_str(), us,
                           kv_bytes / (us * 1e-6) / 1e9, diff);
                    fflush(stdout);
                };
                report("engine", eng, 0.0);
                // One launch of `body` over copy 0 into otc: its largest difference from `a`,
                // relative to a's largest magnitude.
                auto checked = [&](const std::function<void()>& body) {
                    CK(cuMemsetD8(otc, 0, nout * 4));
                    turn = copies - 1;
                    body(); CK(cuStreamSynchronize(stream));
                    CK(cuMemcpyDtoH(b.data(), otc, nout * 4));
                    double diff = 0;
                    for (size_t i = 0; i < nout; i++) diff = std::max(diff, (double)std::fabs(a[i] - b[i]));
                    return diff / big;
                };
                // attention_batch.cu as the cuBLAS step launches it (after rope_kv): 32 splits deep.
                for (auto& t : tcs) {
                    CUfunction ftc = t.second;
                    auto tc = [&] { next_copy(); launch3(ftc, 32, tc_smem, ta); };
                    report(t.first, tc, checked(tc));
                }
                // RoPE folded in on both sides: attention.cu as decode launches it (rotation, K/V
                // write) against attention_batch.cu doing the same (variants.cu's ROPE
                // instantiations), the differences against the former.
                {
                    std::vector<float> f(m.D / 2);
                    for (int i = 0; i < m.D / 2; i++) f[i] = std::pow(500000.0f, -2.0f * i / m.D);
                    CUdeviceptr invf;
                    CK(cuMemAlloc(&invf, f.size() * 4)); CK(cuMemcpyHtoD(invf, f.data(), f.size() * 4));
                    void* er[] = {&qkv, &ldq, &kc, &vc, &pos, &rowt, &tab, &mb, &nh, &nk, &hd, &bsz, &scale,
                                  &part_o, &part_ml, &counts, &oeng, &nul, &nul, &nul, &nul, &eps, &invf};
                    auto eng_rope = [&] { next_copy(); launch3(feng, 32, eng_smem, er); };
                    turn = copies - 1;
                    eng_rope(); CK(cuStreamSynchronize(stream));
                    CK(cuMemcpyDtoH(a.data(), oeng, nout * 4));
                    report("engine_rope", eng_rope, 0.0);
                    const unsigned rope_smem = tc_smem + (g + 2) * m.D * 4 + 2 * m.D * 2;
                    void* br[] = {&qkv, &ldq, &kc, &vc, &pos, &rowt, &tab, &mb, &nh, &nk, &bsz, &scale,
                                  &part_o, &part_ml, &counts, &otc, &nul, &nul, &nul, &nul, &eps, &invf};
                    for (const char* v : {"", "_s64", "_s128"}) {
                        snprintf(name, sizeof name, "attention_batch_rope%s_d%d", v, m.D);
                        CUfunction fr = fn(name);
                        if (!fr) { fprintf(stderr, "att: missing %s\n", name); exit(1); }
                        CK(cuFuncSetAttribute(fr, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, rope_smem));
                        auto tr = [&] { next_copy(); launch3(fr, 32, rope_smem, br); };
                        report(std::string("batch_rope") + v, tr, checked(tr));
                    }
                    // What the batched steps ran before session 41: rope_kv (the rotation and the
                    // K/V write, a block a row), then attention_batch.cu; the pair's time against
                    // batch_rope's (the engine's since). rope_kv rotates qkv in place at every
                    // launch, so the outputs are not checked.
                    CUfunction frk = fn("rope_kv");
                    if (!frk) { fprintf(stderr, "att: missing rope_kv\n"); exit(1); }
                    void* rk[] = {&qkv, &nul, &nul, &nul, &eps, &invf, &pos, &rowt, &tab, &mb, &kc, &vc,
                                  &nh, &nk, &hd, &bsz};
                    for (auto& t : tcs) {
                        CUfunction ftc = t.second;
                        auto pair = [&] { next_copy(); launch(frk, B, 256, rk, false); launch3(ftc, 32, tc_smem, ta); };
                        report("rope_kv+" + t.first, pair, -1.0);
                    }
                    CK(cuMemFree(invf));
                }
                for (CUdeviceptr d : {kc0, vc0, qkv, pos, rowt, tab, part_o, part_ml, counts, oeng, otc}) CK(cuMemFree(d));
            }
        }
    }
}

int main(int argc, char** argv) {
    if (argc < 2) { fprintf(stderr, "usage: gemv-bench kernels.cubin [filter]\n"); return 2; }
    const char* filter = argc > 2 ? argv[2] : "";
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    std::ifstream in(argv[1], std::ios::binary);
    std::vector<char> cubin((std::istreambuf_iterator<char>(in)), {});
    CK(cuModuleLoadData(&mod, cubin.data()));
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&ge0, CU_EVENT_DEFAULT)); CK(cuEventCreate(&ge1, CU_EVENT_DEFAULT));
    // seq and att make their own buffers: the GEMV shapes' 3 GiB pool is not theirs to fill.
    if (std::string(filter) == "seq") { seq_bench(); return 0; }
    if (std::string(filter) == "att") { att_bench(); return 0; }

    const size_t pool_bytes = 3ull << 30;
    CUdeviceptr pool, x, y, yref, gamma, out;
    CK(cuMemAlloc(&pool, pool_bytes));
    CK(cuMemAlloc(&x, 8 * 16384 * 4));
    CK(cuMemAlloc(&y, 8 * 32768 * 4));
    CK(cuMemAlloc(&yref, 8 * 32768 * 4));
    CK(cuMemAlloc(&gamma, 16384 * 2));
    CK(cuMemAlloc(&out, 64));
    {
        size_t n = pool_bytes / 2; unsigned seed = 7; float sc = 0.05f, off = 0.0f;
        void* a[] = {&pool, &n, &seed, &sc, &off};
        launch(fn("fill_bf16"), 4096, 256, a, false);
        size_t ng = 16384; unsigned s2 = 9; float sc2 = 0.2f, off2 = 1.0f;
        void* b[] = {&gamma, &ng, &s2, &sc2, &off2};
        launch(fn("fill_bf16"), 64, 256, b, false);
        size_t nx = 8 * 16384; unsigned s3 = 11;
        void* c[] = {&x, &nx, &s3};
        launch(fn("fill_f32"), 256, 256, c, false);
        CK(cuStreamSynchronize(stream));
    }
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT)); CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    auto time_ms = [&](auto&& body, int reps) {
        body(); CK(cuStreamSynchronize(stream));
        std::vector<float> t;
        for (int i = 0; i < reps; i++) {
            CK(cuEventRecord(e0, stream)); body(); CK(cuEventRecord(e1, stream));
            CK(cuEventSynchronize(e1));
            float ms; CK(cuEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    // Ceilings: device copy (read + write) and a read-only stream, 1 GiB.
    {
        size_t bytes = 1ull << 30;
        float ms = time_ms([&] { CK(cuMemcpyDtoDAsync(pool + bytes, pool, bytes, stream)); }, 7);
        printf("ceiling\tcopy\t%.1f GB/s\n", 2.0 * bytes / (ms * 1e-3) / 1e9);
        size_t n = (2ull << 30) / 16;
        for (int blocks : {sms * 4, sms * 8, sms * 16}) {
            void* a[] = {&pool, &n, &out};
            CUfunction f = fn("read_only");
            ms = time_ms([&] { launch(f, blocks, 256, a, false); }, 7);
            printf("ceiling\tread_only_%d\t%.1f GB/s\n", blocks, 16.0 * n / (ms * 1e-3) / 1e9);
        }
    }

    const Shape shapes[] = {
        {"1b.qkv", 3072, 2048, 3}, {"1b.o", 2048, 2048, 1}, {"1b.gate_up", 8192, 2048, 4},
        {"1b.down", 2048, 8192, 1}, {"8b.qkv", 6144, 4096, 3}, {"8b.o", 4096, 4096, 1},
        {"8b.gate_up", 14336, 4096, 4}, {"8b.down", 4096, 14336, 1},
    };
    const int N = 40;  // launches per graph
    printf("shape\tB\tkernel\tksplit\tgrid\tus\tGB/s\tmaxdiff\n");
    for (int B : {1, 8}) {
        for (const Shape& s : shapes) {
            const int nw = (s.mode == 4) ? 2 : 1;
            const size_t bytes = (size_t)nw * s.rows * s.cols * 2;
            const int copies = (int)std::min<size_t>(pool_bytes / bytes, std::max<size_t>(2, (640ull << 20) / bytes + 1));
            float eps = 1e-5f;
            // Reference: the engine's kernel with its own ksplit, one launch on copy 0.
            auto run_once = [&](CUfunction f, int ks, unsigned grid, unsigned block, CUdeviceptr dst) {
                CK(cuMemsetD8Async(dst, 0, 8 * 32768 * 4, stream));
                int rows = s.rows, cols = s.cols, ldx = s.cols, ldy = s.rows, k = ks; CUdeviceptr w = pool, parts = 0;
                void* a[] = {&w, &x, &dst, &rows, &cols, &ldx, &ldy, &k, &gamma, &eps, &parts};
                launch(f, grid, block, a, true);
                CK(cuStreamSynchronize(stream));
            };
            auto maxdiff = [&]() {
                std::vector<float> a(B * s.rows), b(B * s.rows);
                CK(cuMemcpyDtoH(a.data(), yref, a.size() * 4));
                CK(cuMemcpyDtoH(b.data(), y, b.size() * 4));
                double m = 0;
                for (size_t i = 0; i < a.size(); i++) m = std::max(m, (double)std::fabs(a[i] - b[i]) / (1e-3 + std::fabs(a[i])));
                return m;
            };
            auto bench = [&](const std::string& name, CUfunction f, int ks, unsigned grid, unsigned block) {
                if (!f) { printf("%s\t%d\t%s\tmissing\n", s.name, B, name.c_str()); return; }
                if (*filter && name.find(filter) == std::string::npos && name != "engine") return;
                run_once(f, ks, grid, block, y);
                const double md = maxdiff();
                CUgraph g; CUgraphExec ge;
                CK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
                std::vector<CUdeviceptr> ws(N);
                int rows = s.rows, cols = s.cols, ldx = s.cols, ldy = s.rows, k = ks; CUdeviceptr parts = 0;
                for (int i = 0; i < N; i++) {
                    ws[i] = pool + (size_t)(i % copies) * bytes;
                    void* a[] = {&ws[i], &x, &y, &rows, &cols, &ldx, &ldy, &k, &gamma, &eps, &parts};
                    launch(f, grid, block, a, true);
                }
                CK(cuStreamEndCapture(stream, &g));
                CK(cuGraphInstantiate(&ge, g, 0));
                float ms = time_ms([&] { CK(cuGraphLaunch(ge, stream)); }, 9);
                double us = ms * 1e3 / N;
                printf("%s\t%d\t%s\t%d\t%u\t%.2f\t%.0f\t%.1e\n", s.name, B, name.c_str(), ks, grid, us,
                       bytes / (us * 1e-6) / 1e9, md);
                fflush(stdout);
                CK(cuGraphExecDestroy(ge)); CK(cuGraphDestroy(g));
            };
            char pn[64];
            if (s.mode == 1 && engine_mma(s.rows, s.cols)) {
                // The engine's mode 7, and its CUDA-core mode 1 beside it.
                snprintf(pn, sizeof pn, "gemv_m7_b%d", B);
                run_once(fn(pn), 8, mma_grid(fn(pn), s.rows, 8), 256, yref);
                bench("engine", fn(pn), 8, mma_grid(fn(pn), s.rows, 8), 256);
                snprintf(pn, sizeof pn, "gemv_m1_b%d", B);
                const int k1 = engine_ksplit(s.rows, s.cols);
                bench("cuda_cores", fn(pn), k1, stream_grid(fn(pn), s.rows, k1), 256);
            }
            int eks = engine_ksplit(s.rows, s.cols, s.mode == 4);
            // plan.rs gemv_launch: tall gate/up past batch 1 runs mode 6, one warp for both slices.
            const bool one_warp = s.mode == 4 && eks == 2 && B > 1 && s.rows >= 8192;
            if (one_warp) eks = 1;
            snprintf(pn, sizeof pn, "gemv_m%d_b%d", one_warp ? 6 : s.mode, B);
            if (!(s.mode == 1 && engine_mma(s.rows, s.cols))) {
                run_once(fn(pn), eks, stream_grid(fn(pn), s.rows, eks), 256, yref);
                bench("engine", fn(pn), eks, stream_grid(fn(pn), s.rows, eks), 256);
            }
            const int chunks = s.cols / 8;
            for (int ks : {1, 2, 4, 8}) {
                if (chunks % ks || chunks / ks < 32) continue;
                if (ks != eks) bench(std::string("engine_k") + std::to_string(ks), fn(pn), ks, stream_grid(fn(pn), s.rows, ks), 256);
                // The tensor-core GEMV at this mode; at B = 8 also whether batch row 0's result is
                // the same bits as the B = 1 kernel's.
                for (int u : {1, 2, 4, 8}) {
                    char name[64];
                    snprintf(name, sizeof name, "mmas_m%d_b%d_u%d", s.mode, B, u);
                    CUfunction f = fn(name);
                    if (!f || s.rows % 16 != 0 || s.cols % (32 * u * ks) != 0) continue;
                    const unsigned grid = mma_grid(f, s.rows, ks);
                    bench(name, f, ks, grid, 256);
                    if (B == 8 && (!*filter || std::string(name).find(filter) != std::string::npos)) {
                        snprintf(name, sizeof name, "mmas_m%d_b1_u%d", s.mode, u);
                        CUfunction f1 = fn(name);
                        run_once(f, ks, grid, 256, y);
                        std::vector<float> a8(s.rows), a1(s.rows);
                        CK(cuMemcpyDtoH(a8.data(), y, s.rows * 4));
                        run_once(f1, ks, mma_grid(f1, s.rows, ks), 256, y);
                        CK(cuMemcpyDtoH(a1.data(), y, s.rows * 4));
                        printf("%s\tinvariant\tmmas_u%d\tks%d\t%s\n", s.name, u, ks,
                               memcmp(a8.data(), a1.data(), s.rows * 4) == 0 ? "b8 row 0 == b1" : "DIFFERS");
                    }
                }
                for (int g : {2, 4, 8}) {
                    char name[64];
                    snprintf(name, sizeof name, "stream_m%d_b%d_g%d", s.mode, B, g);
                    CUfunction f = fn(name);
                    if (f) bench(name, f, ks, stream_grid(f, s.rows, ks), 256);
                }
            }
        }
    }
    return 0;
}
