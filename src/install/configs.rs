//! Steps 2 and 3 of the install, the config files on the host: the shim's config
//! (`--runsc-config`), and containerd's config with the runsc handler, its original backed up
//! once and the marker of an owed restart written before it changes.

use super::host::{self, Attrs};
use super::plan::{ContainerdPlan, ShimConfigPlan};
use super::{Error, InstallOpts, Report};

/// Writes the shim's config when it differs.
pub(super) fn write_shim_config(
    plan: Option<&ShimConfigPlan>,
    opts: &InstallOpts,
    report: &mut Report,
) -> Result<(), Error> {
    let Some(plan) = plan else {
        report.line(format!(
            "runsc config: skipped {} (the runc shim does not read it)",
            opts.runsc_config.display()
        ));
        return Ok(());
    };
    if plan.same {
        report.line(format!(
            "runsc config: unchanged {}",
            opts.runsc_config.display()
        ));
        return Ok(());
    }
    report.change(|| host::write_bytes(&plan.real, plan.text.as_bytes(), Attrs::mode(0o644)))?;
    report.line(format!(
        "runsc config: {} {}",
        report.verb("would write", "written"),
        opts.runsc_config.display()
    ));
    Ok(())
}

/// Writes containerd's edited config when it differs, after its backup (the first change
/// only) and, when a restart will follow, the marker that the restart is owed.
pub(super) fn write_containerd_config(
    plan: &ContainerdPlan,
    restart: bool,
    opts: &InstallOpts,
    report: &mut Report,
) -> Result<(), Error> {
    for w in &plan.edit.warnings {
        report.line(format!("warning: {w}"));
    }
    if !plan.changed {
        report.line(format!(
            "containerd config: unchanged {} (runsc handler present)",
            opts.containerd_config.display()
        ));
        return Ok(());
    }
    report.containerd_config_changed = true;
    if !report.dry() && restart {
        // Owed from here on: a crash between the write and the restart must not lose it.
        host::write_bytes(
            &plan.pending_real,
            b"containerd's config changed; computed install restarts containerd\n",
            Attrs::mode(0o644),
        )?;
    }
    let mut what = match &plan.old {
        None => format!("created {}", opts.containerd_config.display()),
        Some(_) => format!("changed {}", opts.containerd_config.display()),
    };
    if let Some(old) = &plan.old {
        if plan.backup_real.exists() {
            what.push_str(&format!(
                " (the first original stays in {})",
                plan.backup_host.display()
            ));
        } else {
            report.change(|| {
                host::write_bytes(
                    &plan.backup_real,
                    old.as_bytes(),
                    Attrs::of_existing(&plan.real, 0o644),
                )
            })?;
            what.push_str(&format!(
                " (original saved as {})",
                plan.backup_host.display()
            ));
        }
    }
    report.change(|| {
        host::write_bytes(
            &plan.real,
            plan.edit.text.as_bytes(),
            Attrs::of_existing(&plan.real, 0o644),
        )
    })?;
    report.line(format!(
        "containerd config: {}{what}",
        report.verb("would be ", "")
    ));
    Ok(())
}
