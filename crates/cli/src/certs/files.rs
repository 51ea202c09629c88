//! Writing the output files: keys 0600, certificates 0644, never overwriting without `--force`,
//! and replacing atomically with it.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::list;

/// A file to write: its name in the output directory, contents and Unix mode.
#[derive(Clone)]
pub(super) struct OutputFile {
    pub(super) name: &'static str,
    pub(super) contents: String,
    pub(super) mode: u32,
}

impl std::fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFile")
            .field("name", &self.name)
            .field("mode", &format_args!("{:o}", self.mode))
            .finish_non_exhaustive()
    }
}

/// Why the output files were not written.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    #[error("{} already exist{}: pass --force to overwrite", list(.0), if .0.len() == 1 { "s" } else { "" })]
    Exists(Vec<PathBuf>),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes `files` into `dir` (created, 0700, if missing). Without `force`, nothing is written
/// if any of them exists. With `force`, each file is replaced atomically (written aside, then
/// renamed), so a key never exists with a wider mode or half-written. Returns the paths.
pub(super) fn write_files(
    dir: &Path,
    files: &[OutputFile],
    force: bool,
) -> Result<Vec<PathBuf>, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    if !dir.is_dir() {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(io(dir))?;
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f.name)).collect();
    if !force {
        let existing: Vec<PathBuf> = paths
            .iter()
            .filter(|p| fs::symlink_metadata(p).is_ok())
            .cloned()
            .collect();
        if !existing.is_empty() {
            return Err(WriteError::Exists(existing));
        }
    }
    for (file, path) in files.iter().zip(&paths) {
        if force {
            let tmp = dir.join(format!(".{}.tmp-{}", file.name, std::process::id()));
            // A leftover from an interrupted run.
            let _ = fs::remove_file(&tmp);
            create_file(&tmp, file).map_err(io(&tmp))?;
            fs::rename(&tmp, path).map_err(|source| {
                let _ = fs::remove_file(&tmp);
                WriteError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        } else {
            // create_new: if something appeared since the check above, refuse rather than
            // overwrite.
            create_file(path, file).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    WriteError::Exists(vec![path.clone()])
                } else {
                    WriteError::Io {
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
        }
    }
    Ok(paths)
}

fn create_file(path: &Path, file: &OutputFile) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, file.mode);
    let mut f = options.open(path)?;
    // The umask may have narrowed the mode; certificates should stay readable.
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(file.mode))?;
    f.write_all(file.contents.as_bytes())?;
    f.sync_all()
}
