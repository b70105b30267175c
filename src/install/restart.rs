//! Step 4 of the install: containerd restarted (`--restart-cmd`, through `sh -c`, within
//! `--restart-timeout-secs`) only when its config changed or an earlier run's restart is still
//! owed; the marker of an owed restart goes once the restart succeeds.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::host;
use super::plan::ContainerdPlan;
use super::{Error, InstallOpts, Report};

/// Restarts containerd when `plan` says it must (or says why not).
pub(super) fn restart_if_owed(
    plan: &ContainerdPlan,
    restart: bool,
    opts: &InstallOpts,
    report: &mut Report,
) -> Result<(), Error> {
    if !plan.changed && !plan.pending {
        report.line("containerd: not restarted (config unchanged)");
    } else if !restart {
        report.line(
            "containerd: NOT restarted (--restart-cmd is empty): restart it to load the runsc \
             handler",
        );
    } else if report.dry() {
        report.line(format!(
            "containerd: would restart (`{}`)",
            opts.restart_cmd
        ));
    } else {
        report.line(format!(
            "containerd: restarting (`{}`){}",
            opts.restart_cmd,
            if plan.changed {
                ""
            } else {
                ", owed by an earlier run whose restart failed"
            }
        ));
        run_restart(&opts.restart_cmd, opts.restart_timeout_secs)?;
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
