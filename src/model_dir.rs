//! Where the embedded default model lives.

use std::path::{Path, PathBuf};

/// The directory of the default model, `models/tiny-r1`, looked up from the working directory,
/// then beside the executable (`target/release/cleave` -> `../../models/tiny-r1`), then in the
/// source tree the binary was built from.
pub fn default_model() -> PathBuf {
    let rel = Path::new("models").join("tiny-r1");
    let mut candidates = vec![rel.clone()];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("../..").join(&rel));
            candidates.push(dir.join(&rel));
        }
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel));
    candidates.iter().find(|p| p.join("config.json").exists()).cloned().unwrap_or(rel)
}
