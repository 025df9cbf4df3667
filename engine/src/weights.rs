//! Safetensors checkpoints, memory-mapped: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`. Every header is validated against its file before any tensor
//! is read, and every tensor the config implies is checked for presence, dtype and shape before
//! any compute, so a broken checkpoint fails with the full list of what is wrong.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// The element types the engine reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    fn from_safetensors(d: Dtype) -> Option<Self> {
        match d {
            Dtype::F32 => Some(Self::F32),
            Dtype::F16 => Some(Self::F16),
            Dtype::BF16 => Some(Self::BF16),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }
}

struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

/// A borrowed tensor: raw little-endian bytes straight from the mapped file.
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Widened to f32 (exact for bf16 and f16).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            DType::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::BF16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::F16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }
}

pub struct Checkpoint {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

fn load_err(message: String) -> Error {
    Error::Load { message }
}

impl Checkpoint {
    /// Maps `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    pub fn open(model_dir: &Path) -> Result<Self> {
        let index_path = model_dir.join("model.safetensors.index.json");
        let single = model_dir.join("model.safetensors");
        let mut shards = Vec::new();
        let mut entries = HashMap::new();
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| load_err(format!("cannot read {}: {e}", index_path.display())))?;
            let index: Index = serde_json::from_str(&text).map_err(|e| {
                load_err(format!(
                    "{} is not a safetensors index (it needs a \"weight_map\"): {e}",
                    index_path.display()
                ))
            })?;
            let mut files: Vec<&String> = index.weight_map.values().collect();
            files.sort();
            files.dedup();
            let mut missing = Vec::new();
            for f in &files {
                if !model_dir.join(f).is_file() {
                    missing.push(f.as_str());
                }
            }
            if !missing.is_empty() {
                return Err(load_err(format!(
                    "{} names shard(s) that are not in {}: {}; copy the whole checkpoint",
                    index_path.display(),
                    model_dir.display(),
                    bounded_list(&missing, ", ")
                )));
            }
            for f in files {
                let shard_no = shards.len();
                let shard = Self::map_shard(&model_dir.join(f), shard_no, &mut entries)?;
                shards.push(shard);
            }
            // The index must agree with the shards it names.
            let mut wrong = Vec::new();
            for (name, file) in &index.weight_map {
                match entries.get(name) {
                    None => wrong.push(format!("{name} (index says {file}, not found there)")),
                    Some(e) if shards[e.shard].path.file_name() != Some(file.as_ref()) => wrong
                        .push(format!(
                            "{name} (index says {file}, found in {})",
                            shards[e.shard].path.display()
                        )),
                    Some(_) => {}
                }
            }
            if !wrong.is_empty() {
                return Err(load_err(format!(
                    "{} disagrees with its shards on {} tensor(s): {}",
                    index_path.display(),
                    wrong.len(),
                    bounded_list(&wrong, "; ")
                )));
            }
        } else if single.exists() {
            shards.push(Self::map_shard(&single, 0, &mut entries)?);
        } else {
            return Err(load_err(format!(
                "{} holds neither model.safetensors nor model.safetensors.index.json; the engine \
                 reads safetensors checkpoints as save_pretrained writes them",
                model_dir.display()
            )));
        }
        // The original Nemotron-H checkpoints name their tensors `backbone.*`; transformers
        // renames them to `model.*` as it loads (its conversion mapping), and so does the engine.
        let mut renamed = HashMap::with_capacity(entries.len());
        for (name, e) in entries {
            let name = match name.strip_prefix("backbone.") {
                Some(rest) => format!("model.{rest}"),
                None => name,
            };
            if renamed.contains_key(&name) {
                return Err(load_err(format!(
                    "tensor {name} appears both as backbone.* and as model.*; the checkpoint \
                     holds two copies of one weight"
                )));
            }
            renamed.insert(name, e);
        }
        Ok(Self {
            shards,
            entries: renamed,
        })
    }

    fn map_shard(path: &Path, shard: usize, entries: &mut HashMap<String, Entry>) -> Result<Shard> {
        let file = File::open(path)
            .map_err(|e| load_err(format!("cannot open {}: {e}", path.display())))?;
        // SAFETY: the file is opened read-only; the engine never writes to it. A checkpoint
        // rewritten under a running engine is outside what any mmap-based loader can guard.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| load_err(format!("cannot map {}: {e}", path.display())))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| {
            load_err(format!(
                "{} is not a valid safetensors file ({e}); it is truncated or its header does not \
                 match its data: copy or convert it again",
                path.display()
            ))
        })?;
        for (name, info) in metadata.tensors() {
            if entries.contains_key(&name) {
                return Err(load_err(format!(
                    "tensor {name} appears in more than one shard (again in {})",
                    path.display()
                )));
            }
            entries.insert(
                name,
                Entry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    begin: info.data_offsets.0,
                    end: info.data_offsets.1,
                },
            );
        }
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            data_start: 8 + header_len,
        })
    }

    /// Which shard holds a tensor (for uploading shard by shard).
    pub fn shard_of(&self, name: &str) -> Option<usize> {
        self.entries.get(name).map(|e| e.shard)
    }

    /// Tells the kernel that a shard's pages are no longer needed, so that uploading a large
    /// checkpoint keeps about one shard resident in host memory rather than the whole model.
    pub fn release_shard(&self, shard: usize) {
        // SAFETY: the mapping is read-only and file-backed: dropped pages are read again from
        // the file if touched, so no view into it can observe different contents.
        let _ = unsafe {
            self.shards[shard]
                .map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Total bytes of tensor data across the shards.
    pub fn data_bytes(&self) -> usize {
        self.entries.values().map(|e| e.end - e.begin).sum()
    }

    /// The tensor by its Hugging Face name. Only valid after [`Checkpoint::validate`] for
    /// tensors the config implies; others may carry dtypes the engine does not read.
    pub fn get(&self, name: &str) -> Result<TensorView<'_>> {
        let (key, e) = self
            .entries
            .get_key_value(name)
            .ok_or_else(|| load_err(format!("tensor {name} is missing from the checkpoint")))?;
        let dtype = DType::from_safetensors(e.dtype).ok_or_else(|| {
            load_err(format!(
                "tensor {name} has dtype {:?}; the engine reads F32, F16 and BF16",
                e.dtype
            ))
        })?;
        let shard = &self.shards[e.shard];
        // read_metadata proved begin <= end <= data length, so this slice is in bounds.
        let bytes = &shard.map[shard.data_start + e.begin..shard.data_start + e.end];
        Ok(TensorView {
            name: key,
            dtype,
            shape: &e.shape,
            bytes,
        })
    }

    /// The decoder layers the checkpoint holds: one more than the largest `N` in a
    /// `model.layers.N.` name (0 without any).
    pub fn layers_present(&self) -> usize {
        self.entries
            .keys()
            .filter_map(|n| {
                n.strip_prefix("model.layers.")?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()
            })
            .map(|n: usize| n.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// Checks every tensor the config implies, and reports all problems at once (the first
    /// [`MAX_LISTED`] by name, then their count). The layer count is checked first, against the
    /// names present, so that a config asking for millions of layers is refused before the
    /// list of their tensors is built.
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        let present = self.layers_present();
        if cfg.num_layers > present {
            return Err(load_err(format!(
                "config.json says num_hidden_layers = {} but the checkpoint holds {present} \
                 decoder layer(s) (model.layers.0 to model.layers.{}): the weights are not this \
                 config's",
                cfg.num_layers,
                present.saturating_sub(1)
            )));
        }
        let mut problems = Vec::new();
        for (name, shape) in expected_tensors(cfg) {
            match self.entries.get(&name) {
                None => problems.push(format!("{name}: missing")),
                Some(e) => {
                    if DType::from_safetensors(e.dtype).is_none() {
                        problems.push(format!(
                            "{name}: dtype {:?} (the engine reads F32, F16, BF16)",
                            e.dtype
                        ));
                    }
                    if e.shape != shape {
                        problems.push(format!(
                            "{name}: shape {:?}, config.json implies {shape:?}",
                            e.shape
                        ));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(load_err(format!(
                "the checkpoint does not match config.json ({} problem(s)): {}",
                problems.len(),
                bounded_list(&problems, "; ")
            )))
        }
    }
}

/// Problems named in one error message at most; the rest are counted. An error event travels
/// on one protocol line, and a config off by a million layers must not make it a megabyte.
pub const MAX_LISTED: usize = 12;

/// The first [`MAX_LISTED`] items joined by `sep`, then "and N more" for the rest.
pub fn bounded_list<S: AsRef<str>>(items: &[S], sep: &str) -> String {
    let shown: Vec<&str> = items.iter().take(MAX_LISTED).map(AsRef::as_ref).collect();
    let mut s = shown.join(sep);
    if items.len() > MAX_LISTED {
        s.push_str(&format!("{sep}and {} more", items.len() - MAX_LISTED));
    }
    s
}

/// Every tensor the config implies, by Hugging Face name, with its shape ([out, in] for
/// linear layers, as torch stores them).
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    if let Some(h) = &cfg.hybrid {
        return crate::hybrid::expected_tensors(cfg, h);
    }
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    let mut t = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        let mut add = |name: String, shape: Vec<usize>| t.push((name, shape));
        add(format!("{p}.input_layernorm.weight"), vec![h]);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        for (proj, out, inp) in [("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h)] {
            add(format!("{p}.self_attn.{proj}.weight"), vec![out, inp]);
            if cfg.qkv_bias {
                add(format!("{p}.self_attn.{proj}.bias"), vec![out]);
            }
        }
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, q]);
        if cfg.o_bias {
            add(format!("{p}.self_attn.o_proj.bias"), vec![h]);
        }
        if cfg.qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim]);
            add(format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim]);
        }
        for (proj, out, inp) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            add(format!("{p}.mlp.{proj}.weight"), vec![out, inp]);
            if cfg.mlp_bias {
                add(format!("{p}.mlp.{proj}.bias"), vec![out]);
            }
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    t
}
