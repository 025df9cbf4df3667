//! scripts/ab-bench.sh end to end on the CPU: the real engine (target/release/engine) on
//! tiny-llama, as builds in directories of one name. Two directories named alike must stay two
//! builds (labelled apart by their parents), and one directory given twice one build run twice;
//! merged, an A/B would read one build's runs as another's rounds. Where the release engine is
//! missing the test says why and returns, unless CI=true, where that is a failure.

mod real_engine;

use std::process::Command;

#[test]
fn builds_in_directories_of_one_name_are_labelled_apart() {
    let Some((root, engine)) = real_engine::release_engine("ab-bench.sh") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let build = |dir: &str| {
        let d = tmp.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::symlink(&engine, d.join("engine")).unwrap();
        d.to_str().unwrap().to_string()
    };
    let (a, b, c) = (build("s44/main"), build("s46/main"), build("fix"));
    let out = tmp.path().join("out");
    let run = Command::new(root.join("scripts/ab-bench.sh"))
        .current_dir(&root)
        .arg("--out")
        .arg(&out)
        .arg(root.join("goldens/tiny-llama/model"))
        .arg([a.as_str(), b.as_str(), a.as_str(), c.as_str()].join(","))
        .args([
            "--",
            "--device",
            "cpu",
            "--prompt-lens",
            "3,8",
            "--max-tokens",
            "3",
        ])
        .args([
            "--ttft-len",
            "4",
            "--batch",
            "2",
            "--batch-tokens",
            "3",
            "--repeat",
            "1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stdout}\n{stderr}");
    let runs = std::fs::read_to_string(out.join("runs.tsv")).unwrap();
    let labels: Vec<&str> = runs
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    assert_eq!(
        labels,
        ["s44/main", "s46/main", "s44/main", "fix"],
        "{runs}"
    );
    // Each run's JSON is its own file, named by its label.
    for (n, l) in labels.iter().enumerate() {
        let f = out.join(format!("tiny-llama-{}-{}.json", l.replace('/', "+"), n + 1));
        assert!(runs.contains(f.to_str().unwrap()), "{runs}");
        assert!(f.is_file(), "{} is missing", f.display());
    }
    // The summary's table: s44/main over its two runs, the others against it.
    assert!(
        stdout.contains("| figure | s44/main | s46/main | fix |"),
        "{stdout}"
    );
    assert!(stdout.contains("(2 rounds"), "{stdout}");
}
