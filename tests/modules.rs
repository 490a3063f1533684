//! The crate's folders are its layers, and imports run only down them:
//!
//! ```text
//! distributed, reference -> ops -> data -> context -> kernels -> runtime -> leaves
//! ```
//!
//! (`leaves` are the loose files beside `lib.rs`: error, hooks, metric, rng, validate.) Every
//! `crate::…` path in the code of `src/` is resolved (through `lib.rs`'s `pub use` list for the
//! names re-exported at the root) to the folder it lands in, which must be at or below the
//! importing file's. Inside a layer, the units (`ops::knn`, `runtime::transfer`, a leaf file)
//! must import each other without cycles, and so must sibling files of one directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The paths that follow `prefix` (`crate::` or `super::`) in `text`, as their segments,
/// with `use prefix{a, b::{c, d}}` groups expanded.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        // Only whole path segments: not `foo_crate::`.
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        expand(&text[i + prefix.len()..], Vec::new(), &mut found);
    }
    found
}

/// One item of a `{…}` group (none after a trailing comma).
fn item(text: &str, head: &[String], out: &mut Vec<Vec<String>>) {
    if !text.trim().is_empty() {
        expand(text, head.to_vec(), out);
    }
}

/// The path at the start of `rest` below `head`, into `out` (groups expanded recursively).
fn expand(rest: &str, head: Vec<String>, out: &mut Vec<Vec<String>>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        // The group's items, split at its own top-level commas.
        let (mut depth, mut from) = (0usize, 0usize);
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    item(&group[from..j], &head, out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    item(&group[from..j], &head, out);
                    from = j + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() || name == "self" {
        if !head.is_empty() {
            out.push(head);
        }
        return;
    }
    let mut path = head;
    let after = &rest[name.len()..];
    path.push(name);
    match after.strip_prefix("::") {
        Some(more) => expand(more, path, out),
        None => out.push(path),
    }
}

/// Text without `//` comments (doc examples name public paths, not imports).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first cycle of `graph`, if any, as the path around it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut path = stack[at..].to_vec();
            path.push(node.to_string());
            return Some(path);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The layers, bottom first; a folder's rank is its index.
const LAYERS: [&str; 6] = ["", "runtime", "kernels", "context", "data", "ops"];
/// Above the operations: the MPI front end and the test oracles (which name public types).
const TOP: [&str; 2] = ["distributed", "reference"];

/// The rank of the top-level module `first` (a folder or a leaf file).
fn rank(first: &str) -> usize {
    if TOP.contains(&first) {
        LAYERS.len()
    } else {
        LAYERS.iter().position(|l| *l == first).unwrap_or(0)
    }
}

/// The layering unit of a module path: `ops::knn` inside a layer folder, else the leaf.
fn unit(path: &[String]) -> String {
    match path {
        [first, second, ..] if rank(first) > 0 => format!("{first}::{second}"),
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

/// Each name that `lib.rs` re-exports at the root, to the module path it comes from.
pub(crate) fn root_exports(src: &Path) -> BTreeMap<String, Vec<String>> {
    let code = code_of(&src.join("lib.rs"));
    let mut names = BTreeMap::new();
    for path in paths_after(&code, "pub use ") {
        if let Some((name, module)) = path.split_last() {
            names.insert(name.clone(), module.to_vec());
        }
    }
    names
}

/// Each file's upward imports and the unit and sibling graphs of `src`.
struct Imports {
    upward: Vec<String>,
    units: BTreeMap<String, BTreeSet<String>>,
    siblings: BTreeMap<String, BTreeSet<String>>,
}

fn imports_of(src: &Path) -> Imports {
    let exports = root_exports(src);
    let mut found = Imports {
        upward: Vec::new(),
        units: BTreeMap::new(),
        siblings: BTreeMap::new(),
    };
    for file in sources(src) {
        let rel = file.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        // The `wml` binary is its own crate; lib.rs is the root that declares the modules.
        if parts[0] == "bin" || parts[0] == "lib" {
            continue;
        }
        let file_parts = parts.clone();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        let me = unit(&parts);
        let my_rank = rank(&parts[0]);
        let code = code_of(&file);
        let edges = found.units.entry(me.clone()).or_default();
        // `crate::` paths, and `super::` paths resolved from this file's module (a chain of
        // them may climb out of its folder).
        let mut paths = paths_after(&code, "crate::");
        for path in paths_after(&code, "super::") {
            let ups = 1 + path.iter().take_while(|s| *s == "super").count();
            let rest = &path[ups - 1..];
            if ups > parts.len() || rest.is_empty() {
                continue;
            }
            let mut resolved = parts[..parts.len() - ups].to_vec();
            resolved.extend(rest.iter().cloned());
            // Inside an inline `mod tests`, `super` is the file itself: a name that is no
            // module or root re-export is such an item, not a climb.
            let first = &resolved[0];
            let known = src.join(first).is_dir()
                || src.join(format!("{first}.rs")).exists()
                || exports.contains_key(first);
            if known {
                paths.push(resolved);
            }
        }
        for path in paths {
            // A name re-exported at the root stands for the module it comes from.
            let target = match path.first() {
                Some(first) if exports.contains_key(first) => exports[first].clone(),
                _ => path.clone(),
            };
            let Some(first) = target.first() else {
                continue;
            };
            let is_module = src.join(first).is_dir() || src.join(format!("{first}.rs")).exists();
            assert!(
                is_module,
                "{}: `crate::{}` names neither a module nor a root re-export",
                rel.display(),
                path.join("::")
            );
            if rank(first) > my_rank {
                found.upward.push(format!(
                    "{} imports crate::{} from a layer above",
                    rel.display(),
                    path.join("::")
                ));
            }
            let to = unit(&target);
            if to != me && !to.is_empty() {
                edges.insert(to);
            }
        }
        // A file of a directory (not its mod.rs) and the sibling files it names.
        if file_parts.last().is_some_and(|p| p != "mod") && file_parts.len() >= 2 {
            let dir: PathBuf = file_parts[..file_parts.len() - 1].iter().collect();
            let dir_name = dir.to_string_lossy().to_string();
            let node = format!("{dir_name}/{}", file_parts[file_parts.len() - 1]);
            let edges = found.siblings.entry(node).or_default();
            for path in paths_after(&code, "super::") {
                if let Some(name) = path.first() {
                    if src.join(&dir).join(format!("{name}.rs")).exists() {
                        edges.insert(format!("{dir_name}/{name}"));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn imports_run_down_the_layers_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = imports_of(&src);
    assert!(
        found.units.len() > 25 && found.units.contains_key("ops::knn"),
        "found the crate's units: {:?}",
        found.units.keys()
    );
    assert!(
        found.upward.is_empty(),
        "imports that run up the layers:\n{}",
        found.upward.join("\n")
    );
    if let Some(c) = cycle(&found.units) {
        panic!("modules import each other: {}", c.join(" -> "));
    }
    if let Some(c) = cycle(&found.siblings) {
        panic!("sibling files import each other: {}", c.join(" -> "));
    }
}

#[test]
fn every_folder_of_src_is_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if path.is_dir() && name != "bin" {
            assert!(
                LAYERS.contains(&name.as_str()) || TOP.contains(&name.as_str()),
                "src/{name}/ is a folder outside the layers {LAYERS:?} and {TOP:?}"
            );
        }
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle(&g), None, "a chain is no cycle");
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]),
        "a -> b -> c -> a"
    );
    let use_group = paths_after(
        "use crate::{bank, ops::{knn::Knn, loss,},};\nlet x = crate::knn::run(); foo_crate::x",
        "crate::",
    );
    let joined: Vec<String> = use_group.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        ["bank", "ops::knn::Knn", "ops::loss", "knn::run"],
        "use groups, nested groups and paths in expressions"
    );
    assert_eq!(rank("ops"), 5);
    assert!(rank("distributed") > rank("ops") && rank("error") == 0);
    assert_eq!(
        unit(&["ops".into(), "knn".into(), "gpu".into()]),
        "ops::knn"
    );
    assert_eq!(unit(&["metric".into()]), "metric");
}

/// Files with one job: none of `src/` grows past 800 lines (split it by what it does).
#[test]
fn no_source_file_is_over_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = sources(&src)
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).ok()?.lines().count();
            (lines > 800).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 800 lines: {long:?}");
}

/// The public docs state the contract (what, shapes, cost, errors, one example) in about 15
/// lines, the how in the module docs: none of a public item's docs runs past 25 lines.
#[test]
fn no_public_doc_is_over_25_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for file in sources(&src) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut i = 0;
        while i < lines.len() {
            let doc = lines[i..]
                .iter()
                .take_while(|l| l.starts_with("///"))
                .count();
            if doc == 0 {
                i += 1;
                continue;
            }
            // The item after the docs and its attributes.
            let item = lines[i + doc..].iter().find(|l| !l.starts_with("#["));
            if doc > 25 && item.is_some_and(|l| l.starts_with("pub ")) {
                long.push(format!("{}:{}: {doc} lines", file.display(), i + 1));
            }
            i += doc;
        }
    }
    assert!(long.is_empty(), "public docs over 25 lines: {long:?}");
}
