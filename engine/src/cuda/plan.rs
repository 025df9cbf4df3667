//! Host-side arithmetic of the CUDA backend, kept free of CUDA so it is tested everywhere:
//! what the checkpoint needs on the device, the shapes of every buffer a decode step touches,
//! and each kernel's launch geometry.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::PoolShape;

/// Warps per block of the GEMV kernels (`GEMV_WARPS` in gemv.cu, defined by [`KERNEL_DEFINES`]).
pub const GEMV_WARPS: usize = 8;
/// Threads per block of the GEMV kernels.
pub const GEMV_THREADS: u32 = 32 * GEMV_WARPS as u32;
/// Warps in flight the GEMV grid aims for: 132 multiprocessors x 64 warps on an H200.
const GEMV_TARGET_WARPS: usize = 8192;
/// Warps per block of the attention kernel (`ATT_WARPS` in attention.cu).
pub const ATT_WARPS: usize = 4;
/// Threads per block of the attention kernel.
pub const ATT_THREADS: u32 = 32 * ATT_WARPS as u32;
/// Most query heads per KV head the attention kernel holds (`ATT_MAXG` in attention.cu, which
/// instantiates it for 1, 2, 4 and 8).
pub const ATT_MAXG: usize = 8;
/// Largest head dimension the attention kernel handles (16 lanes of 8 dimensions per position;
/// `MAX_HEAD_DIM` in the kernels).
pub const MAX_HEAD_DIM: usize = 128;
/// Warps per block of the prefill attention (`ATT_PF_WARPS` in attention_prefill.cu), each 16
/// query rows of the block's tile.
pub const ATT_PF_WARPS: usize = 4;
/// Query rows of one prefill attention block.
pub const ATT_PF_ROWS: usize = 16 * ATT_PF_WARPS;
/// Positions per K/V tile the prefill attention stages in shared memory (`ATT_PF_POS`).
pub const ATT_PF_POS: usize = 64;
/// Positions per attention split (`ATT_SPLIT_MIN` in attention.cu).
pub const ATT_SPLIT_MIN: usize = 16;
/// Context splits per (sequence, KV head) in decode: the attention grid's depth. A row uses one
/// split per 16 positions of its context (`ATT_SPLIT_MIN`), up to this many, whatever the batch
/// (attention.cu `ATT_MAX_SPLITS`): a split's positions are one or a few steps of its block, so
/// the chain of dependent loads stays short at every context length.
pub const MAX_SPLITS: usize = 32;
/// Positions per split of the cuBLAS step's decode attention on the tensor cores
/// (attention_batch.cu `ATT_BATCH_SPLIT`), up to [`MAX_SPLITS`] splits. Its blocks each stream
/// whole chunks of 16 positions through shared memory, so longer splits than attention.cu's
/// pay their set-up and merge over more reading: at batch 32 on the 8B's heads, splits of 256
/// took 45 us a layer where 64 took 73 and attention.cu 97 (docs/ENGINE.md, session 17).
pub const ATT_BATCH_SPLIT: usize = 256;
/// 16-byte loads per lane per weight row per step of the tensor-core GEMV (`GEMV_MMA_U`).
pub const MMA_U: usize = 4;
/// The constants above that the kernels use, defined here once and handed to NVRTC as `-D`
/// options (kernels.rs); the kernel files do not define them.
pub const KERNEL_DEFINES: [(&str, usize); 16] = [
    ("GEMV_WARPS", GEMV_WARPS),
    ("GEMV_MMA_U", MMA_U),
    ("ATT_WARPS", ATT_WARPS),
    ("ATT_MAXG", ATT_MAXG),
    ("ATT_SPLIT_MIN", ATT_SPLIT_MIN),
    ("ATT_MAX_SPLITS", MAX_SPLITS),
    ("ATT_PF_WARPS", ATT_PF_WARPS),
    ("ATT_PF_POS", ATT_PF_POS),
    ("ATT_BATCH_SPLIT", ATT_BATCH_SPLIT),
    ("MAX_HEAD_DIM", MAX_HEAD_DIM),
    ("MAMBA_MAX_WINDOW", MAMBA_MAX_WINDOW),
    ("MAMBA_SSM_PER", MAMBA_SSM_PER),
    ("MAMBA_SCAN_CH", MAMBA_SCAN_CH),
    ("MAMBA_SSD_ROWS", MAMBA_SSD_ROWS),
    ("MAMBA_SSD_HD", MAMBA_SSD_HD),
    ("MAMBA_SSD_N", MAMBA_SSD_N),
];

/// The longest conv window (`conv_kernel - 1`) the Mamba conv kernel keeps in registers.
pub const MAMBA_MAX_WINDOW: usize = 7;
/// Most SSM state values one thread of `mamba_ssm` keeps in registers (mamba.cu).
pub const MAMBA_SSM_PER: usize = 32;

/// Threads per channel of `mamba_ssm`: the least power of two that leaves each at most
/// [`MAMBA_SSM_PER`] of the channel's `d_state` values, so the state stays in registers (4 for
/// Nemotron-H-8B's 128: 256 threads per head of 64 channels). `None` where `d_state` does not
/// split evenly that way.
pub fn mamba_ssm_split(d_state: usize) -> Option<usize> {
    let mut s = 1;
    while s <= 32 {
        if d_state % s == 0 && d_state / s <= MAMBA_SSM_PER {
            return Some(s);
        }
        s *= 2;
    }
    None
}

/// Most channels of a head one thread of the prefill scan keeps (mamba.cu): each B and C value it
/// reads from shared memory serves that many, where the decode step's thread keeps one.
pub const MAMBA_SCAN_CH: usize = 2;

/// Channels a thread of the prefill scan keeps: [`MAMBA_SCAN_CH`] where the head's channels divide
/// by it and the threads left still fill whole warps (the split's shuffles take a whole warp),
/// else one.
pub fn mamba_scan_channels(m: &crate::hybrid::Mamba) -> usize {
    let split = mamba_ssm_split(m.d_state).unwrap_or(1);
    let ch = MAMBA_SCAN_CH;
    if m.head_dim % ch == 0 && (split == 1 || (m.head_dim / ch * split) % 32 == 0) {
        ch
    } else {
        1
    }
}

/// Threads of a `mamba_ssm` block (prefill) or a `mamba_ssm_step` one (decode): `split` per
/// channel, over the head's channels a thread keeps one of (decode) or
/// [`mamba_scan_channels`] of (prefill).
pub fn mamba_ssm_threads(m: &crate::hybrid::Mamba, prefill: bool) -> u32 {
    let split = mamba_ssm_split(m.d_state).unwrap_or(1);
    let ch = if prefill { mamba_scan_channels(m) } else { 1 };
    (m.head_dim / ch * split) as u32
}

/// Rows per chunk of `mamba_conv` in prefill: a segment's rows are cut into chunks of this many,
/// a block row each (mamba.cu). At least the longest window, so that only a segment's first
/// chunk reads its slot's window. 32 rather than 16: alone on the battery's batch-8 pass of
/// Nemotron-H-8B 8% faster (123 against 134 us a layer on an H100; 64 no faster), 4% in the
/// engine's prefill; the same bits at any cut (mamba_gpu_tests.rs).
pub const MAMBA_CONV_ROWS: usize = 32;
const _: () = assert!(MAMBA_CONV_ROWS >= MAMBA_MAX_WINDOW);

/// Threads of a `mamba_gated_norm` block (mamba.cu), decode and prefill alike: four channels of
/// the group each, in whole warps, at most 1,024.
pub fn mamba_norm_threads(m: &crate::hybrid::Mamba) -> u32 {
    (m.inner() / m.n_groups)
        .div_ceil(4)
        .next_multiple_of(32)
        .min(1024) as u32
}

/// Values of a `swiglu` or `relu2` thread, and so the width a block of 256 covers.
pub const ACT_VALUES: usize = 4;

/// Block rows of a prefill `mamba_conv` over segments of these lengths: chunks of `rows_per`.
pub fn mamba_conv_chunks(lens: impl IntoIterator<Item = usize>, rows_per: usize) -> usize {
    lens.into_iter().map(|n| n.div_ceil(rows_per)).sum()
}

/// Rows of a prefill segment `mamba_ssm` stages in shared memory at once: the most, up to 32,
/// whose two tiles ([`mamba_scan_smem_bytes`]) fit the 48 KiB a block gets without asking.
pub fn mamba_scan_tile(m: &crate::hybrid::Mamba) -> usize {
    let mut tile = 32;
    while tile > 1 && mamba_scan_smem_bytes(m, tile) > 48 << 10 {
        tile /= 2;
    }
    tile
}

/// Floats of one staged tile of `mamba_ssm` (mamba.cu): per row the group's B and C, each
/// thread's share in a region of whole float4s plus four words, the head's x, dt and exp(dt A);
/// rounded up to whole float4s.
fn mamba_scan_tile_floats(m: &crate::hybrid::Mamba, tile: usize) -> usize {
    let split = mamba_ssm_split(m.d_state).unwrap_or(1);
    let region = (m.d_state / split).next_multiple_of(4) + 4;
    (tile * (2 * split * region + m.head_dim + 2)).next_multiple_of(4)
}

/// Rows of a chunk of the chunked prefill scan (mamba_ssd.cu): a chunk ends where a row's
/// position is a multiple of this, so a sequence's chunks do not depend on its batch.
pub const MAMBA_SSD_ROWS: usize = 32;
/// Most channels a head and state values a channel the chunked scan takes (mamba_ssd.cu's
/// tiles); a model past either prefills through `mamba_ssm`, the sequential scan.
pub const MAMBA_SSD_HD: usize = 64;
pub const MAMBA_SSD_N: usize = 128;
/// Threads of a `mamba_ssd` block: eight warps, two blocks a multiprocessor.
pub const MAMBA_SSD_THREADS: u32 = 256;

/// Whether prefill scans `m`'s heads in chunks on the tensor cores (`mamba_ssd`) rather than
/// sequentially (`mamba_ssm`).
pub fn mamba_ssd(m: &crate::hybrid::Mamba) -> bool {
    m.head_dim <= MAMBA_SSD_HD && m.d_state <= MAMBA_SSD_N
}

/// Dynamic shared memory of a `mamba_ssd` block (mamba_ssd.cu): two stages of B and C
/// [rows][N + 8], x [rows][hd + 8] and dt [rows]; the decayed C . B [rows][rows + 4]; y's state
/// term from each half of the state values [2][rows][hd + 4].
pub fn mamba_ssd_smem_bytes() -> u32 {
    let (l, hd, n) = (MAMBA_SSD_ROWS, MAMBA_SSD_HD, MAMBA_SSD_N);
    let stage = 2 * l * (n + 8) + l * (hd + 8) + l;
    let floats = 2 * stage + l * (l + 4) + 2 * l * (hd + 4);
    (floats * 4) as u32
}

/// Dynamic shared memory of `mamba_ssm` staging `tile` rows two tiles deep (0 for decode, which
/// stages none).
pub fn mamba_scan_smem_bytes(m: &crate::hybrid::Mamba, tile: usize) -> u32 {
    if tile == 0 {
        return 0;
    }
    (2 * mamba_scan_tile_floats(m, tile) * 4) as u32
}

/// Floats of one stage of `mamba_ssm_step` (mamba.cu): a head's state [N][hd], then its row's x,
/// B, C, dt and position and the head's A, D and dt_bias, rounded up to whole float4s.
pub fn mamba_step_stage_floats(m: &crate::hybrid::Mamba) -> usize {
    m.d_state * m.head_dim + (m.head_dim + 2 * m.d_state + 5).next_multiple_of(4)
}

/// Dynamic shared memory of a `mamba_ssm_step` block: two stages (the item it computes and the
/// next one, staged meanwhile) and a float per thread for the split's shares of y.
pub fn mamba_step_smem_bytes(m: &crate::hybrid::Mamba) -> u32 {
    ((2 * mamba_step_stage_floats(m) + mamba_ssm_threads(m, false) as usize) * 4) as u32
}

/// Most threads of a `mamba_ssm_step` block (its `__launch_bounds__`, mamba.cu: 80 registers).
pub const MAMBA_STEP_MAX_THREADS: usize = 768;

/// The decode GEMV kernels of gemv.cu, each compiled for 1..=[`MAX_GEMV_BATCH`] activation rows
/// as `gemv_m{number}_b{batch}` (the number is gemv.cu's `MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvMode {
    /// y += W x: o_proj and down_proj, adding into the residual stream (1).
    Residual,
    /// y = W RMSNorm(x), the norm's gain folded in: q/k/v (3).
    Norm,
    /// y[j] = silu(W[j] n) * (W[rows + j] n), n = RMSNorm(x): gate and up stacked (4).
    NormSwiglu,
    /// The lm_head: per block, the largest bf16-rounded W x of its rows and that row, the argmax
    /// candidates `argmax_final` picks from (5).
    LmHead,
    /// [`GemvMode::NormSwiglu`] with one warp summing a row's two slices of K (6).
    NormSwigluOneWarp,
    /// [`GemvMode::Residual`] on the tensor cores (7).
    ResidualMma,
    /// [`GemvMode::Norm`] on the tensor cores (8).
    NormMma,
    /// [`GemvMode::NormSwiglu`] on the tensor cores (9).
    NormSwigluMma,
    /// y = relu(W RMSNorm(x))^2: Nemotron-H's MLP up with its activation (10).
    NormRelu2,
    /// [`GemvMode::NormRelu2`] on the tensor cores (11).
    NormRelu2Mma,
    /// [`GemvMode::LmHead`] on the tensor cores (12).
    LmHeadMma,
}

impl GemvMode {
    /// Every mode the engine launches, in the order of [`GemvMode::index`].
    pub const ALL: [GemvMode; 11] = [
        Self::Residual,
        Self::Norm,
        Self::NormSwiglu,
        Self::LmHead,
        Self::NormSwigluOneWarp,
        Self::ResidualMma,
        Self::NormMma,
        Self::NormSwigluMma,
        Self::NormRelu2,
        Self::NormRelu2Mma,
        Self::LmHeadMma,
    ];

    /// gemv.cu's `MODE`, in the kernel's name.
    pub fn number(self) -> usize {
        match self {
            Self::Residual => 1,
            Self::Norm => 3,
            Self::NormSwiglu => 4,
            Self::LmHead => 5,
            Self::NormSwigluOneWarp => 6,
            Self::ResidualMma => 7,
            Self::NormMma => 8,
            Self::NormSwigluMma => 9,
            Self::NormRelu2 => 10,
            Self::NormRelu2Mma => 11,
            Self::LmHeadMma => 12,
        }
    }

    /// The mode's place in [`GemvMode::ALL`].
    pub fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|&m| m == self)
            .expect("ALL lists every mode")
    }

    /// The kernel of this mode for `batch` activation rows.
    pub fn kernel(self, batch: usize) -> String {
        format!("gemv_m{}_b{batch}", self.number())
    }

    /// The verify request's variant of an lm_head kernel, which writes its logits too.
    pub fn logits_kernel(self, batch: usize) -> String {
        format!("gemv_m{}_logits_b{batch}", self.number())
    }

    /// The mode on the tensor cores, for the modes that have one.
    pub fn on_tensor_cores(self) -> Option<GemvMode> {
        match self {
            Self::Residual => Some(Self::ResidualMma),
            Self::Norm => Some(Self::NormMma),
            Self::NormSwiglu => Some(Self::NormSwigluMma),
            Self::NormRelu2 => Some(Self::NormRelu2Mma),
            Self::LmHead => Some(Self::LmHeadMma),
            _ => None,
        }
    }

    /// Whether the kernel leaves argmax candidates (an lm_head).
    pub fn is_lm_head(self) -> bool {
        matches!(self, Self::LmHead | Self::LmHeadMma)
    }

    /// Weight rows read per output row: gate/up reads a gate and an up row.
    pub fn weight_rows(self) -> usize {
        match self {
            Self::NormSwiglu | Self::NormSwigluOneWarp | Self::NormSwigluMma => 2,
            _ => 1,
        }
    }
}

/// The GEMV kernels are instantiated for 1..=8 activation rows.
pub const MAX_GEMV_BATCH: usize = 8;
/// The most sequences the CUDA backend decodes in one step (`--max-batch`): batches of up to
/// [`MAX_GEMV_BATCH`] may run the decode GEMVs, larger ones run cuBLAS ([`StepPath`]).
pub const MAX_BATCH: usize = 32;

/// How a decode step computes its matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StepPath {
    /// gemv.cu's decode GEMVs (the load-time tuning's kernel per shape), RMSNorm and the
    /// activation folded in, f32 activations (about 16 bits of each kept on the tensor cores).
    #[serde(rename = "gemv")]
    Gemv,
    /// cuBLAS GEMMs, bf16 in and f32 out (bf16 out for the MLP's up GEMM), as prefill runs
    /// them: RMSNorm, SwiGLU or relu2 and the lm_head's argmax are kernels of their own, and
    /// every activation a GEMM reads is bf16.
    #[serde(rename = "cublas")]
    Blas,
}

impl StepPath {
    /// The path a step of `batch` rows runs: batch 1 the GEMVs; batches 2 to
    /// [`MAX_GEMV_BATCH`] `batched` (the load's choice, timed: cuda/paths.rs); larger batches
    /// cuBLAS, the GEMV kernels holding at most 8 rows.
    pub fn of(batch: usize, batched: StepPath) -> StepPath {
        match batch {
            0 | 1 => StepPath::Gemv,
            b if b <= MAX_GEMV_BATCH => batched,
            _ => StepPath::Blas,
        }
    }
}
/// Prompt tokens per prefill pass: bounds the prefill scratch whatever the prompt length. Each
/// pass costs its longest segment's sequential Mamba scan, a host sync and a partial last wave
/// of every GEMM, so a batch's prompts go in as few passes as the scratch allows: the
/// orchestrator's battery (8 prompts, 2,712 tokens) in one (1,024 cut it into three:
/// docs/ENGINE.md, session 19), four times over at batch 32 in two (4,096 made three, and
/// Llama-3.1-8B's batch-32 prefill 4.5% longer on an H100: session 46).
pub const PREFILL_CHUNK: usize = 8192;

/// One prompt's rows in a prefill pass: prompt `seq`'s positions `from..from + len`, at rows
/// `row..row + len` of the pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub seq: usize,
    pub from: usize,
    pub len: usize,
    pub row: usize,
}

impl Segment {
    /// Whether the prompt (of `prompt_len` tokens) ends in this segment.
    pub fn ends(&self, prompt_len: usize) -> bool {
        self.from + self.len == prompt_len
    }
}

/// The prefill passes of prompts of `lens` tokens, prefilled together: each prompt cut where it
/// is cut alone (every `chunk` positions), and those pieces packed, shortest prompt first (in
/// order among prompts of one length), into passes of at most `chunk` rows, a piece that does
/// not fit starting the next pass. A piece is one segment. A pass's GEMMs run over all of its
/// rows, or in parts where a shape pins algorithms of different bits for short and long prompts
/// (gemm.rs): the order puts a pass's short prompts first, so each part is one range of rows.
/// The row-wise kernels (norms, attention, the Mamba scan over every segment at once, longest
/// first) run over the whole pass.
pub fn prefill_passes(lens: &[usize], chunk: usize) -> Vec<Vec<Segment>> {
    let mut passes = Vec::new();
    let mut cur: Vec<Segment> = Vec::new();
    let mut used = 0;
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&k| lens[k]);
    for seq in order {
        let len = lens[seq];
        let mut from = 0;
        while from < len {
            let n = (len - from).min(chunk);
            if used + n > chunk {
                passes.push(std::mem::take(&mut cur));
                used = 0;
            }
            cur.push(Segment {
                seq,
                from,
                len: n,
                row: used,
            });
            used += n;
            from += n;
        }
    }
    if !cur.is_empty() {
        passes.push(cur);
    }
    passes
}

/// Checks that the model fits the kernels' assumptions; the error names the figure.
pub fn check_model(cfg: &ModelConfig) -> Result<()> {
    let fail = |message: String| Err(Error::Load { message });
    let group = cfg.num_heads / cfg.num_kv_heads;
    if cfg.head_dim > MAX_HEAD_DIM || cfg.head_dim % 8 != 0 {
        return fail(format!(
            "head_dim {} is not a multiple of 8 up to {MAX_HEAD_DIM}, which the CUDA attention \
             kernel needs",
            cfg.head_dim
        ));
    }
    if group > ATT_MAXG {
        return fail(format!(
            "{group} query heads per KV head exceed the CUDA attention kernel's {ATT_MAXG}"
        ));
    }
    for (what, n) in [
        ("hidden_size", cfg.hidden_size),
        ("intermediate_size", cfg.intermediate_size),
        ("num_attention_heads x head_dim", cfg.q_dim()),
    ] {
        if n % 8 != 0 {
            return fail(format!(
                "{what} = {n} is not a multiple of 8; the CUDA GEMV reads weight rows 16 bytes \
                 at a time"
            ));
        }
    }
    if cfg.o_bias || cfg.mlp_bias {
        return fail(
            "attention_bias on o_proj or mlp_bias is not implemented on the CUDA backend; use \
             --device cpu"
                .into(),
        );
    }
    match &cfg.hybrid {
        Some(h) => check_mamba(&h.mamba),
        None => Ok(()),
    }
}

/// The Mamba-2 mixer's sizes against the kernels' (mamba.cu) assumptions.
fn check_mamba(m: &crate::hybrid::Mamba) -> Result<()> {
    let fail = |message: String| Err(Error::Load { message });
    if m.proj_bias {
        return fail(
            "use_bias = true (biases on the Mamba in_proj and out_proj) is not implemented on \
             the CUDA backend; use --device cpu"
                .into(),
        );
    }
    if m.conv_kernel - 1 > MAMBA_MAX_WINDOW {
        return fail(format!(
            "conv_kernel = {} exceeds the CUDA conv kernel's window of {} past inputs",
            m.conv_kernel, MAMBA_MAX_WINDOW
        ));
    }
    let Some(split) = mamba_ssm_split(m.d_state) else {
        return fail(format!(
            "ssm_state_size = {} does not split into at most 32 power-of-two parts of at most \
             {MAMBA_SSM_PER} values, which the CUDA SSM kernel keeps in registers",
            m.d_state
        ));
    };
    let threads = m.head_dim * split;
    if threads > MAMBA_STEP_MAX_THREADS || (split > 1 && threads % 32 != 0) {
        return fail(format!(
            "mamba_head_dim = {} with ssm_state_size = {} needs {threads} threads per head in the \
             CUDA SSM kernels: at most {MAMBA_STEP_MAX_THREADS}, in whole warps",
            m.head_dim, m.d_state
        ));
    }
    if m.inner() % 8 != 0 {
        return fail(format!(
            "mamba_num_heads x mamba_head_dim = {} is not a multiple of 8; the CUDA GEMV reads \
             weight rows 16 bytes at a time",
            m.inner()
        ));
    }
    if m.ssm_cache_dtype != "float32" {
        return fail(format!(
            "mamba_ssm_cache_dtype = {:?}: the CUDA backend keeps the SSM state in float32 only",
            m.ssm_cache_dtype
        ));
    }
    Ok(())
}

/// Bytes of the bf16 weights on the device (tied embeddings counted once).
pub fn weight_bytes(cfg: &ModelConfig) -> usize {
    crate::weights::expected_tensors(cfg)
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>() * 2)
        .sum()
}

/// Dynamic shared memory of one attention block: the group's queries, each warp's output and
/// its (max, sum) per query head, all f32.
pub fn attention_smem_bytes(cfg: &ModelConfig) -> u32 {
    let g = cfg.num_heads / cfg.num_kv_heads;
    let gd = g * cfg.head_dim;
    (4 * (gd + ATT_WARPS * gd + ATT_WARPS * g * 2)) as u32
}

/// Warps that share one output row of the lm_head's GEMV ([`GemvMode::LmHead`]), each summing a contiguous
/// slice of K: a power of two chosen from the matrix's shape alone (so a row's sum does not
/// depend on the batch), large enough that the grid has about [`GEMV_TARGET_WARPS`] warps, while
/// every lane still gets a 16-byte chunk of its slice.
pub fn lm_head_ksplit(rows: usize, cols: usize) -> usize {
    let chunks = cols / 8;
    let mut k = 1;
    while k < GEMV_WARPS
        && rows * k < GEMV_TARGET_WARPS
        && chunks % (2 * k) == 0
        && chunks / (2 * k) >= 32
    {
        k *= 2;
    }
    k
}

/// How many slices of K a streaming GEMV's row is summed in (residual, norm and gate/up) before
/// the load-time tuning has timed the shape (tune.rs: its first candidate, which another must
/// beat by [`super::tune::MARGIN`]), from the matrix's shape alone: two for matrices of fewer
/// than [`GEMV_TARGET_WARPS`] rows (two warps per row: more loads in flight per row), and for
/// gate/up (`gate_up`) whatever its height when its halves are whole 32-lane steps; one for other
/// tall matrices, which have rows enough. Measured on the H200 (scripts/gemv-bench `seq`): two is
/// the best or within 5% of it at batch 1 for every Llama-3.2-1B and -3.1-8B matrix.
pub fn gemv_ksplit(rows: usize, cols: usize, gate_up: bool) -> usize {
    let chunks = cols / 8;
    let two = chunks % 2 == 0 && chunks / 2 >= 32;
    if two && (rows < GEMV_TARGET_WARPS || gate_up && (chunks / 2) % 32 == 0) {
        2
    } else {
        1
    }
}

/// The slices of K the streaming GEMV can sum a row of K = `cols` in: 1, 2, 4 or 8 warps, each
/// a whole share of the 16-byte chunks and at least one 32-lane step of them. The load-time
/// tuning times each, [`gemv_ksplit`]'s first.
pub fn gemv_ksplits(rows: usize, cols: usize, gate_up: bool) -> Vec<usize> {
    let chunks = cols / 8;
    let first = gemv_ksplit(rows, cols, gate_up);
    let others = (0..=GEMV_WARPS.trailing_zeros())
        .map(|p| 1 << p)
        .filter(|&k| k != first && chunks % k == 0 && chunks / k >= 32);
    std::iter::once(first).chain(others).collect()
}

/// A decode GEMV's kernel for one shape and batch class, as the load-time tuning chose it
/// (tune.rs): the CUDA cores with this many warps per row, or the tensor cores with this many
/// warps per tile, each warp summing a slice of K.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemvKernel {
    CudaCores(usize),
    TensorCores(usize),
}

/// Output rows of a tensor-core GEMV tile (one mma's 16 rows).
pub const MMA_TILE_ROWS: usize = 16;

/// Warps that share a tile of the tensor-core GEMV, each summing a slice of K: the most (up to a
/// block's 8) whose slices are whole steps of [`MMA_U`] 16-byte loads per lane, from the
/// matrix's width alone. `None` where K is not in whole steps: that shape stays on the CUDA
/// cores.
pub fn mma_ksplit(cols: usize) -> Option<usize> {
    let step = 32 * MMA_U;
    if cols == 0 || cols % step != 0 {
        return None;
    }
    let steps = cols / step;
    (0..=GEMV_WARPS.trailing_zeros())
        .rev()
        .map(|p| 1 << p)
        .find(|k| steps % k == 0)
}

/// Whether a GEMV of this shape can run on the tensor cores: rows in whole tiles, K in whole
/// steps ([`mma_ksplit`]). Whether it does is the load-time tuning's choice (tune.rs).
pub fn tensor_cores_fit(rows: usize, cols: usize) -> bool {
    rows > 0 && rows % MMA_TILE_ROWS == 0 && mma_ksplit(cols).is_some()
}

/// A decode GEMV's launch: the kernel mode, the warps that share a row (or a tile), and how many
/// rows (or tiles) the blocks share out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvLaunch {
    pub mode: GemvMode,
    pub ksplit: usize,
    pub units: usize,
}

impl GemvLaunch {
    /// Its grid: the CUDA-core lm_head has a block per group of rows; the others are persistent
    /// ([`gemv_grid`]) over `resident` blocks.
    pub fn grid(&self, resident: usize) -> u32 {
        if self.mode == GemvMode::LmHead {
            gemv_blocks(self.units, self.ksplit)
        } else {
            gemv_grid(self.units, self.ksplit, resident)
        }
    }
}

/// Most steps of [`MMA_U`] 16-byte loads per lane (128 of K) one warp of the tensor-core GEMV
/// sums: its f32 sums drift by about 1.3e-6 of the products' norm a step (measured on the H200:
/// 1.8e-5 at 14 steps, 6.6e-5 at 56, 1.0e-4 at 76), so a longer slice would pass the 1e-4 that
/// the GEMV tests allow, an order below what bf16 activations alone lose.
pub const MMA_MAX_STEPS: usize = 64;

/// The warps per tile the tensor-core kernel can use for K = `cols`: [`mma_ksplit`] and its
/// halves down to a quarter (each warp then sums a longer slice, tiles shared out in groups of
/// 8 / ksplit per block), each slice at most [`MMA_MAX_STEPS`]; the tuning times each
/// (tune.rs).
pub fn mma_ksplits(cols: usize) -> Vec<usize> {
    let Some(top) = mma_ksplit(cols) else {
        return Vec::new();
    };
    let steps = cols / (32 * MMA_U);
    let mut splits: Vec<usize> = [top, top / 2, top / 4]
        .into_iter()
        .filter(|&k| k >= 1 && steps / k <= MMA_MAX_STEPS)
        .collect();
    splits.dedup();
    splits
}

/// How the GEMV of `mode` over `rows` x `cols` is launched at `batch`, on `kernel` (the load-time
/// tuning's choice for the shape and batch class, tune.rs; none before it ran, or a split the
/// shape does not allow: the CUDA cores at [`gemv_ksplit`]; the lm_head's CUDA-core kernel
/// always takes [`lm_head_ksplit`]). Tall gate/up on the CUDA cores at two warps per row sums its
/// two slices in one warp at batch 2-8 (gemv.cu's VK = 2: [`GemvMode::NormSwigluOneWarp`]),
/// which gives the same bits as two warps: two warps per row measured 20-25% slower there than
/// one warp over one slice (scripts/gemv-bench). Given the same `kernel`, a row's bits do not
/// depend on the batch it runs in.
pub fn gemv_launch(
    rows: usize,
    cols: usize,
    mode: GemvMode,
    batch: usize,
    kernel: Option<GemvKernel>,
) -> GemvLaunch {
    if let (Some(GemvKernel::TensorCores(ksplit)), Some(mma)) = (kernel, mode.on_tensor_cores()) {
        if tensor_cores_fit(rows, cols) && mma_ksplits(cols).contains(&ksplit) {
            return GemvLaunch {
                mode: mma,
                ksplit,
                units: rows / MMA_TILE_ROWS,
            };
        }
    }
    if mode == GemvMode::LmHead {
        return GemvLaunch {
            mode,
            ksplit: lm_head_ksplit(rows, cols),
            units: rows,
        };
    }
    let gate_up = mode == GemvMode::NormSwiglu;
    let k = match kernel {
        Some(GemvKernel::CudaCores(k)) if gemv_ksplits(rows, cols, gate_up).contains(&k) => k,
        _ => gemv_ksplit(rows, cols, gate_up),
    };
    let (mode, ksplit) = if gate_up
        && k == 2
        && batch > 1
        && rows >= GEMV_TARGET_WARPS
        && (cols / 8 / 2) % 32 == 0
    {
        (GemvMode::NormSwigluOneWarp, 1)
    } else {
        (mode, k)
    };
    GemvLaunch {
        mode,
        ksplit,
        units: rows,
    }
}

/// Blocks of a persistent GEMV over `rows` rows (or tiles, on the tensor cores), `ksplit` warps to
/// each: one per group while they all fit on the GPU at once
/// (`resident` blocks), else as few as walk the groups in the same number of rounds, so that
/// every block walks as many groups (1,536 q/k/v groups of the 8B on 528 resident blocks:
/// 512 blocks, three groups each, rather than 480 blocks with three and 48 with two). Measured on
/// the H200 (scripts/gemv-bench `seq`, the balanced set, twice): the 8B's step 1.2% faster than
/// with the resident count, the 1B's within 0.3%.
pub fn gemv_grid(rows: usize, ksplit: usize, resident: usize) -> u32 {
    let groups = gemv_blocks(rows, ksplit);
    let rounds = groups.div_ceil(resident.max(1) as u32).max(1);
    groups.div_ceil(rounds)
}

/// Positions of a context of `ctx` that attention's split `s` covers, as attention.cu splits
/// them: one split per [`ATT_SPLIT_MIN`] positions up to [`MAX_SPLITS`], in balanced shares.
pub fn attention_split(ctx: usize, s: usize) -> Option<std::ops::Range<usize>> {
    let used = ctx.div_ceil(ATT_SPLIT_MIN).clamp(1, MAX_SPLITS);
    (s < used).then(|| s * ctx / used..(s + 1) * ctx / used)
}

/// The attention kernel for the model's query heads per KV head: `attention_g{G}`, G the next
/// power of two (its register arrays are sized by G).
pub fn attention_kernel(cfg: &ModelConfig) -> String {
    let g = cfg.num_heads / cfg.num_kv_heads;
    format!("attention_g{}", g.next_power_of_two())
}

/// The head dimensions attention_prefill.cu instantiates its kernel for.
pub const ATT_PF_HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// The tensor-core prefill attention for the model's head dimension (`attention_prefill_d{D}`,
/// D one of [`ATT_PF_HEAD_DIMS`]), or none: other head dimensions prefill through the decode
/// kernel, one row per block.
pub fn attention_prefill_kernel(cfg: &ModelConfig) -> Option<String> {
    ATT_PF_HEAD_DIMS
        .contains(&cfg.head_dim)
        .then(|| format!("attention_prefill_d{}", cfg.head_dim))
}

/// The decode attention of steps past batch 1 on the tensor cores, the rotation and K/V write
/// folded in (`attention_batch_rope_d{D}`, D one of [`ATT_PF_HEAD_DIMS`], a KV group's query
/// heads the 16 rows of an mma tile), or none: other shapes run attention.cu at every batch.
pub fn attention_batch_kernel(cfg: &ModelConfig) -> Option<String> {
    (ATT_PF_HEAD_DIMS.contains(&cfg.head_dim) && cfg.num_heads / cfg.num_kv_heads <= 16)
        .then(|| format!("attention_batch_rope_d{}", cfg.head_dim))
}

/// Warps per block of `attention_batch_rope_d{D}` (attention_batch.cu `ATT_BATCH_WARPS`).
pub const ATT_BATCH_WARPS: usize = 4;

/// Dynamic shared memory of `attention_batch_rope_d{D}`: per warp two stages of a chunk's K and
/// V (16 positions, each row padded by 8 bf16), then the group's query heads and the new k and v
/// in f32 while they are rotated, and the new k and v as cached (bf16); the warps' outputs and
/// (max, sum), merged in the stages' memory after, take less.
pub fn attention_batch_smem_bytes(cfg: &ModelConfig) -> u32 {
    let (d, g) = (cfg.head_dim, cfg.num_heads / cfg.num_kv_heads);
    (ATT_BATCH_WARPS * 2 * 2 * 16 * (d + 8) * 2 + (g + 2) * d * 4 + 2 * d * 2) as u32
}

/// Dynamic shared memory of the prefill attention: K and V tiles of [`ATT_PF_POS`] positions,
/// two deep, each row padded by 8 bf16.
pub fn attention_prefill_smem_bytes(head_dim: usize) -> u32 {
    (2 * 2 * ATT_PF_POS * (head_dim + 8) * 2) as u32
}

/// The prefill attention's blocks for a pass: each segment's rows in tiles of at most
/// [`ATT_PF_ROWS`] (first row, rows), a tile never across two segments (its rows one prompt's,
/// at consecutive positions), those ending at the latest position first, so the longest blocks
/// start first and the short ones fill in behind them.
pub fn attention_prefill_tiles(pass: &[Segment]) -> Vec<[i32; 2]> {
    let mut tiles: Vec<(usize, [i32; 2])> = pass
        .iter()
        .flat_map(|s| {
            (0..s.len).step_by(ATT_PF_ROWS).map(move |r| {
                let n = (s.len - r).min(ATT_PF_ROWS);
                (s.from + r + n, [(s.row + r) as i32, n as i32])
            })
        })
        .collect();
    tiles.sort_by_key(|&(end, _)| std::cmp::Reverse(end));
    tiles.into_iter().map(|(_, t)| t).collect()
}

/// Blocks of a GEMV over `rows` output rows, `ksplit` warps per row.
pub fn gemv_blocks(rows: usize, ksplit: usize) -> u32 {
    rows.div_ceil(GEMV_WARPS / ksplit) as u32
}

/// Blocks of the CUDA-core lm_head GEMV, each leaving one argmax candidate per sequence: more than
/// the tensor-core one's persistent grid (at most one block per 16-row tile) ever has, so the
/// candidates' buffers are sized by it.
pub fn lm_head_blocks(cfg: &ModelConfig) -> usize {
    gemv_blocks(
        cfg.vocab_size,
        lm_head_ksplit(cfg.vocab_size, cfg.hidden_size),
    ) as usize
}

/// Slices of a row `argmax_rows` (argmax.cu) reduces in blocks of their own: up to 32, as many
/// as the decode buffers' `parts` holds per row (the lm_head GEMV's blocks).
pub fn argmax_parts(cfg: &ModelConfig) -> usize {
    lm_head_blocks(cfg).min(32)
}

/// Elements of every decode buffer, for `max_batch` sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLayout {
    pub max_batch: usize,
    /// Block-table entries per sequence: the whole context in blocks.
    pub max_blocks: usize,
    pub x: usize,
    pub qkv: usize,
    pub attn: usize,
    pub act: usize,
    /// Argmax candidates of the lm_head GEMV: (value, row) per block per sequence, as f32 pairs.
    pub parts: usize,
    pub part_o: usize,
    pub part_ml: usize,
    /// Attention's arrival tickets, one per (sequence, KV head).
    pub counts: usize,
    pub tables: usize,
    /// A hybrid's Mamba mixer (0 without one): in_proj's output, the conv's output, the SSM's
    /// output, and the gated norm's (out_proj's input).
    pub zxbcdt: usize,
    pub xbc: usize,
    pub ssm_y: usize,
    pub gated: usize,
    /// The cuBLAS path's ([`StepPath::Blas`]) GEMM inputs, bf16: the normalised residual
    /// stream, the MLP's activation, attention's and the gated norm's outputs; the up GEMM's
    /// bf16 output before its activation; the lm_head's f32 logits before the argmax.
    pub xn_bf16: usize,
    pub act_bf16: usize,
    pub attn_bf16: usize,
    pub gated_bf16: usize,
    pub up: usize,
    pub logits: usize,
}

/// Rows of the MLP's up matrix: gate and up stacked for SwiGLU, up alone for squared ReLU (0
/// without MLP layers).
fn up_rows(cfg: &ModelConfig) -> usize {
    match &cfg.hybrid {
        None => 2 * cfg.intermediate_size,
        Some(h) if h.count(crate::hybrid::Block::Mlp) > 0 => cfg.intermediate_size,
        Some(_) => 0,
    }
}

/// Per-row widths of the Mamba mixer's buffers: in_proj's output, the conv's, the SSM's inner
/// (0 for a model without Mamba layers).
fn mamba_widths(cfg: &ModelConfig) -> (usize, usize, usize) {
    cfg.hybrid.as_ref().map_or((0, 0, 0), |h| {
        let m = &h.mamba;
        (m.in_proj_dim(), m.conv_dim(), m.inner())
    })
}

impl DecodeLayout {
    pub fn new(cfg: &ModelConfig, pool: &PoolShape, max_batch: usize) -> Self {
        let max_blocks = cfg.max_position_embeddings.div_ceil(pool.block_size);
        let qkv_width = cfg.q_dim() + 2 * cfg.kv_dim();
        let (in_dim, conv_dim, inner) = mamba_widths(cfg);
        Self {
            zxbcdt: max_batch * in_dim,
            xbc: max_batch * conv_dim,
            ssm_y: max_batch * inner,
            gated: max_batch * inner,
            max_batch,
            max_blocks,
            x: max_batch * cfg.hidden_size,
            qkv: max_batch * qkv_width,
            attn: max_batch * cfg.q_dim(),
            act: max_batch * cfg.intermediate_size,
            parts: max_batch * lm_head_blocks(cfg) * 2,
            part_o: max_batch * cfg.num_heads * MAX_SPLITS * cfg.head_dim,
            part_ml: max_batch * cfg.num_heads * MAX_SPLITS * 2,
            counts: max_batch * cfg.num_kv_heads,
            tables: max_batch * max_blocks,
            xn_bf16: max_batch * cfg.hidden_size,
            act_bf16: max_batch * cfg.intermediate_size,
            attn_bf16: max_batch * cfg.q_dim(),
            gated_bf16: max_batch * inner,
            up: max_batch * up_rows(cfg),
            logits: max_batch * cfg.vocab_size,
        }
    }

    /// Device bytes of all decode buffers (f32 and i32 are 4 bytes each, bf16 2).
    pub fn bytes(&self) -> usize {
        2 * (self.xn_bf16 + self.act_bf16 + self.attn_bf16 + self.gated_bf16 + self.up)
            + 4 * self.logits
            + 4 * (2 * self.x
                + self.qkv
                + self.attn
                + self.act
                + self.parts
                + self.part_o
                + self.part_ml
                + self.counts
                + self.tables
                + self.zxbcdt
                + self.xbc
                + self.ssm_y
                + self.gated
                + 4 * self.max_batch)
    }
}

/// Elements of the prefill scratch for `rows` prompt tokens in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillLayout {
    pub rows: usize,
    pub x: usize,
    pub xn_bf16: usize,
    pub qkv: usize,
    pub attn_bf16: usize,
    pub gate_up: usize,
    pub act_bf16: usize,
    /// The prefill attention's tiles (first row, rows): at most one per row.
    pub tiles: usize,
    /// As [`DecodeLayout`]'s; the gated norm's output is bf16 here (out_proj's GEMM input).
    pub zxbcdt: usize,
    pub xbc: usize,
    pub ssm_y: usize,
    pub gated_bf16: usize,
}

impl PrefillLayout {
    pub fn new(cfg: &ModelConfig, rows: usize) -> Self {
        let (in_dim, conv_dim, inner) = mamba_widths(cfg);
        Self {
            zxbcdt: rows * in_dim,
            xbc: rows * conv_dim,
            ssm_y: rows * inner,
            gated_bf16: rows * inner,
            rows,
            x: rows * cfg.hidden_size,
            xn_bf16: rows * cfg.hidden_size,
            qkv: rows * (cfg.q_dim() + 2 * cfg.kv_dim()),
            attn_bf16: rows * cfg.q_dim(),
            gate_up: rows * 2 * cfg.intermediate_size,
            act_bf16: rows * cfg.intermediate_size,
            tiles: 2 * rows,
        }
    }

    pub fn bytes(&self) -> usize {
        4 * (self.x + self.qkv + self.tiles + self.zxbcdt + self.xbc + self.ssm_y + 3 * self.rows)
            + 2 * (self.xn_bf16 + self.attn_bf16 + self.gate_up + self.act_bf16 + self.gated_bf16)
    }
}

/// The device memory a load needs beyond the KV pool, and the error when it does not fit.
pub fn check_fits(
    cfg: &ModelConfig,
    max_batch: usize,
    pool: &PoolShape,
    free: usize,
    total: usize,
) -> Result<()> {
    let weights = weight_bytes(cfg);
    let scratch = DecodeLayout::new(cfg, pool, max_batch).bytes()
        + PrefillLayout::new(cfg, PREFILL_CHUNK).bytes()
        + cfg.vocab_size * 4;
    let need = weights + pool.bytes() + pool.state_bytes() + scratch;
    if need > free {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        return Err(Error::Load {
            message: format!(
                "the model does not fit the GPU: weights {:.2} GiB + KV pool {:.2} GiB \
                 ({} blocks){} + scratch {:.2} GiB = {:.2} GiB, but {:.2} GiB of {:.2} GiB are \
                 free; free the GPU or lower --num-blocks / --kv-cache-memory",
                gib(weights),
                gib(pool.bytes()),
                pool.num_blocks,
                if pool.state_slots > 0 {
                    format!(
                        " + recurrent states {:.2} GiB ({} slots; --max-batch sets them)",
                        gib(pool.state_bytes()),
                        pool.state_slots
                    )
                } else {
                    String::new()
                },
                gib(scratch),
                gib(need),
                gib(free),
                gib(total)
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kv::{resolve_pool, PoolSize};

    /// Llama-3.2-1B's config.json, field for field.
    pub(in crate::cuda) fn llama_1b() -> ModelConfig {
        ModelConfig::parse(
            &serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
                "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
                "vocab_size": 128256, "max_position_embeddings": 131072,
                "tie_word_embeddings": true, "rope_theta": 500000.0,
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn llama_1b_weights_are_its_parameter_count_in_bf16() {
        // Llama-3.2-1B has 1,235,814,400 parameters (embedding tied).
        assert_eq!(weight_bytes(&llama_1b()), 2 * 1_235_814_400);
    }

    #[test]
    fn attention_splits_are_never_empty_and_cover_the_context_in_order() {
        // Shares of ceil(ctx / used) left the last splits of e.g. 513 positions empty (a NaN in
        // the merge on the H200); balanced shares cannot.
        for ctx in 1..=20_000 {
            let mut next = 0;
            let mut s = 0;
            while let Some(r) = attention_split(ctx, s) {
                assert!(!r.is_empty(), "ctx {ctx}: split {s} is empty");
                assert_eq!(
                    r.start, next,
                    "ctx {ctx}: split {s} does not follow the one before"
                );
                next = r.end;
                s += 1;
            }
            assert_eq!(next, ctx, "ctx {ctx}: splits do not cover it");
            assert_eq!(s, ctx.div_ceil(ATT_SPLIT_MIN).min(MAX_SPLITS));
        }
    }

    #[test]
    fn geometry() {
        let c = llama_1b();
        assert_eq!(gemv_blocks(2048, 1), 256);
        assert_eq!(gemv_blocks(2049, 1), 257);
        assert_eq!(gemv_blocks(2048, 4), 1024);
        // lm_head-style (one warp per row): short matrices split K over more warps.
        assert_eq!(lm_head_ksplit(3072, 2048), 4);
        assert_eq!(lm_head_ksplit(2048, 8192), 4);
        assert_eq!(lm_head_ksplit(128256, 2048), 1);
        assert_eq!(lm_head_ksplit(64, 1024), 4);
        // Streaming GEMVs: Llama-3.2-1B q/k/v, o, gate/up, down; Llama-3.1-8B gate/up.
        assert_eq!(gemv_ksplit(3072, 2048, false), 2);
        assert_eq!(gemv_ksplit(2048, 2048, false), 2);
        assert_eq!(gemv_ksplit(8192, 2048, true), 2);
        assert_eq!(gemv_ksplit(2048, 8192, false), 2);
        assert_eq!(gemv_ksplit(14336, 4096, true), 2);
        // A tall matrix other than gate/up: one warp per row.
        assert_eq!(gemv_ksplit(14336, 4096, false), 1);
        // Tall gate/up whose halves are not whole 32-lane steps (80 chunks): one slice.
        assert_eq!(gemv_ksplit(8192, 1280, true), 1);
        assert_eq!(gemv_ksplit(4096, 1280, true), 2);
        // Too few 16-byte chunks for two slices of 32 lanes each.
        assert_eq!(gemv_ksplit(64, 256, false), 1);
        assert_eq!(gemv_ksplit(64, 512, false), 2);
        // All groups fit: one block each; more than fit: as few blocks as take the same rounds,
        // each walking as many groups (1B q/k/v: 768 groups, 2 rounds of 384 rather than 528 and
        // 240; 8B gate/up: 1,792 groups, 7 rounds of 256).
        assert_eq!(gemv_grid(2048, 2, 1056), 512);
        assert_eq!(gemv_grid(8192, 1, 264), 256);
        assert_eq!(gemv_grid(3072, 2, 528), 384);
        assert_eq!(gemv_grid(14336, 1, 264), 256);
        assert_eq!(gemv_grid(6144, 2, 528), 512);
        assert_eq!(gemv_grid(8192, 1, 1024), 1024);
        assert_eq!(gemv_grid(8, 1, 0), 1);
        for (rows, ks, resident) in [(3072, 2, 528), (14336, 1, 264), (4096, 2, 396), (100, 1, 7)] {
            let (groups, grid) = (gemv_blocks(rows, ks), gemv_grid(rows, ks, resident));
            assert!(
                grid as usize <= resident,
                "{rows}: {grid} blocks do not fit in {resident}"
            );
            let rounds = groups.div_ceil(grid);
            assert_eq!(
                rounds,
                groups.div_ceil(resident as u32),
                "{rows}: more rounds than needed"
            );
            // No block walks more than one group more than another.
            assert!(
                rounds * grid - groups < grid,
                "{rows}: a whole round is idle"
            );
        }
        assert_eq!(gemv_ksplit(64, 64, false), 1);
        assert_eq!(lm_head_blocks(&c), 16032);
        // Llama-3.2-1B: 4 query heads per KV head of 64 dims, 4 warps.
        assert_eq!(attention_smem_bytes(&c), 4 * (256 + 4 * 256 + 4 * 4 * 2));
        let pool = resolve_pool(&c, 16, PoolSize::Blocks(100), 2).unwrap();
        let d = DecodeLayout::new(&c, &pool, 8);
        assert_eq!(d.max_blocks, 8192);
        assert_eq!(d.tables, 8 * 8192);
        assert_eq!(d.qkv, 8 * (2048 + 2 * 512));
        assert_eq!(d.part_o, 8 * 32 * 32 * 64);
        assert_eq!(attention_kernel(&c), "attention_g4");
        // The batched steps' attention on the tensor cores: 4 warps, each two stages of 16
        // positions of K and V, rows of 64 + 8 bf16; then the 4 query heads of a group and the
        // new k and v (f32), and the new k and v (bf16).
        assert_eq!(
            attention_batch_kernel(&c).as_deref(),
            Some("attention_batch_rope_d64")
        );
        assert_eq!(
            attention_batch_smem_bytes(&c),
            4 * 2 * 2 * 16 * 72 * 2 + 6 * 64 * 4 + 2 * 64 * 2
        );
        assert_eq!(d.counts, 8 * 8);
        let p = PrefillLayout::new(&c, 512);
        assert_eq!(p.gate_up, 512 * 16384);
    }

    #[test]
    fn prefill_attention_tiles_cover_each_segment_once_longest_context_first() {
        let passes = prefill_passes(&[1, 64, 65, 1500, 200], 1024);
        for pass in &passes {
            let tiles = attention_prefill_tiles(pass);
            let mut covered = vec![0; pass.iter().map(|s| s.len).sum()];
            let mut last_end = usize::MAX;
            for &[first, n] in &tiles {
                let (first, n) = (first as usize, n as usize);
                assert!((1..=ATT_PF_ROWS).contains(&n), "tile of {n} rows");
                // One segment's rows, so one prompt's consecutive positions.
                let s = pass
                    .iter()
                    .find(|s| (s.row..s.row + s.len).contains(&first))
                    .unwrap();
                assert!(
                    first + n <= s.row + s.len,
                    "tile at {first} leaves its segment"
                );
                let end = s.from + (first - s.row) + n;
                assert!(
                    end <= last_end,
                    "tiles not in falling order of their last position"
                );
                last_end = end;
                covered[first..first + n].iter_mut().for_each(|c| *c += 1);
            }
            assert!(
                covered.iter().all(|&c| c == 1),
                "a row not in exactly one tile"
            );
        }
        // 1,500 tokens: a first pass of 1,024 rows and a second piece at positions 1,024..1,500,
        // its tiles first there (the latest positions).
        let second = &passes[passes.len() - 1];
        let t = attention_prefill_tiles(second);
        let piece = second.iter().find(|s| s.seq == 3).unwrap();
        assert_eq!(piece.from, 1024);
        assert_eq!(t[0], [(piece.row + 448) as i32, 28]);
        assert_eq!(
            attention_prefill_kernel(&llama_1b()).as_deref(),
            Some("attention_prefill_d64")
        );
        assert_eq!(attention_prefill_smem_bytes(128), 4 * 64 * 136 * 2);
    }

    #[test]
    fn prompts_prefilled_together_fill_each_pass_shortest_first() {
        let seg = |seq, from, len, row| Segment {
            seq,
            from,
            len,
            row,
        };
        // One prompt alone: cut every chunk's positions, as before.
        assert_eq!(
            prefill_passes(&[2500], 1024),
            vec![
                vec![seg(0, 0, 1024, 0)],
                vec![seg(0, 1024, 1024, 0)],
                vec![seg(0, 2048, 452, 0)]
            ]
        );
        // Several: pieces shortest prompt first (ties in prompt order), a piece that does not fit
        // the pass opening the next; a long prompt's pieces where it is cut alone.
        let p = prefill_passes(&[60, 1000, 5, 17, 1500, 17], 1024);
        assert_eq!(
            p,
            vec![
                vec![
                    seg(2, 0, 5, 0),
                    seg(3, 0, 17, 5),
                    seg(5, 0, 17, 22),
                    seg(0, 0, 60, 39)
                ],
                vec![seg(1, 0, 1000, 0)],
                vec![seg(4, 0, 1024, 0)],
                vec![seg(4, 1024, 476, 0)],
            ]
        );
        assert!(p[0][1].ends(17) && p[0][3].ends(60) && !p[2][0].ends(1500) && p[3][0].ends(1500));
        // Every row of every prompt once, no pass over the chunk.
        let lens = [1, 1023, 1, 2048, 7, 1024];
        let passes = prefill_passes(&lens, 1024);
        for pass in &passes {
            assert!(pass.iter().map(|s| s.len).sum::<usize>() <= 1024);
            let mut row = 0;
            for s in pass {
                assert_eq!(s.row, row);
                row += s.len;
            }
        }
        for (seq, &len) in lens.iter().enumerate() {
            let mut next = 0;
            for s in passes.iter().flatten().filter(|s| s.seq == seq) {
                assert_eq!(s.from, next);
                // Cut as the prompt alone is.
                assert_eq!(s.from % 1024, 0);
                assert!(s.len == 1024 || s.from + s.len == len);
                next += s.len;
            }
            assert_eq!(next, len);
        }
        assert!(prefill_passes(&[], 1024).is_empty());
        // The battery's eight prompts at batch 8: one pass; four times over at batch 32: two.
        let battery = [5, 17, 60, 130, 250, 500, 750, 1000];
        assert_eq!(prefill_passes(&battery, PREFILL_CHUNK).len(), 1);
        assert_eq!(prefill_passes(&battery.repeat(4), PREFILL_CHUNK).len(), 2);
    }

    #[test]
    fn gemv_modes_are_gemv_cu_modes_in_one_order() {
        let numbers: Vec<usize> = GemvMode::ALL.iter().map(|m| m.number()).collect();
        assert_eq!(numbers, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        for (i, m) in GemvMode::ALL.iter().enumerate() {
            assert_eq!(m.index(), i);
        }
        assert_eq!(GemvMode::ResidualMma.kernel(8), "gemv_m7_b8");
        assert_eq!(GemvMode::LmHeadMma.logits_kernel(3), "gemv_m12_logits_b3");
        assert_eq!(GemvMode::NormSwiglu.weight_rows(), 2);
        assert_eq!(GemvMode::Norm.weight_rows(), 1);
        // Every CUDA-core mode the step launches has a tensor-core twin, and the twins have none.
        for m in [
            GemvMode::Residual,
            GemvMode::Norm,
            GemvMode::NormSwiglu,
            GemvMode::NormRelu2,
            GemvMode::LmHead,
        ] {
            let mma = m.on_tensor_cores().unwrap();
            assert_eq!(mma.on_tensor_cores(), None);
            assert_eq!(m.is_lm_head(), mma.is_lm_head());
        }
    }

    #[test]
    fn tall_gate_up_sums_its_two_slices_in_one_warp_past_batch_1() {
        use GemvMode::*;
        let l = |mode, ksplit, units| GemvLaunch {
            mode,
            ksplit,
            units,
        };
        // Qwen2.5-7B gate/up on the CUDA cores: two warps at batch 1, one warp with both slices
        // at 2-8; the numerics (two slices) are the same at every batch.
        {
            let tc = None;
            assert_eq!(
                gemv_launch(18944, 3584, NormSwiglu, 1, tc),
                l(NormSwiglu, 2, 18944)
            );
            for batch in 2..=MAX_GEMV_BATCH {
                assert_eq!(
                    gemv_launch(18944, 3584, NormSwiglu, batch, tc),
                    l(NormSwigluOneWarp, 1, 18944)
                );
            }
        }
        // Short gate/up (tiny models) and every other matrix: the same launch at every batch.
        for batch in 1..=MAX_GEMV_BATCH {
            assert_eq!(
                gemv_launch(2048, 1024, NormSwiglu, batch, None),
                l(NormSwiglu, 2, 2048)
            );
            assert_eq!(gemv_launch(3072, 2048, Norm, batch, None), l(Norm, 2, 3072));
            assert_eq!(
                gemv_launch(2048, 8192, Residual, batch, None),
                l(Residual, 2, 2048)
            );
            assert_eq!(
                gemv_launch(8192, 1280, NormSwiglu, batch, None),
                l(NormSwiglu, 1, 8192)
            );
        }
    }

    #[test]
    fn a_cuda_core_split_the_tuning_chose_is_launched_where_the_shape_allows_it() {
        use GemvKernel::CudaCores;
        use GemvMode::*;
        // Qwen3-4B's down (1,216 chunks of K): every split of 1-8 warps, the default first.
        assert_eq!(gemv_ksplits(2560, 9728, false), [2, 1, 4, 8]);
        // The 8B's down and q/k/v; a tall matrix other than gate/up starts at one warp.
        assert_eq!(gemv_ksplits(4096, 14336, false), [2, 1, 4, 8]);
        assert_eq!(gemv_ksplits(14336, 4096, false), [1, 2, 4, 8]);
        // Qwen2.5-0.5B's K of 896 (112 chunks): one or two warps.
        assert_eq!(gemv_ksplits(896, 896, false), [2, 1]);
        assert_eq!(gemv_ksplits(64, 256, false), [1]);
        for batch in 1..=MAX_GEMV_BATCH {
            let l = gemv_launch(2560, 9728, Residual, batch, Some(CudaCores(4)));
            assert_eq!((l.mode, l.ksplit, l.units), (Residual, 4, 2560));
            // A split the shape does not allow falls back to the default.
            let l = gemv_launch(896, 896, Norm, batch, Some(CudaCores(8)));
            assert_eq!((l.mode, l.ksplit), (Norm, 2));
            // The lm_head's CUDA-core kernel keeps its own split.
            let l = gemv_launch(151936, 2560, LmHead, batch, Some(CudaCores(8)));
            assert_eq!(l.ksplit, lm_head_ksplit(151936, 2560));
        }
        // Tall gate/up at two warps: one warp over both slices past batch 1, where its halves
        // are whole 32-lane steps (Qwen2.5-7B's 3,584), not where they are not (1,280).
        assert_eq!(
            gemv_launch(18944, 3584, NormSwiglu, 8, Some(CudaCores(2))).mode,
            NormSwigluOneWarp
        );
        assert_eq!(
            gemv_launch(18944, 3584, NormSwiglu, 8, Some(CudaCores(4))).mode,
            NormSwiglu
        );
        let l = gemv_launch(8192, 1280, NormSwiglu, 8, Some(CudaCores(2)));
        assert_eq!((l.mode, l.ksplit), (NormSwiglu, 2));
    }

    #[test]
    fn a_shape_chosen_for_the_tensor_cores_runs_there_at_every_batch() {
        use GemvKernel::TensorCores;
        use GemvMode::*;
        // The 8B's matrices and the lm_heads: 16-row tiles, 8 warps per tile (K in 8 whole steps
        // of 128), at every batch.
        for batch in 1..=MAX_GEMV_BATCH {
            for (rows, cols, mode, mma) in [
                (4096, 4096, Residual, ResidualMma),
                (4096, 14336, Residual, ResidualMma),
                (6144, 4096, Norm, NormMma),
                (14336, 4096, NormSwiglu, NormSwigluMma),
                (21504, 4096, NormRelu2, NormRelu2Mma),
                (128256, 2048, LmHead, LmHeadMma),
                (2048, 2048, Norm, NormMma),
            ] {
                let want = GemvLaunch {
                    mode: mma,
                    ksplit: 8,
                    units: rows / MMA_TILE_ROWS,
                };
                assert_eq!(
                    gemv_launch(rows, cols, mode, batch, Some(TensorCores(8))),
                    want,
                    "{rows}x{cols}"
                );
                assert_ne!(gemv_launch(rows, cols, mode, batch, None).mode, mma);
                // Fewer warps per tile, more tiles per block.
                let l = gemv_launch(rows, cols, mode, batch, Some(TensorCores(2)));
                assert_eq!((l.mode, l.ksplit, l.units), (mma, 2, rows / MMA_TILE_ROWS));
            }
        }
        // K in fewer whole steps: fewer warps per tile (Qwen2.5-0.5B's 896 = 7 steps, Qwen3-4B's
        // 2,560 = 20); K not in whole steps or rows not in whole tiles: the CUDA cores.
        assert_eq!(mma_ksplit(896), Some(1));
        assert_eq!(mma_ksplit(2560), Some(4));
        assert_eq!(mma_ksplit(3072), Some(8));
        assert_eq!(mma_ksplit(4864), Some(2));
        assert_eq!(mma_ksplit(3584), Some(4));
        assert_eq!(mma_ksplit(4104), None);
        assert_eq!(mma_ksplit(0), None);
        assert_eq!(mma_ksplits(4096), [8, 4, 2]);
        assert_eq!(mma_ksplits(2560), [4, 2, 1]);
        assert_eq!(mma_ksplits(896), [1]);
        assert_eq!(mma_ksplits(640), [1]);
        // No slice of more than 64 steps: Qwen3-4B's down (76 steps), Nemotron-H-8B's MLP down
        // (168), the 8B's down (112); K of 65 steps in one warp's slice: none.
        assert_eq!(mma_ksplits(9728), [4, 2]);
        assert_eq!(mma_ksplits(21504), [8, 4]);
        assert_eq!(mma_ksplits(14336), [8, 4, 2]);
        assert!(mma_ksplits(65 * 128).is_empty());
        assert!(mma_ksplits(4104).is_empty());
        assert_eq!(
            gemv_launch(151936, 896, LmHead, 4, Some(TensorCores(1))).ksplit,
            1
        );
        for (rows, cols) in [(4096, 4104), (4104, 4096), (0, 4096)] {
            assert!(!tensor_cores_fit(rows, cols), "{rows}x{cols}");
            assert_eq!(
                gemv_launch(rows, cols, Residual, 1, Some(TensorCores(8))).mode,
                Residual
            );
        }
        assert_eq!(
            gemv_launch(4104, 4096, LmHead, 1, Some(TensorCores(8))).mode,
            LmHead
        );
        // A split the shape cannot use (896 is 7 steps: one warp per tile) is not launched.
        assert_eq!(
            gemv_launch(4096, 896, Residual, 1, Some(TensorCores(8))).mode,
            Residual
        );
        // Persistent grids: 256 tiles of the 8B's o, one tile per block, on as many blocks as are
        // resident (two per SM on 132 SMs) in the fewest rounds; the CUDA-core lm_head a block per
        // 8 / ksplit rows.
        let o = gemv_launch(4096, 4096, Residual, 1, Some(TensorCores(8)));
        assert_eq!(o.grid(264), 256);
        assert_eq!(
            gemv_launch(8192, 4096, Residual, 1, Some(TensorCores(8))).grid(264),
            256
        );
        let head = gemv_launch(128256, 2048, LmHead, 1, None);
        assert_eq!(head.grid(264), 16032);
        for k in mma_ksplits(2048) {
            let l = gemv_launch(128256, 2048, LmHead, 1, Some(TensorCores(k)));
            assert!(l.grid(264 * 8 / k) as usize <= 16032);
        }
    }

    #[test]
    fn unsupported_shapes_are_named() {
        let mut c = llama_1b();
        c.head_dim = 512;
        assert!(check_model(&c)
            .unwrap_err()
            .to_string()
            .contains("head_dim 512"));
        let mut c = llama_1b();
        c.intermediate_size = 8190;
        assert!(check_model(&c)
            .unwrap_err()
            .to_string()
            .contains("intermediate_size = 8190"));
        assert!(check_model(&llama_1b()).is_ok());
    }

    #[test]
    fn nemotron_h_8b_fits_the_kernels_and_its_mamba_buffers_are_sized() {
        let c =
            ModelConfig::parse(include_str!("../../tests/data/nemotron-h-8b-config.json")).unwrap();
        check_model(&c).unwrap();
        // d_state 128: four threads per channel of 32 state values each, 256 per head.
        assert_eq!(mamba_ssm_split(128), Some(4));
        assert_eq!(mamba_ssm_split(32), Some(1));
        assert_eq!(mamba_ssm_split(16), Some(1));
        assert_eq!(mamba_ssm_split(96), Some(4));
        assert_eq!(mamba_ssm_split(2048), None);
        assert_eq!(mamba_ssm_split(1000), None);
        // The scan's two tiles of 16 rows: B and C in four regions of 36 floats, x, dt, exp(dt A).
        let m = &c.hybrid.as_ref().unwrap().mamba;
        assert_eq!(mamba_scan_tile(m), 16);
        assert_eq!(
            mamba_scan_smem_bytes(m, 16),
            2 * 16 * (2 * 4 * 36 + 64 + 2) * 4
        );
        assert!(mamba_scan_smem_bytes(m, 32) > 48 << 10);
        assert_eq!(mamba_scan_smem_bytes(m, 0), 0);
        // Prefill scans the 8B's heads in chunks; two blocks of the chunked scan fit a
        // multiprocessor (228 KiB, 1 KiB of it reserved a block). Heads past its tiles scan
        // sequentially.
        assert!(mamba_ssd(m));
        assert!(2 * (mamba_ssd_smem_bytes() + 1024) <= 228 << 10);
        // The decode step stages two heads' states (32 KiB each) and their inputs; three blocks
        // fit a multiprocessor, as its 80 registers allow.
        assert_eq!(mamba_step_stage_floats(m), 128 * 64 + 328);
        assert_eq!(mamba_step_smem_bytes(m), (2 * (128 * 64 + 328) + 256) * 4);
        assert!(3 * (mamba_step_smem_bytes(m) as usize + 1024) <= 228 << 10);
        // At most 768 threads of at most 32 state values: two stages stay under the 227 KiB
        // a block may ask for whatever the heads.
        let mut widest = m.clone();
        widest.head_dim = 192;
        check_mamba(&widest).unwrap();
        assert!(mamba_step_smem_bytes(&widest) as usize <= 227 << 10);
        widest.head_dim = 256;
        let err = check_mamba(&widest).unwrap_err().to_string();
        assert!(
            err.contains("1024 threads") && err.contains("at most 768"),
            "{err}"
        );
        let mut wide = m.clone();
        wide.head_dim = 80;
        assert!(!mamba_ssd(&wide));
        wide.head_dim = 64;
        wide.d_state = 256;
        assert!(!mamba_ssd(&wide));
        // Prefill's sequential scan keeps two channels a thread (128 threads a head), decode one (256).
        assert_eq!(mamba_scan_channels(m), 2);
        assert_eq!(mamba_ssm_threads(m, true), 128);
        assert_eq!(mamba_ssm_threads(m, false), 256);
        // An odd head dim, or one whose halves would not fill whole warps with a split of 4, keeps
        // one channel a thread.
        let mut odd = m.clone();
        odd.head_dim = 63;
        assert_eq!(
            (mamba_scan_channels(&odd), mamba_ssm_threads(&odd, true)),
            (1, 252)
        );
        odd.head_dim = 8;
        assert_eq!(
            (mamba_scan_channels(&odd), mamba_ssm_threads(&odd, true)),
            (1, 32)
        );
        // One thread a channel (d_state <= 32): no shuffles, so any count of threads.
        odd.d_state = 16;
        odd.head_dim = 6;
        assert_eq!(
            (mamba_scan_channels(&odd), mamba_ssm_threads(&odd, true)),
            (2, 3)
        );
        // Conv chunks: a block row per 32 rows of each segment, a short one counting whole.
        assert_eq!(mamba_conv_chunks([512], MAMBA_CONV_ROWS), 16);
        assert_eq!(
            mamba_conv_chunks([1, 32, 33, 1000], MAMBA_CONV_ROWS),
            1 + 1 + 2 + 32
        );
        let pool = resolve_pool(&c, 16, PoolSize::Blocks(100), 2).unwrap();
        let d = DecodeLayout::new(&c, &pool, 8);
        // in_proj: z 8192 + x B C (8192 + 2 x 8 x 128) + dt 128.
        assert_eq!(d.zxbcdt, 8 * 18560);
        assert_eq!((d.xbc, d.ssm_y, d.gated), (8 * 10240, 8 * 8192, 8 * 8192));
        let p = PrefillLayout::new(&c, 1024);
        assert_eq!((p.zxbcdt, p.gated_bf16), (1024 * 18560, 1024 * 8192));
        // A Llama has none of them.
        assert_eq!(DecodeLayout::new(&llama_1b(), &pool, 8).zxbcdt, 0);
        // What the kernels cannot do is named.
        let mut odd = c.clone();
        odd.hybrid.as_mut().unwrap().mamba.d_state = 1000;
        let e = check_model(&odd).unwrap_err().to_string();
        assert!(e.contains("ssm_state_size = 1000"), "{e}");
        let mut wide = c.clone();
        wide.hybrid.as_mut().unwrap().mamba.head_dim = 512;
        let e = check_model(&wide).unwrap_err().to_string();
        assert!(e.contains("2048 threads per head"), "{e}");
        let mut biased = c.clone();
        biased.hybrid.as_mut().unwrap().mamba.proj_bias = true;
        let e = check_model(&biased).unwrap_err().to_string();
        assert!(e.contains("use_bias = true"), "{e}");
        let mut long = c;
        long.hybrid.as_mut().unwrap().mamba.conv_kernel = 9;
        let e = check_model(&long).unwrap_err().to_string();
        assert!(e.contains("conv_kernel = 9"), "{e}");
    }

    #[test]
    fn a_model_too_big_is_refused_with_figures() {
        let c = llama_1b();
        let pool = resolve_pool(&c, 16, PoolSize::Blocks(1000), 2).unwrap();
        let e = check_fits(&c, 8, &pool, 1 << 30, 80 << 30)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("weights 2.30 GiB") && e.contains("1.00 GiB of 80.00 GiB are free"),
            "{e}"
        );
        assert!(check_fits(&c, 8, &pool, 40 << 30, 80 << 30).is_ok());
    }
}
