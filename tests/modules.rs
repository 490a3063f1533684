//! The crate's modules import each other without cycles: reading `src/`, every top-level
//! module's `crate::…` paths form a graph that must be acyclic, and so must the `super::…`
//! paths between sibling files of one directory module (a child may use its parent, which
//! owns it).

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

/// The identifiers that follow `prefix` (`crate::` or `super::`) in `text`, also inside
/// `use prefix{a, b::c}` groups.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices(prefix) {
        // Only whole path segments: not `foo_crate::`.
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
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

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(&src) {
        let rel = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        // The `wml` binary is its own crate; lib.rs is the root that declares the modules.
        if parts[0] == "bin" || parts[0] == "lib" {
            continue;
        }
        let module = parts[0].clone();
        let code = code_of(&file);
        let used: BTreeSet<String> = paths_after(&code, "crate::")
            .into_iter()
            .filter(|m| m != &module)
            .collect();
        top.entry(module.clone()).or_default().extend(used);
        // A file of a directory module (not its mod.rs) and the siblings it names.
        if parts.len() == 2 && parts[1] != "mod" {
            let me = format!("{module}::{}", parts[1]);
            let names = paths_after(&code, "super::");
            let dir = src.join(&module);
            let edges = siblings.entry(me).or_default();
            for name in names {
                if dir.join(format!("{name}.rs")).exists() {
                    edges.insert(format!("{module}::{name}"));
                }
            }
        }
    }
    // Keep only edges to modules of the crate (not `crate::Error` and other re-exports
    // through the root, which lib.rs resolves to their modules: those would hide nothing).
    let modules: BTreeSet<String> = top.keys().cloned().collect();
    for edges in top.values_mut() {
        edges.retain(|m| modules.contains(m));
    }
    assert!(
        top.len() > 15,
        "found the crate's modules: {:?}",
        top.keys()
    );
    if let Some(c) = cycle(&top) {
        panic!("modules import each other: {}", c.join(" -> "));
    }
    if let Some(c) = cycle(&siblings) {
        panic!("sibling files import each other: {}", c.join(" -> "));
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
        "use crate::{bank, inputs::X};\nlet x = crate::knn::run();",
        "crate::",
    );
    assert_eq!(
        use_group,
        ["bank", "inputs", "knn"]
            .into_iter()
            .map(String::from)
            .collect(),
        "use groups and paths in expressions"
    );
}
