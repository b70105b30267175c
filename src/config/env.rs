//! The environment variables that override the config file: one list ([`ENV`]) that
//! [`Config::apply_env`] applies and the test harness and the bench clear.

use super::{Config, Error, PoolEntry};
use crate::size::ByteSize;

/// One environment variable that overrides a config key.
pub struct EnvVar {
    /// The variable.
    pub name: &'static str,
    /// Whether an empty value counts (e.g. `COMPUTE_SOCKET=` turns the socket off); otherwise
    /// an empty value is ignored.
    pub empty_counts: bool,
    set: Set,
}

/// How a variable's value goes into the config.
enum Set {
    /// Taken as it is.
    Plain(fn(&mut Config, String)),
    /// Parsed; a value that does not parse is an error.
    Parsed(fn(&mut Config, String) -> Result<(), String>),
}

impl EnvVar {
    const fn new(name: &'static str, empty_counts: bool, set: Set) -> Self {
        Self {
            name,
            empty_counts,
            set,
        }
    }
}

fn flag(v: &str) -> bool {
    matches!(v, "1" | "true" | "yes")
}

fn idle_suspend(c: &mut Config, v: String) -> Result<(), String> {
    c.idle_suspend_secs = v.parse().map_err(|e| format!("{v:?}: {e}"))?;
    Ok(())
}

fn workspace_size(c: &mut Config, v: String) -> Result<(), String> {
    c.workspace_size = ByteSize::parse(&v).map_err(|e| e.to_string())?;
    Ok(())
}

fn pool(c: &mut Config, v: String) -> Result<(), String> {
    c.pool = pool_from_env(&v)?;
    Ok(())
}

/// Every environment variable that overrides the config file, in the order they apply. The
/// one list: [`Config::apply_env`] applies it, and the test harness and the bench clear it
/// (with [`CONFIG_FILE_ENV`]) so that the config file they write is the whole configuration.
#[rustfmt::skip]
pub const ENV: &[EnvVar] = &[
    EnvVar::new("COMPUTE_LISTEN", false, Set::Plain(|c, v| c.listen = v)),
    EnvVar::new("COMPUTE_SOCKET", true, Set::Plain(|c, v| c.socket = v.into())),
    EnvVar::new("COMPUTE_METRICS_LISTEN", true, Set::Plain(|c, v| c.metrics_listen = v)),
    EnvVar::new("CONTAINERD_ADDRESS", false, Set::Plain(|c, v| c.containerd_socket = v.into())),
    EnvVar::new("COMPUTE_STATE_DIR", false, Set::Plain(|c, v| c.state_dir = v.into())),
    EnvVar::new("COMPUTE_RUN_DIR", false, Set::Plain(|c, v| c.run_dir = v.into())),
    EnvVar::new("COMPUTE_NAMESPACE", false, Set::Plain(|c, v| c.namespace = v)),
    EnvVar::new("COMPUTE_NODE_NAME", false, Set::Plain(|c, v| c.node_name = v)),
    EnvVar::new("COMPUTE_DRAINING", false, Set::Plain(|c, v| c.draining = flag(&v))),
    EnvVar::new("SANDBOX_IMAGE", false, Set::Plain(|c, v| c.sandbox_image = v)),
    EnvVar::new("PVC_STORAGE_CLASS", false, Set::Plain(|c, v| c.storage_class = v)),
    EnvVar::new("PVC_WORKSPACE_SIZE", false, Set::Parsed(workspace_size)),
    EnvVar::new("COMPUTE_IDLE_SUSPEND_SECS", false, Set::Parsed(idle_suspend)),
    EnvVar::new("COMPUTE_AGENT", false, Set::Plain(|c, v| c.agent = flag(&v))),
    EnvVar::new("COMPUTE_AGENT_BINARY", false, Set::Plain(|c, v| c.agent_binary = v.into())),
    // `IMAGE=N[,IMAGE=N...]` replaces the file's pool; an empty value turns it off.
    EnvVar::new("COMPUTE_POOL", true, Set::Parsed(pool)),
];

/// The variable naming the config file (read by `computed` itself, not by [`Config::load`]).
pub const CONFIG_FILE_ENV: &str = "COMPUTE_CONFIG";

/// Every variable that changes a daemon's configuration: [`CONFIG_FILE_ENV`] and [`ENV`].
pub fn env_vars() -> impl Iterator<Item = &'static str> {
    std::iter::once(CONFIG_FILE_ENV).chain(ENV.iter().map(|v| v.name))
}

fn pool_from_env(v: &str) -> Result<Vec<PoolEntry>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (image, size) = item
                .rsplit_once('=')
                .ok_or_else(|| format!("{item:?} is not IMAGE=N"))?;
            let size = size
                .trim()
                .parse()
                .map_err(|_| format!("{item:?} is not IMAGE=N"))?;
            Ok(PoolEntry {
                image: image.trim().to_string(),
                size,
                storage_class: String::new(),
                workspace_size: None,
                mount_path: String::new(),
            })
        })
        .collect()
}

impl Config {
    /// Applies the environment overrides ([`ENV`]), reading variables through `get`. A value
    /// that does not parse (a size, a pool list) is an error naming the variable.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), Error> {
        for var in ENV {
            let Some(v) = get(var.name) else { continue };
            if v.is_empty() && !var.empty_counts {
                continue;
            }
            match var.set {
                Set::Plain(set) => set(self, v),
                Set::Parsed(set) => {
                    set(self, v).map_err(|why| Error::Invalid(format!("{}: {why}", var.name)))?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_readme_lists_every_variable() {
        let readme = include_str!("../../README.md");
        for v in super::env_vars() {
            assert!(
                readme.contains(&format!("| `{v}` |")) || v == super::CONFIG_FILE_ENV,
                "{v}"
            );
        }
        assert!(readme.contains(super::CONFIG_FILE_ENV));
    }
}
