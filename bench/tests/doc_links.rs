//! Every relative link in the repository's Markdown resolves.
//!
//! The README, `bench/NOTES.md` and the results index link to some two
//! hundred reports in `bench/results/`; a report renamed (the SLO runs'
//! `-2`, `-3`, ...) or a section moved between files silently breaks the
//! links a reader follows to check a figure. Links with a scheme
//! (`https:`, `mailto:`) and same-file anchors are not checked; a link's
//! own `#anchor` is dropped and only its file is.

use std::path::{Path, PathBuf};

/// Folders that hold no documentation of ours: build output and installed
/// tools (`tools/node`'s packages). Hidden folders are skipped too:
/// `.git`, and `.tools`, where the tests' Python environments are
/// installed with their packages' own Markdown.
const SKIP: &[&str] = &["target", "node_modules", "tools"];

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !SKIP.contains(&name) && !name.starts_with('.') {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The targets of the inline links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

fn is_external(target: &str) -> bool {
    // A scheme: letters, then a colon (`https:`, `mailto:`).
    target.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphabetic())
    })
}

#[test]
fn every_relative_markdown_link_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.len() > 20,
        "found only {} Markdown files under {}",
        files.len(),
        root.display()
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("Markdown is UTF-8");
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || is_external(target) {
                continue;
            }
            let resolved = file.parent().expect("a file has a folder").join(path);
            if !resolved.exists() {
                broken.push(format!(
                    "{}: {target}",
                    file.strip_prefix(&root).unwrap_or(file).display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_scanner_finds_what_it_must() {
    let text = "see [a](x.md), [b](https://e.org/y) and [c](../z.md#part) [d](#here)";
    assert_eq!(
        link_targets(text),
        ["x.md", "https://e.org/y", "../z.md#part", "#here"]
    );
    assert!(is_external("https://e.org/y"));
    assert!(!is_external("../z.md#part"));
}
