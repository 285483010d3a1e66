//! The layering src/lib.rs documents is the layering the code has: its "# Layout" list
//! names every module, and a module may import (`crate::name`) only modules listed below
//! it. So the import graph between modules has no circle, and a new upward import fails
//! here rather than in review.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The modules in the order of lib.rs's "# Layout" list.
fn documented_order(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! * `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The modules lib.rs declares.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';').to_owned())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::name` references in code (comments left out), per module of the crate.
fn imports(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src/");
        let Some(first) = rel.iter().next().and_then(|c| c.to_str()) else { continue };
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = fs::read_to_string(&file).expect("reading a source file");
        for line in text.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                rest = &rest[at + "crate::".len()..];
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    graph.entry(module.clone()).or_default().entry(name).or_insert_with(|| rel.display().to_string());
                }
            }
        }
    }
    graph
}

#[test]
fn modules_import_only_the_layers_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).expect("reading src/lib.rs");
    let order = documented_order(&lib);
    let mut missing: Vec<_> = declared(&lib).into_iter().filter(|m| !order.contains(m)).collect();
    missing.sort();
    assert!(missing.is_empty(), "modules missing from lib.rs's layout list: {missing:?}");
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut upward = Vec::new();
    for (module, uses) in imports(&root.join("src")) {
        let Some(from) = rank(&module) else { continue };
        for (used, file) in uses {
            match rank(&used) {
                Some(to) if to > from => {}
                Some(_) => upward.push(format!("{file}: {module} imports {used}, listed above it")),
                None => upward.push(format!("{file}: {module} imports {used}, not in the layout list")),
            }
        }
    }
    assert!(upward.is_empty(), "imports against the documented layering:\n{}", upward.join("\n"));
}

#[test]
fn the_layout_list_is_read_as_written() {
    let lib = "//! * `driver`: x\n//! * `protocol`: y\n//!   more\npub mod driver;\nmod protocol;\n";
    assert_eq!(documented_order(lib), ["driver", "protocol"]);
    assert_eq!(declared(lib), ["driver", "protocol"]);
}
