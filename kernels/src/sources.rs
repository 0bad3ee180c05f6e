//! The CUDA source a module is compiled from: the embedded files, or for kernel experiments some of
//! them replaced by the files of `$CLEAVE_KERNEL_SOURCES`, so that one build can time several
//! variants of a kernel (kernels/bench/lib.sh's `variant_dir`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::{CuFile, KernelError, COMMON, MODULES};

/// The variable naming a directory of `.cu` / `.cuh` files that replace the embedded files of the
/// same names in every module that includes them.
pub const SOURCES_ENV: &str = "CLEAVE_KERNEL_SOURCES";

/// Replacement files by name (file name -> text), read from one directory.
#[derive(Debug, Default, Clone)]
pub struct Replacements {
    dir: Option<PathBuf>,
    files: HashMap<String, String>,
}

/// A module's full source and the names of the files in it that were replaced.
#[derive(Debug, Clone)]
pub struct ModuleSource {
    pub text: String,
    pub replaced: Vec<&'static str>,
}

impl Replacements {
    /// None, or those of `$CLEAVE_KERNEL_SOURCES` when it is set and not empty.
    pub fn from_env() -> Result<Self, KernelError> {
        match std::env::var_os(SOURCES_ENV) {
            Some(d) if !d.is_empty() => Self::from_dir(Path::new(&d)),
            _ => Ok(Self::default()),
        }
    }

    /// The `.cu` / `.cuh` files of `dir`, each of which must have the name of an embedded file
    /// (a misspelt name would otherwise time the embedded kernel under the variant's label).
    pub fn from_dir(dir: &Path) -> Result<Self, KernelError> {
        let err = |what: String| KernelError::Invalid(format!("{SOURCES_ENV}={}: {what}", dir.display()));
        let known = known_files();
        let mut files = HashMap::new();
        for entry in std::fs::read_dir(dir).map_err(|e| err(e.to_string()))? {
            let path = entry.map_err(|e| err(e.to_string()))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if !(name.ends_with(".cu") || name.ends_with(".cuh")) {
                continue;
            }
            if !known.contains(&name) {
                return Err(err(format!("{name} is not one of the kernel sources ({})", known.join(", "))));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| err(format!("{name}: {e}")))?;
            files.insert(name.to_string(), text);
        }
        if files.is_empty() {
            return Err(err("holds no .cu or .cuh file".into()));
        }
        Ok(Self { dir: Some(dir.to_path_buf()), files })
    }

    /// The directory the replacements came from, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The source of a module made of `files`: `common.cuh`, a newline, then the files in order.
    pub fn module(&self, files: &[CuFile]) -> ModuleSource {
        let mut replaced = Vec::new();
        let mut pick = |(name, text): CuFile| match self.files.get(name) {
            Some(t) => {
                replaced.push(name);
                t.clone()
            }
            None => text.to_string(),
        };
        let mut text = pick(COMMON);
        text.push('\n');
        for &f in files {
            text.push_str(&pick(f));
        }
        ModuleSource { text, replaced }
    }
}

/// Every embedded file name, `common.cuh` first.
fn known_files() -> Vec<&'static str> {
    let mut names = vec![COMMON.0];
    for (_, files, _) in MODULES {
        for (n, _) in *files {
            if !names.contains(n) {
                names.push(n);
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str) -> &'static [CuFile] {
        MODULES.iter().find(|m| m.0 == name).expect("module").1
    }

    #[test]
    fn embedded_sources_are_common_then_the_files() {
        let src = Replacements::default().module(module("qdecode"));
        assert!(src.replaced.is_empty());
        assert!(src.text.starts_with(COMMON.1));
        let rest = &src.text[COMMON.1.len() + 1..];
        assert_eq!(rest, format!("{}{}", include_str!("cu/wgmma.cuh"), include_str!("cu/qdecode.cu")));
    }

    #[test]
    fn a_directory_replaces_the_files_of_its_names_in_every_module() {
        let dir = std::env::temp_dir().join(format!("cleave-sources-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("wgmma.cuh"), "// variant header\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not a source").unwrap();
        let r = Replacements::from_dir(&dir).unwrap();
        for m in ["qdecode", "wgmma", "mla_decode"] {
            let src = r.module(module(m));
            assert_eq!(src.replaced, vec!["wgmma.cuh"], "{m}");
            assert!(src.text.contains("// variant header\n") && !src.text.contains(include_str!("cu/wgmma.cuh")));
        }
        assert!(r.module(module("moe")).replaced.is_empty());
        std::fs::write(dir.join("qdecod.cu"), "").unwrap();
        let e = Replacements::from_dir(&dir).unwrap_err().to_string();
        assert!(e.contains(SOURCES_ENV) && e.contains("qdecod.cu is not one of the kernel sources"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = Replacements::from_dir(&dir).unwrap_err().to_string();
        assert!(e.contains(&dir.display().to_string()), "{e}");
    }
}
