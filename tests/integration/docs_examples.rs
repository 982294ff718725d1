//! Every SQL example of README.md and docs/*.md runs as written against the emulators, each
//! block in its own `gcp-sql` process pointed at the shared emulators (its statements in order,
//! as a user pastes it). A block marked `<!-- illustrative: why -->` on one of the two lines
//! before its fence is skipped: it reads a file or table of the reader's, or talks to Google
//! Cloud. A block must also run without a warning (an example should not trip its own limits),
//! unless `<!-- warns: why -->` says the warning is its point.

use std::path::{Path, PathBuf};

use gcp_sql::emulators::shared;

use crate::support::{output as run, text, tool as gcp_sql};

/// The marker that exempts a block, with its reason after the colon.
const ILLUSTRATIVE: &str = "<!-- illustrative:";

/// The marker of a block whose warnings are its point (a row skipped under the `drop` policy).
const WARNS: &str = "<!-- warns:";

/// One ```sql block: where it is, its text, and whether it is marked illustrative.
struct Example {
    file: PathBuf,
    line: usize,
    sql: String,
    illustrative: bool,
    warns: bool,
}

fn examples() -> Vec<Example> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim() == "```sql" {
                let start = i;
                let mut body = Vec::new();
                i += 1;
                while i < lines.len() && lines[i].trim() != "```" {
                    body.push(lines[i]);
                    i += 1;
                }
                let before = &lines[start.saturating_sub(2)..start];
                let illustrative = before.iter().any(|l| l.contains(ILLUSTRATIVE));
                let warns = before.iter().any(|l| l.contains(WARNS));
                out.push(Example {
                    file: file.clone(),
                    line: start + 1,
                    sql: body.join("\n"),
                    illustrative,
                    warns,
                });
            }
            i += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sql_example_of_the_docs_runs_as_written() {
    let all = examples();
    assert!(all.len() >= 15, "only {} examples found", all.len());
    let mut hosts = Vec::new();
    for kind in crate::support::all_emulators() {
        let emulator = shared(kind).await;
        hosts.push((emulator.env_var(), emulator.host().to_string()));
    }
    let mut failures = Vec::new();
    let mut ran = 0;
    for example in all.iter().filter(|e| !e.illustrative) {
        let home = tempfile::tempdir().unwrap();
        let mut command = gcp_sql(home.path());
        command.env("RUST_LOG", "warn");
        for (var, host) in &hosts {
            command.env(var, host);
        }
        // `--command=` keeps a block that starts with `--` (a comment) from reading as an option.
        command.args(["-q".to_string(), format!("--command={}", example.sql)]);
        let output = tokio::task::spawn_blocking(move || {
            let output = run(&mut command);
            drop(home);
            output
        })
        .await
        .unwrap();
        ran += 1;
        let stderr = text(&output.stderr);
        if !output.status.success() || (stderr.contains("WARN") && !example.warns) {
            failures.push(format!(
                "{}:{}: {}\n{}",
                example.file.display(),
                example.line,
                if output.status.success() {
                    "warned"
                } else {
                    "failed"
                },
                stderr
            ));
        }
    }
    assert!(ran >= 8, "only {ran} examples ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
