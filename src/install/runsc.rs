//! Step 1 of the install: gVisor's binaries (`runsc`, and `containerd-shim-runsc-v1` when the
//! image ships it) copied into the host's `--bin-dir` when their bytes differ, as 0755.

use std::path::{Path, PathBuf};

use super::host::{self, Attrs, HostRoot};
use super::{Error, InstallOpts, Report};

/// One binary to put on the host: where from, where to, and whether its bytes differ.
pub(super) struct BinaryPlan {
    name: &'static str,
    src: PathBuf,
    /// Host path, for the report.
    dest: PathBuf,
    /// Resolved under the host root.
    real: PathBuf,
    sha256: [u8; 32],
    same_bytes: bool,
}

impl BinaryPlan {
    /// Resolves the destination of `src` in the host's `bin_dir` and compares the bytes.
    pub fn new(
        host: &HostRoot,
        name: &'static str,
        src: &Path,
        bin_dir: &Path,
    ) -> Result<Self, Error> {
        let dest = bin_dir.join(name);
        let real = host.resolve(&dest)?;
        let sha256 =
            host::sha256_file(src)?.ok_or_else(|| Error::MissingBinary { path: src.into() })?;
        let same_bytes = host::sha256_file(&real)? == Some(sha256);
        Ok(Self {
            name,
            src: src.into(),
            dest,
            real,
            sha256,
            same_bytes,
        })
    }

    /// Copies the binary when its bytes differ (as 0755), or fixes its mode.
    fn apply(&self, report: &mut Report) -> Result<(), Error> {
        let (name, dest) = (self.name, self.dest.display());
        if self.same_bytes {
            if host::mode_of(&self.real) == Some(0o755) {
                report.line(format!("{name}: unchanged {dest}"));
            } else {
                report.change(|| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&self.real, std::fs::Permissions::from_mode(0o755))
                        .map_err(host::io("chmod", &self.real))
                })?;
                let verb = report.verb("would chmod", "chmod");
                report.line(format!("{name}: {verb} 0755 {dest}"));
            }
            return Ok(());
        }
        report.change(|| {
            host::replace_file(&self.real, Attrs::mode(0o755), |f| {
                let mut s = std::fs::File::open(&self.src)?;
                std::io::copy(&mut s, f).map(|_| ())
            })
        })?;
        let verb = report.verb("would copy to", "copied to");
        report.line(format!(
            "{name}: {verb} {dest} (sha256 {})",
            &hex::encode(self.sha256)[..12]
        ));
        Ok(())
    }
}

/// Puts the planned binaries on the host, before any config names them, and says when the
/// image ships no shim.
pub(super) fn install_binaries(
    binaries: &[BinaryPlan],
    opts: &InstallOpts,
    report: &mut Report,
) -> Result<(), Error> {
    for b in binaries {
        b.apply(report)?;
    }
    if !opts.shim_src.is_file() {
        report.line(format!(
            "containerd-shim-runsc-v1: skipped ({} is not in this image)",
            opts.shim_src.display()
        ));
    }
    Ok(())
}
