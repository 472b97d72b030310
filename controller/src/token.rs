//! The API's access token. Every listener requires one, loopback included: any user of the
//! host can reach a loopback port. A controller started without a token, on loopback, keeps
//! one in its state directory ([`TOKEN_FILE`]), readable by its own user only, and makes it
//! there on its first start; clients on the same host read it from that file. Beyond loopback
//! the operator gives the token, to hand it to the hosts that need it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The token's file in the controller's state directory.
pub const TOKEN_FILE: &str = "token";

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the controller's API needs an access token")]
    Missing,
    #[error("listening on {addr}, beyond loopback, needs an access token (--token or INA_CONTROLLER_TOKEN)")]
    RequiredBeyondLoopback { addr: SocketAddr },
    #[error("the access token must be 16 to 256 printable ASCII characters without spaces")]
    Bad,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no access token (16 to 256 printable characters): delete it, and the controller makes a new one")]
    BadFile { path: PathBuf },
    #[error("{path} can be read by other users: `chmod 600` it, or delete it and the controller makes a new one")]
    Exposed { path: PathBuf },
}

/// Checks a token: 16 to 256 printable ASCII characters without spaces.
pub fn check(token: &str) -> Result<(), TokenError> {
    match token {
        "" => Err(TokenError::Missing),
        t if (16..=256).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic()) => Ok(()),
        _ => Err(TokenError::Bad),
    }
}

/// A new token: 32 bytes from the kernel's random source, as 64 hexadecimal digits.
pub fn generate() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token kept in `path` (one line), refused if other users may read the file.
pub fn read(path: &Path) -> Result<String, TokenError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(TokenError::Exposed {
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let token = text.trim_end_matches(['\n', '\r']);
    check(token).map_err(|_| TokenError::BadFile {
        path: path.to_path_buf(),
    })?;
    Ok(token.to_string())
}

/// The token of a controller listening on `listen` whose state is in `state_dir`: `given`,
/// if any; else, on loopback, the one kept in `state_dir`'s [`TOKEN_FILE`], made there
/// (mode 0600) if missing. Returns it, with the file when it is kept in one.
pub fn resolve(
    listen: SocketAddr,
    given: Option<String>,
    state_dir: &Path,
) -> Result<(String, Option<PathBuf>), TokenError> {
    if let Some(t) = given {
        check(&t)?;
        return Ok((t, None));
    }
    if !listen.ip().is_loopback() {
        return Err(TokenError::RequiredBeyondLoopback { addr: listen });
    }
    let path = state_dir.join(TOKEN_FILE);
    let token = match read(&path) {
        Err(TokenError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            make(&path)?
        }
        other => other?,
    };
    Ok((token, Some(path)))
}

/// Makes a new token and keeps it in `path`, readable by this user only.
fn make(path: &Path) -> Result<String, TokenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let token = generate().map_err(io)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    writeln!(f, "{token}").map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(token)
}
