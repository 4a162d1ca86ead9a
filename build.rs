//! Composes every script under `lua/` with the helpers it includes from
//! `lua/lib/` (see `src/script/compose.rs`) into `$OUT_DIR/lua/`, the tree
//! the registry embeds, each script that writes with its at-most-once
//! variant beside it (`<name>@once`, see `compose::once`). A missing or
//! misused helper fails the build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::{env, fs};

#[path = "src/script/compose.rs"]
#[allow(dead_code)]
mod compose;

fn main() {
    println!("cargo:rerun-if-changed=lua");
    let root = Path::new("lua");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("lua");

    let mut files = BTreeMap::new();
    walk(root, root, &mut files);
    let (libs, scripts): (BTreeMap<_, _>, BTreeMap<_, _>) = files
        .into_iter()
        .partition(|(name, _)| name.starts_with("lib/"));

    let _ = fs::remove_dir_all(&out);
    for (name, source) in &scripts {
        let composed = compose::compose(name, source, |path| libs.get(path).map(String::as_str))
            .unwrap_or_else(|msg| panic!("lua/{name}.lua: {msg}"));
        let target = out.join(format!("{name}.lua"));
        fs::create_dir_all(target.parent().expect("a script path has a parent"))
            .expect("create $OUT_DIR/lua");
        // The at-most-once variant of a script that writes.
        if let Some(variant) = compose::once(name, &composed) {
            let path = out.join(format!("{name}{}.lua", compose::ONCE_SUFFIX));
            fs::write(path, variant).expect("write a script's once variant");
        }
        fs::write(&target, composed).expect("write a composed script");
    }
}

/// Every `.lua` file under `dir`, by its path under `root` without `.lua`.
fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read lua/")
        .map(|e| e.expect("read lua/").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "lua") {
            let rel = path
                .strip_prefix(root)
                .expect("under lua/")
                .with_extension("");
            let name = rel.to_str().expect("UTF-8 script paths").replace('\\', "/");
            let source = fs::read_to_string(&path).expect("UTF-8 script");
            out.insert(name, source);
        }
    }
}
