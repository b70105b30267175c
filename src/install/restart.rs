//! Step 4 of the install: containerd restarted only when its config changed or an earlier
//! run's restart is still owed, by `--restart-cmd` through `sh -c` or in place
//! (`--restart-mode reexec`, [`super::reexec`]), within `--restart-timeout-secs`; the marker of
//! an owed restart goes once the restart succeeds.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::host::{self, HostRoot};
use super::plan::ContainerdPlan;
use super::{reexec, Error, InstallOpts, Report, RestartMode};

/// Restarts containerd when `plan` says it must (or says why not).
pub(super) fn restart_if_owed(
    plan: &ContainerdPlan,
    restart: bool,
    opts: &InstallOpts,
    host: &HostRoot,
    report: &mut Report,
) -> Result<(), Error> {
    let how = match opts.restart_mode {
        RestartMode::Command => format!("`{}`", opts.restart_cmd),
        RestartMode::Reexec => format!(
            "in place: the containerd serving {}",
            opts.containerd_config.display()
        ),
    };
    if !plan.changed && !plan.pending {
        report.line("containerd: not restarted (config unchanged)");
    } else if !restart {
        report.line(
            "containerd: NOT restarted (--restart-cmd is empty): restart it to load the runsc \
             handler",
        );
    } else if report.dry() {
        report.line(format!("containerd: would restart ({how})"));
    } else {
        report.line(format!(
            "containerd: restarting ({how}){}",
            if plan.changed {
                ""
            } else {
                ", owed by an earlier run whose restart failed"
            }
        ));
        match opts.restart_mode {
            RestartMode::Command => run_restart(&opts.restart_cmd, opts.restart_timeout_secs)?,
            RestartMode::Reexec => reexec::restart(opts, host, &plan.edit.text, report)?,
        }
        std::fs::remove_file(&plan.pending_real).map_err(host::io("remove", &plan.pending_real))?;
        report.restarted = true;
        report.line("containerd: restarted");
    }
    Ok(())
}

/// Runs the restart command through `sh -c`, its output going to ours, within `secs`.
fn run_restart(cmd: &str, secs: u64) -> Result<(), Error> {
    let spawn_error = |source| Error::RestartSpawn {
        cmd: cmd.into(),
        source,
    };
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .spawn()
        .map_err(spawn_error)?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match child.try_wait().map_err(spawn_error)? {
            Some(st) if st.success() => return Ok(()),
            Some(st) => {
                return Err(Error::RestartFailed {
                    cmd: cmd.into(),
                    status: st.to_string(),
                })
            }
            None if Instant::now() >= deadline => {
                // Best effort: report the timeout whether or not the kill lands.
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::RestartTimeout {
                    cmd: cmd.into(),
                    secs,
                });
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
