//! Which records a side of `compare` names (a file, a tree prefix, `latest`, `previous`), and
//! whether two records are like-for-like (same GPU, driver, oracle and unit configuration).

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::record::archive::{self, RecordView, Stored};

/// Which records a side of the comparison names.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// One record file.
    Path(PathBuf),
    /// Per unit, its latest record.
    Latest,
    /// Per unit, the latest record of the tree that ran before the latest record's tree.
    Previous,
    /// Per unit, the latest record of the tree whose hash starts with this.
    Tree(String),
}

impl Spec {
    pub fn parse(s: &str) -> Spec {
        match s {
            "latest" => Spec::Latest,
            "previous" => Spec::Previous,
            _ if !s.is_empty()
                && s.chars().all(|c| c.is_ascii_hexdigit())
                && !Path::new(s).exists() =>
            {
                Spec::Tree(s.to_ascii_lowercase())
            }
            _ => Spec::Path(PathBuf::from(s)),
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::Path(p) => write!(f, "{}", p.display()),
            Spec::Latest => write!(f, "latest"),
            Spec::Previous => write!(f, "previous"),
            Spec::Tree(t) => write!(f, "tree {t}"),
        }
    }
}

/// The records `spec` names, by unit.
pub fn resolve(spec: &Spec, records: &[Stored]) -> Result<BTreeMap<String, Stored>, String> {
    let groups = archive::by_unit(records);
    let mut out = BTreeMap::new();
    match spec {
        Spec::Path(p) => {
            let root = p.parent().unwrap_or(Path::new(""));
            let s = archive::load_file(p, root).map_err(|r| {
                format!(
                    "{} was not read: {}",
                    p.display(),
                    r.why.trim_end_matches('.')
                )
            })?;
            out.insert(s.rec.unit.name.clone(), s);
        }
        Spec::Latest => {
            for (u, rs) in &groups {
                out.insert(
                    u.clone(),
                    (*rs.last().expect("groups are never empty")).clone(),
                );
            }
        }
        Spec::Previous => {
            for (u, rs) in &groups {
                let latest = &rs.last().expect("groups are never empty").rec.project.tree;
                if let Some(r) = rs.iter().rev().find(|r| &r.rec.project.tree != latest) {
                    out.insert(u.clone(), (*r).clone());
                }
            }
        }
        Spec::Tree(prefix) => {
            let trees: std::collections::BTreeSet<&str> = records
                .iter()
                .map(|r| r.rec.project.tree.as_str())
                .filter(|t| t.starts_with(prefix.as_str()))
                .collect();
            if trees.len() > 1 {
                return Err(format!(
                    "the tree prefix {prefix} names {} trees ({}); give more digits.",
                    trees.len(),
                    trees.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
            for (u, rs) in &groups {
                if let Some(r) = rs
                    .iter()
                    .rev()
                    .find(|r| r.rec.project.tree.starts_with(prefix.as_str()))
                {
                    out.insert(u.clone(), (*r).clone());
                }
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{spec} names no record in the records directory."));
    }
    Ok(out)
}

/// `path.to.key` -> value, for naming the keys in which two unit configurations differ.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Unit keys that cannot change what is measured: where the lock lives, how long a phase may
/// run before the watchdog, the free-text description.
const CONFIG_KEYS_IGNORED: [&str; 3] = ["lease", "watchdog", "description"];

fn show(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// Everything that makes two records not like-for-like, one phrase each.
pub fn differences(base: &RecordView, head: &RecordView) -> Vec<String> {
    let mut d = vec![];
    let mut pair = |what: &str, b: String, h: String| {
        if b != h {
            d.push(format!("{what} (base {b}, head {h})"));
        }
    };
    pair("GPU", base.device_name(), head.device_name());
    pair("driver", base.driver(), head.driver());
    pair("oracle", base.oracle_name(), head.oracle_name());
    let (vb, vh) = (base.oracle_versions(), head.oracle_versions());
    let keys: std::collections::BTreeSet<&String> = vb.keys().chain(vh.keys()).collect();
    for k in keys {
        let s = |m: &BTreeMap<String, String>| m.get(k).cloned().unwrap_or_else(|| "absent".into());
        pair(&format!("oracle version of {k}"), s(&vb), s(&vh));
    }
    let (mut cb, mut ch) = (BTreeMap::new(), BTreeMap::new());
    flatten("", &base.unit.config, &mut cb);
    flatten("", &head.unit.config, &mut ch);
    let keys: std::collections::BTreeSet<&String> = cb.keys().chain(ch.keys()).collect();
    for k in keys {
        if CONFIG_KEYS_IGNORED
            .iter()
            .any(|i| k == i || k.starts_with(&format!("{i}.")))
        {
            continue;
        }
        if cb.get(k) != ch.get(k) {
            d.push(format!(
                "unit configuration key {k} (base {}, head {})",
                show(cb.get(k)),
                show(ch.get(k))
            ));
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_keywords_tree_prefixes_or_paths() {
        assert_eq!(Spec::parse("latest"), Spec::Latest);
        assert_eq!(Spec::parse("previous"), Spec::Previous);
        assert_eq!(Spec::parse("5325B7b9"), Spec::Tree("5325b7b9".into()));
        assert_eq!(
            Spec::parse("reports/records/u/x.json"),
            Spec::Path("reports/records/u/x.json".into())
        );
    }

    fn stored(unit: &str, tree: &str, created: &str) -> Stored {
        let text = format!(
            r#"{{"schema": 1, "created_utc": "{created}", "unit": {{"name": "{unit}"}}, "project": {{"tree": "{tree}"}}, "axes": []}}"#
        );
        Stored {
            path: PathBuf::from(format!("{unit}/{created}.json")),
            name: format!("{unit}/{created}.json"),
            rec: archive::parse(&text).unwrap(),
        }
    }

    #[test]
    fn a_tree_prefix_names_one_tree_and_latest_previous_are_per_unit() {
        let rs = vec![
            stored("u", "ab01", "1"),
            stored("u", "ab02", "2"),
            stored("u", "ab02", "3"),
            stored("v", "ab01", "4"),
        ];
        let e = resolve(&Spec::Tree("ab".into()), &rs).unwrap_err();
        assert!(e.contains("names 2 trees (ab01, ab02)"), "{e}");
        let m = resolve(&Spec::Tree("ab01".into()), &rs).unwrap();
        assert_eq!(m.len(), 2, "both units ran tree ab01");
        let m = resolve(&Spec::Latest, &rs).unwrap();
        assert_eq!(m["u"].rec.created_utc, "3");
        let m = resolve(&Spec::Previous, &rs).unwrap();
        assert_eq!(m["u"].rec.project.tree, "ab01");
        assert!(
            !m.contains_key("v"),
            "v ran one tree only: it has no previous"
        );
        assert!(resolve(&Spec::Tree("ff".into()), &rs)
            .unwrap_err()
            .contains("names no record"));
    }

    #[test]
    fn configuration_differences_name_the_key_and_skip_the_watchdog() {
        let mut a: RecordView = archive::parse(
            r#"{"schema": 1, "unit": {"name": "u", "config": {"battery": {"repeat": 3}, "watchdog": {"load_s": 9}}},
                "project": {"tree": "t"}, "axes": []}"#,
        )
        .unwrap();
        let mut b = a.clone();
        b.unit.config["battery"]["repeat"] = 5.into();
        b.unit.config["watchdog"]["load_s"] = 1.into();
        assert_eq!(
            differences(&a, &b),
            vec!["unit configuration key battery.repeat (base 3, head 5)".to_string()]
        );
        a.host.gpu = serde_json::json!({"name": "H200", "driver": "580"});
        b.unit.config = a.unit.config.clone();
        assert_eq!(
            differences(&a, &b),
            vec![
                "GPU (base H200, head no GPU (CPU: ))".to_string(),
                "driver (base 580, head none)".to_string()
            ]
        );
    }
}
