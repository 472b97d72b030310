//! The controller's state on disk: one JSON file, replaced atomically after every change
//! (written beside it, fsynced, renamed over it, the directory fsynced). A controller killed at
//! any instant finds either the state before the change or the state after it. The file is
//! readable by its owner only: it holds the switches' control tokens.

use crate::state::State;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a controller state file ({source}); move it away to start empty")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: its switches' topology is refused ({why}); mend the file or move it away to start empty")]
    Topology { path: PathBuf, why: String },
}

/// The state file in a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

const FILE: &str = "controller-state.json";
const TEMP: &str = "controller-state.json.tmp";

impl Store {
    /// The store in `dir`, which is created if missing.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The saved state, if any.
    pub fn load(&self) -> Result<Option<State>, StoreError> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let state: State =
            serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
                path: path.clone(),
                source,
            })?;
        crate::topology::check(&state.switches)
            .map_err(|why| StoreError::Topology { path, why })?;
        Ok(Some(state))
    }

    /// Replaces the saved state with `state`, durably.
    pub fn save(&self, state: &State) -> Result<(), StoreError> {
        let temp = self.dir.join(TEMP);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { path, source }
        };
        let bytes = serde_json::to_vec_pretty(state).map_err(|e| StoreError::Io {
            path: temp.clone(),
            source: std::io::Error::other(e),
        })?;
        // Owner only: the state holds the switches' control tokens.
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temp)
                .map_err(io(&temp))?
        };
        f.write_all(&bytes).map_err(io(&temp))?;
        f.sync_all().map_err(io(&temp))?;
        drop(f);
        fs::rename(&temp, self.path()).map_err(io(&self.path()))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))?;
        Ok(())
    }
}
