//! What the runsc binary is: its version and what it can do, probed once when the node starts
//! (`runsc --version`, `runsc flags`, `runsc help platforms`, `runsc help checkpoint`), so that
//! nodes on gVisor 20221219 (Debian 12) and 20240729 (bookworm-backports) both work and say
//! which they are (`computectl doctor`).

use std::path::Path;
use std::process::Command;

/// A runsc binary's version and features.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunscInfo {
    /// The first line of `runsc --version` (`runsc version 0.0~20240729.0`); empty when it did
    /// not run.
    pub version: String,
    /// The release date in the version (`20240729`), when it has one.
    pub date: Option<u32>,
    /// The platforms it offers (`ptrace`, `kvm`, `systrap`).
    pub platforms: Vec<String>,
    /// The platform it uses when none is given.
    pub default_platform: String,
    /// Optional features, by name: `systrap`, `checkpoint-compression` (checkpoint
    /// `--compression`), `checkpoint-direct`, `restore-direct`, `exclude-zero-pages`.
    pub features: Vec<String>,
}

fn output(runsc: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new(runsc).args(args).output().ok()?;
    // `runsc flags` writes to stderr; `help` and `--version` to stdout.
    let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&o.stderr));
    Some(text)
}

/// The release date in a version line: `runsc version 0.0~20240729.0` (Debian) or
/// `runsc version release-20240212.0` (upstream) → 20240729 / 20240212.
pub fn version_date(line: &str) -> Option<u32> {
    let v = line.trim().strip_prefix("runsc version ")?;
    let v = v
        .strip_prefix("release-")
        .or_else(|| v.strip_prefix("0.0~"))
        .unwrap_or(v);
    let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
    (digits.len() == 8).then(|| digits.parse().ok()).flatten()
}

/// The default of `-platform` in `runsc flags` output (`... (default "systrap")`).
fn default_platform(flags: &str) -> Option<String> {
    let mut lines = flags.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "-platform string" {
            let doc = lines.next()?;
            let d = doc.rsplit_once("(default \"")?.1;
            return d.split_once('"').map(|(p, _)| p.to_string());
        }
    }
    None
}

impl RunscInfo {
    /// Probes the binary at `path` (blocking; a few short runs). A binary that does not run
    /// gives an empty version.
    pub fn probe(path: &Path) -> Self {
        let version = output(path, &["--version"])
            .and_then(|t| t.lines().next().map(|l| l.trim().to_string()))
            .unwrap_or_default();
        let platforms: Vec<String> = output(path, &["help", "platforms"])
            .map(|t| {
                t.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_lowercase()))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let flags = output(path, &["flags"]).unwrap_or_default();
        let default_platform = default_platform(&flags).unwrap_or_else(|| "ptrace".into());
        let checkpoint = output(path, &["help", "checkpoint"]).unwrap_or_default();
        let restore = output(path, &["help", "restore"]).unwrap_or_default();
        let mut info =
            Self::from_parts(&version, platforms, default_platform, &checkpoint, &restore);
        // A sandbox with open connections can be checkpointed (they are reset on restore):
        // without it runsc refuses to save a connected TCP endpoint.
        if flags
            .lines()
            .any(|l| l.trim_start().starts_with("-net-disconnect-ok"))
        {
            info.features.push("net-disconnect-ok".into());
        }
        info
    }

    /// The info of a binary that answered with these outputs.
    pub fn from_parts(
        version: &str,
        platforms: Vec<String>,
        default_platform: String,
        checkpoint_help: &str,
        restore_help: &str,
    ) -> Self {
        let flag = |help: &str, f: &str| help.lines().any(|l| l.trim_start().starts_with(f));
        let mut features = Vec::new();
        if platforms.iter().any(|p| p == "systrap") {
            features.push("systrap".to_string());
        }
        for (help, f, name) in [
            (checkpoint_help, "-compression", "checkpoint-compression"),
            (checkpoint_help, "-direct", "checkpoint-direct"),
            (
                checkpoint_help,
                "-exclude-committed-zero-pages",
                "exclude-zero-pages",
            ),
            (restore_help, "-direct", "restore-direct"),
        ] {
            if flag(help, f) {
                features.push(name.to_string());
            }
        }
        Self {
            version: version.trim().to_string(),
            date: version_date(version),
            platforms,
            default_platform,
            features,
        }
    }

    /// Whether it offers `platform`.
    pub fn has_platform(&self, platform: &str) -> bool {
        self.platforms.iter().any(|p| p == platform)
    }

    /// Whether it has the named feature.
    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_features_of_both_releases() {
        for (line, date) in [
            ("runsc version 0.0~20221219.0", Some(20221219)),
            ("runsc version 0.0~20240729.0\n", Some(20240729)),
            ("runsc version release-20240212.0", Some(20240212)),
            ("runsc version VERSION_MISSING", None),
            ("", None),
        ] {
            assert_eq!(version_date(line), date, "{line:?}");
        }
        let old_flags = "  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default \"ptrace\")\n";
        let new_flags = "  -platform string\n    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default \"systrap\")\n";
        assert_eq!(default_platform(old_flags).as_deref(), Some("ptrace"));
        assert_eq!(default_platform(new_flags).as_deref(), Some("systrap"));
        let old = RunscInfo::from_parts(
            "runsc version 0.0~20221219.0",
            vec!["ptrace".into(), "kvm".into()],
            "ptrace".into(),
            "  -image-path string\n  -leave-running\n",
            "  -detach\n  -image-path string\n",
        );
        assert!(!old.has("systrap") && !old.has("checkpoint-compression"));
        assert!(old.has_platform("ptrace") && !old.has_platform("systrap"));
        let new = RunscInfo::from_parts(
            "runsc version 0.0~20240729.0",
            vec!["ptrace".into(), "kvm".into(), "systrap".into()],
            "systrap".into(),
            "  -compression value\n  -direct\n  -exclude-committed-zero-pages\n  -image-path string\n",
            "  -detach\n  -direct\n",
        );
        assert_eq!(
            new.features,
            [
                "systrap",
                "checkpoint-compression",
                "checkpoint-direct",
                "exclude-zero-pages",
                "restore-direct"
            ]
        );
        assert_eq!(new.date, Some(20240729));
    }

    #[test]
    fn a_platform_the_binary_lacks_is_refused() {
        let old = RunscInfo::from_parts(
            "runsc version 0.0~20221219.0",
            vec!["ptrace".into(), "kvm".into()],
            "ptrace".into(),
            "",
            "",
        );
        use crate::runtime::platform_for;
        assert_eq!(platform_for("", &old).unwrap(), "ptrace");
        assert_eq!(platform_for("kvm", &old).unwrap(), "kvm");
        let e = platform_for("systrap", &old).unwrap_err().to_string();
        assert!(e.contains("systrap") && e.contains("ptrace, kvm"), "{e}");
        // A binary that could not be asked: take the config's word.
        assert_eq!(
            platform_for("systrap", &RunscInfo::default()).unwrap(),
            "systrap"
        );
    }

    /// The binaries on this machine, when they are there (scripts/install-deps puts both).
    #[test]
    fn the_installed_binaries_probe() {
        for (path, date) in [
            ("/usr/local/lib/compute/runsc-20221219/runsc", 20221219),
            ("/usr/bin/runsc", 0),
        ] {
            let p = Path::new(path);
            if !p.is_file() {
                continue;
            }
            let info = RunscInfo::probe(p);
            assert!(info.has_platform("ptrace"), "{path}: {info:?}");
            if date != 0 {
                assert_eq!(info.date, Some(date), "{path}");
                assert_eq!(info.default_platform, "ptrace");
            }
        }
    }
}
