//! The helpers every sandbox mounts read-only at `/.compute`: a static busybox (the init when
//! there is no agent, and the exec launcher) and the static in-sandbox agent.

use std::path::PathBuf;

use tracing::warn;

use super::Node;
use crate::config::Config;

/// Copies the init helper into `<state_dir>/helpers` (when configured and present) and returns
/// that directory.
pub(super) fn install(cfg: &Config) -> Option<PathBuf> {
    if cfg.init_helper.as_os_str().is_empty() || !cfg.init_helper.is_file() {
        return None;
    }
    let dir = cfg.state_dir.join("helpers");
    let dst = dir.join("busybox");
    let same = std::fs::read(&dst).ok() == std::fs::read(&cfg.init_helper).ok();
    if !same {
        let tmp = dir.join("busybox.tmp");
        let res = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::copy(&cfg.init_helper, &tmp))
            .and_then(|_| std::fs::rename(&tmp, &dst));
        if let Err(e) = res {
            warn!(error = %e, "could not install the init helper; using the image's /bin/sh");
            return None;
        }
    }
    if cfg.agent {
        let src = if cfg.agent_binary.as_os_str().is_empty() {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("sandbox-agent")))
                .unwrap_or_default()
        } else {
            cfg.agent_binary.clone()
        };
        let dst = dir.join("sandbox-agent");
        match std::fs::read(&src) {
            Err(e) => {
                warn!(error = %e, src = %src.display(), "no sandbox-agent; execs use containerd exec")
            }
            Ok(bin) if elf_interpreter(&bin) => warn!(
                src = %src.display(),
                "sandbox-agent is dynamically linked: it runs only in images with a compatible glibc \
                 (build it with scripts/build-agent)"
            ),
            Ok(_) => {}
        }
        if std::fs::read(&dst).ok() != std::fs::read(&src).ok() {
            let tmp = dir.join("sandbox-agent.tmp");
            if let Err(e) = std::fs::copy(&src, &tmp).and_then(|_| std::fs::rename(&tmp, &dst)) {
                warn!(error = %e, src = %src.display(), "could not install sandbox-agent; execs use containerd");
            }
        }
    }
    Some(dir)
}

/// Whether an ELF64 executable names a program interpreter (is dynamically linked).
pub fn elf_interpreter(bin: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| bin.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        bin.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bin.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if !bin.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(size), Some(num)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..usize::from(num)).any(|i| u32_at(phoff as usize + i * usize::from(size)) == Some(PT_INTERP))
}

impl Node {
    /// Whether sandboxes run the agent as init.
    pub fn agent_enabled(&self) -> bool {
        self.config().agent
            && self
                .inner
                .helpers_dir
                .as_ref()
                .is_some_and(|d| d.join("sandbox-agent").is_file())
    }

    /// Where the static agent binary that every sandbox mounts lives on the host.
    pub fn agent_path(&self) -> PathBuf {
        self.inner
            .helpers_dir
            .as_ref()
            .map(|d| d.join("sandbox-agent"))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_executables_are_told_apart() {
        // This test binary is dynamically linked; the static agent is checked by scripts/build-agent
        // and tests/agent.rs.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(elf_interpreter(&me));
        assert!(!elf_interpreter(b"#!/bin/sh\n"));
        let mut fake = me[..64].to_vec();
        fake[0x38] = 0; // no program headers
        fake[0x39] = 0;
        assert!(!elf_interpreter(&fake));
    }
}
