//! A record's host class: what its figures depend on besides the code and the unit. The GPU
//! (its name; the CPU's for a run with no GPU), the driver, and the host (its CPU model and core
//! count; not its name: two nodes of one kind are one class). Records of two classes are never
//! mixed in one verdict: `report` shows each unit's records class by class, `compare` pairs
//! records within a class (docs/REPORT.md, docs/FLEET.md).

use std::collections::BTreeMap;
use std::fmt;

use crate::record::archive::{RecordView, Stored};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostClass {
    pub gpu: String,
    pub driver: String,
    pub host: String,
}

impl HostClass {
    pub fn of(rec: &RecordView) -> HostClass {
        HostClass {
            gpu: rec.device_name(),
            driver: rec.driver(),
            host: rec.host_cpu(),
        }
    }

    /// The class as a file name part: lower-case letters, digits, `.` and `-` only.
    pub fn slug(&self) -> String {
        let raw = format!("{}-{}-{}", self.gpu, self.driver, self.host).to_lowercase();
        let mut s = String::new();
        for c in raw.chars() {
            let c = if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            };
            if !(c == '-' && (s.is_empty() || s.ends_with('-'))) {
                s.push(c);
            }
        }
        s.trim_end_matches('-').to_string()
    }
}

/// "NVIDIA H200, driver 580.65.06, host x86 (16 cores)".
impl fmt::Display for HostClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, driver {}, host {}",
            self.gpu, self.driver, self.host
        )
    }
}

/// `records` (one unit's, oldest first) by host class, each class oldest first.
pub fn by_class<'a>(records: &[&'a Stored]) -> BTreeMap<HostClass, Vec<&'a Stored>> {
    let mut m: BTreeMap<HostClass, Vec<&Stored>> = BTreeMap::new();
    for r in records {
        m.entry(HostClass::of(&r.rec)).or_default().push(r);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::archive::parse;

    fn rec(host: &str) -> RecordView {
        parse(&format!(
            r#"{{"schema": 1, "unit": {{"name": "u"}}, "project": {{"tree": "t"}}, "axes": [], "host": {host}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn the_class_is_gpu_driver_and_cpu_not_the_host_name() {
        let a = rec(
            r#"{"hostname": "n1", "cpu_model": "Xeon", "cores": 16, "gpu": {"name": "NVIDIA H200", "driver": "580"}}"#,
        );
        let b = rec(
            r#"{"hostname": "n2", "cpu_model": "Xeon", "cores": 16, "gpu": {"name": "NVIDIA H200", "driver": "580"}}"#,
        );
        assert_eq!(HostClass::of(&a), HostClass::of(&b));
        assert_eq!(
            HostClass::of(&a).to_string(),
            "NVIDIA H200, driver 580, host Xeon (16 cores)"
        );
        assert_eq!(HostClass::of(&a).slug(), "nvidia-h200-580-xeon-16-cores");
        let c = rec(
            r#"{"hostname": "n1", "cpu_model": "Xeon", "cores": 16, "gpu": {"name": "NVIDIA H200", "driver": "590"}}"#,
        );
        assert_ne!(HostClass::of(&a), HostClass::of(&c));
        let cpu = rec(r#"{"cpu_model": "AMD EPYC", "cores": 2}"#);
        assert_eq!(
            HostClass::of(&cpu).to_string(),
            "no GPU (CPU: AMD EPYC), driver none, host AMD EPYC (2 cores)"
        );
        assert_eq!(HostClass::of(&rec("{}")).host, "unrecorded");
    }
}
