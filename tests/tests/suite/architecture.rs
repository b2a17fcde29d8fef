//! ARCHITECTURE.md's table of operation modules stays true: every module of lease-service's
//! `src/leases/` and task-service's `src/tasks/` has its row, and every file a row names exists.
//! (The table had drifted: three modules were missing from it.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of `folder`: its `.rs` files but `mod.rs`, and its folders (as `name/`), one
/// operation split into files of its own.
fn modules(folder: &Path) -> BTreeSet<String> {
    std::fs::read_dir(folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            if entry.file_type().ok()?.is_dir() {
                return Some(format!("{name}/"));
            }
            (name.ends_with(".rs") && name != "mod.rs").then_some(name)
        })
        .collect()
}

/// The files the table's `column` (0: lease-service, 1: task-service) names, each at the start
/// of its cell.
fn named(table: &[&str], column: usize) -> BTreeSet<String> {
    table
        .iter()
        .filter_map(|row| row.trim_matches('|').split('|').nth(column))
        .filter_map(|cell| {
            let cell = cell.trim().strip_prefix('`')?;
            let (name, _) = cell.split_once('`')?;
            (name.ends_with(".rs") || name.ends_with('/')).then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn the_operation_table_names_every_module_and_only_modules_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"));
    let table: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("| lease-service `src/leases/`"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    assert!(
        !table.is_empty(),
        "ARCHITECTURE.md has no table of operation modules"
    );
    for (column, folder) in [
        (0, "lease-service/src/leases"),
        (1, "task-service/src/tasks"),
    ] {
        assert_eq!(
            named(&table, column),
            modules(&root.join(folder)),
            "ARCHITECTURE.md's table against {folder}"
        );
    }
}

/// Each `.rs` file under `src` but binaries (`main.rs`, `bin/`), as its module's path
/// (`tasks/claim/mod.rs` and `tasks/claim.rs` alike are `["tasks", "claim"]`; `lib.rs` is `[]`).
fn module_files(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut found = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in
            std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let relative = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
            if path.is_dir() {
                if relative != Path::new("bin") {
                    folders.push(path);
                }
                continue;
            }
            let Some(stem) = relative.to_str().and_then(|r| r.strip_suffix(".rs")) else {
                continue;
            };
            let mut module: Vec<String> = stem.split('/').map(str::to_owned).collect();
            match module.last().map(String::as_str) {
                Some("main") if module.len() == 1 => continue,
                Some("mod" | "lib") => {
                    module.pop();
                }
                _ => {}
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
            found.insert(module, text);
        }
    }
    found
}

/// The modules each module names through `crate::`, `super::` or `self::` paths in its code
/// (not its comments, not its tests): each path's longest prefix that is a module of its own,
/// but its own ancestors.
fn imports(files: &BTreeMap<Vec<String>, String>) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut edges = BTreeMap::new();
    for (module, text) in files {
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mut named = BTreeSet::new();
        for (at, _) in code.match_indices("::") {
            // A path's start: `crate`, `super` or `self` right before its first `::`.
            let head: String = code[..at]
                .chars()
                .rev()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if head.contains("::") {
                continue;
            }
            let tail: Vec<&str> = code[at + 2..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .collect();
            let mut path: Vec<String> = match head.as_str() {
                "crate" => Vec::new(),
                "self" => module.clone(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => continue,
            };
            let mut rest = tail.into_iter().peekable();
            while rest.peek() == Some(&"super") {
                rest.next();
                path.pop();
            }
            let mut target = files.contains_key(&path).then(|| path.clone());
            for segment in rest {
                path.push(segment.to_owned());
                if files.contains_key(&path) {
                    target = Some(path.clone());
                }
            }
            // A module using what its ancestors define (the crate root's re-exports, its
            // folder's `mod.rs`) is how Rust is read; what must not loop are the others.
            if let Some(target) = target.filter(|t| !module.starts_with(t)) {
                named.insert(target);
            }
        }
        edges.insert(module.clone(), named);
    }
    edges
}

/// No module reaches itself again through what it imports: each crate reads in one direction
/// (the issue that asked for it found three cycles, and the first fix of one made another).
#[test]
fn no_module_imports_its_way_back_to_itself() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cycles = Vec::new();
    for krate in [
        "lease-service",
        "task-service",
        "worker",
        "task-generator",
        "shared",
        "cli",
        "deploy/local",
        "tests",
    ] {
        let edges = imports(&module_files(&root.join(krate).join("src")));
        for start in edges.keys() {
            // A walk from `start` along the imports; a way back to it is a cycle.
            let mut seen = BTreeSet::new();
            let mut todo: Vec<(Vec<String>, Vec<Vec<String>>)> = vec![(start.clone(), vec![])];
            while let Some((at, route)) = todo.pop() {
                for next in edges.get(&at).into_iter().flatten() {
                    let mut route = route.clone();
                    route.push(next.clone());
                    if next == start {
                        cycles.push(format!(
                            "{krate}: {} -> {}",
                            start.join("::"),
                            route
                                .iter()
                                .map(|m| m.join("::"))
                                .collect::<Vec<_>>()
                                .join(" -> ")
                        ));
                    } else if seen.insert(next.clone()) {
                        todo.push((next.clone(), route));
                    }
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}
