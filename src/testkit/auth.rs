//! Access control for a test replica set: the key file shared by the
//! members, the `root` user, and percent-encoding of credentials in URIs.

use std::path::PathBuf;
use std::time::Instant;

use mongodb::bson::doc;
use tempfile::TempDir;

use super::TestkitError;
use super::member::POLL;
use super::process::DIR_PREFIX;
use super::replica_set::ReplicaSet;

impl ReplicaSet {
    /// The key file of an access-controlled set (`--keyFile`).
    pub(super) fn key_file(&self) -> Option<PathBuf> {
        self.key_dir.as_ref().map(|d| d.path().join("keyfile"))
    }

    /// Creates the `root` user of an access-controlled set on its primary,
    /// through the localhost exception (no user exists yet).
    pub(super) async fn create_root_user(&self, deadline: Instant) -> Result<(), TestkitError> {
        let Some((user, password)) = &self.opts.auth else {
            return Ok(());
        };
        loop {
            let primary = {
                let clients = self.direct_clients().await?;
                self.find_primary(&clients).await
            };
            if let Some(primary) = primary {
                let client = self.direct_client(primary).await?;
                let result = client
                    .database("admin")
                    .run_command(doc! {
                        "createUser": user,
                        "pwd": password,
                        "roles": [{ "role": "root", "db": "admin" }],
                        "writeConcern": { "w": "majority" },
                    })
                    .await;
                match result {
                    Ok(_) => return Ok(()),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(TestkitError::driver("creating the root user", e));
                    }
                    Err(e) => tracing::debug!(error = %e, "createUser failed, retrying"),
                }
            } else if Instant::now() >= deadline {
                return Err(self.timeout("a primary to create the root user on".into()));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Percent-encodes a user name or password for a connection string.
pub(super) fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Writes a random key file (mode 0400) into a fresh temporary directory.
pub(super) fn write_key_file() -> Result<TempDir, TestkitError> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-key-", std::process::id()))
        .tempdir()
        .map_err(|e| TestkitError::io("creating a key file directory", e))?;
    let key: String = (0..4)
        .map(|_| format!("{:016x}", super::random_u64()))
        .collect();
    let path = dir.path().join("keyfile");
    std::fs::write(&path, key).map_err(|e| TestkitError::io("writing the key file", e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))
            .map_err(|e| TestkitError::io("restricting the key file's permissions", e))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests;
