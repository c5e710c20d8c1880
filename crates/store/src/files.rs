//! The SQLite store's files, private to their owner.
//!
//! The store holds every conversation, tool argument, tool output and
//! approval, so nobody but the user running the host may read it: the data
//! folder is made `0700` and the database file `0600` before SQLite opens
//! it. The modes are given when the folder and file are created, not set
//! afterwards, so there is no moment when they are readable by others.
//! SQLite creates the `-wal`, `-shm` and `-journal` files beside a database
//! with the database file's own mode, so they are `0600` as well. A store
//! found readable by others (made by an older version, or by hand) is
//! opened all the same, with a warning that names each such path.

use std::io;
use std::path::{Path, PathBuf};

/// Makes `dir` and its missing parents, each readable, writable and
/// searchable by its owner only. A folder that exists already is left as
/// it is (see [`readable_by_others`]).
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates `file` empty, readable and writable by its owner only, unless
/// it exists (SQLite takes an empty file for a new database). Its folder
/// must exist: a database URL naming a folder that does not is SQLite's
/// error to report.
pub(crate) fn create_private_file(file: &Path) -> io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(file) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The paths among `paths` that exist and that the group or others may
/// read, write or search, with their modes.
pub(crate) fn readable_by_others(paths: &[PathBuf]) -> Vec<(PathBuf, u32)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        paths
            .iter()
            .filter_map(|p| {
                let mode = std::fs::metadata(p).ok()?.permissions().mode() & 0o777;
                (mode & 0o077 != 0).then(|| (p.clone(), mode))
            })
            .collect()
    }
    #[cfg(not(unix))]
    {
        let _ = paths;
        Vec::new()
    }
}

/// The files of the SQLite database `file` that exist now: the database,
/// its `-wal`, `-shm` and `-journal` files, and the host lock files
/// beside it.
pub(crate) fn store_files(file: &Path) -> Vec<PathBuf> {
    let mut files = vec![file.to_path_buf()];
    let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
        return files;
    };
    for suffix in ["-wal", "-shm", "-journal"] {
        files.push(file.with_file_name(format!("{name}{suffix}")));
    }
    if let Some(dir) = file.parent()
        && let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
    {
        let lock = format!("{name}.host-");
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&lock) {
                files.push(entry.path());
            }
        }
    }
    files.retain(|f| f.exists());
    files
}

/// Warns about each of `paths` that others may read: the store opens all
/// the same (it is the operator's to fix), but nobody is left unaware.
pub(crate) fn warn_if_readable(paths: &[PathBuf]) {
    for (path, mode) in readable_by_others(paths) {
        let fix = if path.is_dir() { "700" } else { "600" };
        tracing::warn!(
            path = %path.display(),
            mode = %format!("{mode:03o}"),
            "the store can be read by other users of this machine (every conversation, \
             tool argument and result is in it); `chmod {fix}` it"
        );
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn folders_and_files_are_made_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        let file = dir.join("wma.db");
        create_private_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        // An existing file is left as it is, and found.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_private_file(&file).unwrap();
        assert_eq!(mode(&file), 0o644);
        let found = readable_by_others(&[dir.clone(), file.clone()]);
        assert_eq!(found, vec![(file.clone(), 0o644)]);
    }
}
