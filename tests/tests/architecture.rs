//! ARCHITECTURE.md's table of operation modules stays true: every module of lease-service's
//! `src/leases/` and task-service's `src/tasks/` has its row, and every file a row names exists.
//! (The table had drifted: three modules were missing from it.)

use std::collections::BTreeSet;
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
