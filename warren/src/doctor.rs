//! `warren doctor`: what this host's kernel offers warren, and what warren would need to weaken.
//!
//! Every check reads the kernel's own answer (a syscall, a /proc or /sys file), never a version
//! number guessed into a feature.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use warren_jail::kernel_features::landlock_abi;

/// What the rlimit fallback does not hold, said where cgroup v2 is missing.
/// What limits hold without cgroup v2 (docs/gaps.md, "Limits without cgroup v2").
const CGROUP_FALLBACK: &str = "limits are rlimits: pids= holds per namespace subtree (one uid, \
    RLIMIT_NPROC, its shell commands under a second uid with the same count), mem= and cpu= per \
    process only (a subtree's memory is bounded by pids × mem, not the namespace's memory), wall= \
    by a kill; a subtree ends with its root by nsd's kill, not cgroup.kill (docs/gaps.md, \
    \"Limits without cgroup v2\")";

#[derive(Serialize)]
struct Check {
    name: &'static str,
    /// "ok", "missing" or "info".
    state: &'static str,
    detail: String,
    /// What warren does without it.
    consequence: &'static str,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn filesystems() -> String {
    read("/proc/filesystems").unwrap_or_default()
}

fn has_fs(name: &str) -> bool {
    filesystems()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name))
}

/// When warren is up here: whether each daemon it runs answers and does its job (the same
/// questions `warren status` asks), and why one does not.
fn daemons_check(dirs: &warren_daemon::Dirs) -> Result<Option<Check>> {
    if !warren_supervisor::supervisor_running(dirs) {
        return Ok(None);
    }
    let reports: Vec<warren_supervisor::DaemonReport> = warren_supervisor::daemon_reports(dirs)?
        .into_iter()
        .filter(|r| r.state != "not started by warren up")
        .collect();
    let broken: Vec<String> = reports
        .iter()
        .filter(|r| !r.works)
        .map(|r| format!("{} {}: {}", r.name, r.state, r.why.as_deref().unwrap_or("")))
        .collect();
    Ok(Some(Check {
        name: "daemons",
        state: if broken.is_empty() { "ok" } else { "missing" },
        detail: if broken.is_empty() {
            let up: Vec<&str> = reports.iter().map(|r| r.name).collect();
            format!("up and working: {}", up.join(", "))
        } else {
            broken.join("; ")
        },
        consequence: "a daemon that is down refuses its clients at once (its sockets are closed) \
                      until the supervisor's next try brings it back; a receiptd that cannot \
                      sign has every call denied",
    }))
}

fn checks() -> Vec<Check> {
    let mut out = Vec::new();
    let ns_missing: Vec<&str> = ["mnt", "pid", "net", "ipc", "uts", "cgroup", "user"]
        .into_iter()
        .filter(|n| !Path::new(&format!("/proc/self/ns/{n}")).exists())
        .collect();
    out.push(Check {
        name: "namespaces",
        state: if ns_missing.is_empty() {
            "ok"
        } else {
            "missing"
        },
        detail: if ns_missing.is_empty() {
            "mount, pid, net, ipc, uts, cgroup, user".into()
        } else {
            format!("missing: {}", ns_missing.join(", "))
        },
        consequence: "warren run refuses: a namespace is the sandbox",
    });
    let abi = landlock_abi();
    out.push(Check {
        name: "landlock",
        state: match abi {
            Some(a) if a >= 1 => "ok",
            _ => "missing",
        },
        detail: match abi {
            Some(a) => format!(
                "ABI {a}{}",
                if a >= 6 {
                    " (filesystem, TCP, scopes)"
                } else if a >= 4 {
                    " (filesystem, TCP)"
                } else {
                    " (filesystem)"
                }
            ),
            None => "not enabled (add landlock to the lsm= boot parameter)".into(),
        },
        consequence: "warren run refuses unless --weaker-landlock, which the boot receipt records",
    });
    let actions = read("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    out.push(Check {
        name: "seccomp",
        state: if actions.contains("errno") && actions.contains("kill_process") {
            "ok"
        } else {
            "missing"
        },
        detail: if actions.is_empty() {
            "no seccomp filter support".into()
        } else {
            format!("actions: {actions}")
        },
        consequence: "warren run refuses: the syscall filter is part of every namespace",
    });
    let fuse = Path::new("/dev/fuse").exists() && has_fs("fuse");
    out.push(Check {
        name: "fuse",
        state: if fuse { "ok" } else { "missing" },
        detail: if fuse {
            "/dev/fuse and the fuse filesystem".into()
        } else {
            "no /dev/fuse or fuse filesystem".into()
        },
        consequence: "no 9P mounts inside namespaces on a kernel without v9fs",
    });
    let timeout = read("/proc/sys/fs/fuse/max_request_timeout");
    out.push(Check {
        name: "fuse request timeout",
        state: "info",
        detail: match &timeout {
            Some(t) => format!("fs.fuse.max_request_timeout = {t}"),
            None => "the kernel has no FUSE request timeout (before 6.14)".into(),
        },
        consequence: "the bridge bounds every call itself; this is only a last-resort watchdog",
    });
    let v9fs = has_fs("9p");
    out.push(Check {
        name: "v9fs",
        state: if v9fs { "ok" } else { "info" },
        detail: if v9fs {
            "the kernel's 9P client is loaded".into()
        } else {
            "no kernel 9P client: mounts go through the FUSE bridge".into()
        },
        consequence: "none: FUSE is the mount path that must work",
    });
    let cg2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let subtree = read("/sys/fs/cgroup/cgroup.subtree_control").unwrap_or_default();
    let delegated = ["pids", "memory"]
        .iter()
        .all(|c| subtree.split_whitespace().any(|s| s == *c))
        || read("/sys/fs/cgroup/cgroup.controllers").is_some_and(|c| {
            ["pids", "memory"]
                .iter()
                .all(|w| c.split_whitespace().any(|s| s == *w))
        });
    let usable = cg2 && delegated && warren_ns::confine::limits::cgroup2_available();
    let v1: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("tasks").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.push(Check {
        name: "cgroup v2",
        state: if usable { "ok" } else { "missing" },
        detail: match (cg2, v1.is_empty()) {
            (true, _) => format!("controllers available to warren: {subtree}"),
            (false, false) => format!(
                "cgroup v1 only at /sys/fs/cgroup ({}): not used",
                v1.join(", ")
            ),
            (false, true) => "no cgroup v2 at /sys/fs/cgroup".into(),
        },
        consequence: CGROUP_FALLBACK,
    });
    let apparmor = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    out.push(Check {
        name: "apparmor userns",
        state: "info",
        detail: match apparmor.as_deref() {
            Some("1") => "Ubuntu's apparmor_restrict_unprivileged_userns = 1".into(),
            Some(v) => format!("apparmor_restrict_unprivileged_userns = {v}"),
            None => "no AppArmor user-namespace restriction".into(),
        },
        consequence: "none while nsd runs as root; matters for a future unprivileged nsd",
    });
    let root = nix::unistd::geteuid().is_root();
    out.push(Check {
        name: "privilege",
        state: if root { "ok" } else { "missing" },
        detail: if root {
            "running as root".into()
        } else {
            "not root".into()
        },
        consequence: "warren up needs root in this version",
    });
    out
}

/// The last line: whether warren runs here, and if it does with something missing, what.
fn summary(checks: &[Check], required_missing: &[&str], fuse_and_9p_missing: bool) -> String {
    if !required_missing.is_empty() || fuse_and_9p_missing {
        let mut missing = required_missing.to_vec();
        if fuse_and_9p_missing {
            missing.push("fuse (and no kernel 9P client)");
        }
        return format!("warren cannot run here: missing {}.", missing.join(", "));
    }
    let weaker: Vec<&str> = checks
        .iter()
        .filter(|c| c.state == "missing")
        .map(|c| c.name)
        .collect();
    if weaker.is_empty() {
        "warren can run here, with every protection it has in force.".into()
    } else {
        format!(
            "warren can run here, but not everything holds: without {} (the arrow above says what the fallback does not hold).",
            weaker.join(", ")
        )
    }
}

pub fn doctor(dirs: &warren_daemon::Dirs, json: bool) -> Result<ExitCode> {
    let mut checks = checks();
    checks.extend(daemons_check(dirs)?);
    // Daemons that are up but do not work make every call fail: warren does not run here now.
    let required_missing: Vec<&str> = checks
        .iter()
        .filter(|c| {
            c.state == "missing"
                && matches!(
                    c.name,
                    "namespaces" | "landlock" | "seccomp" | "privilege" | "daemons"
                )
        })
        .map(|c| c.name)
        .collect();
    let fuse_and_9p_missing = checks
        .iter()
        .any(|c| c.name == "fuse" && c.state == "missing")
        && !has_fs("9p");
    if json {
        println!(
            "{}",
            serde_json::json!({
                "checks": checks,
                "ready": required_missing.is_empty() && !fuse_and_9p_missing,
                "weaker_mode_needed": checks.iter().any(|c| c.name == "landlock" && c.state == "missing"),
            })
        );
    } else {
        for c in &checks {
            println!("{:<22} {:<8} {}", c.name, c.state, c.detail);
            if c.state == "missing" {
                println!("{:<22} {:<8} → {}", "", "", c.consequence);
            }
        }
        println!(
            "\n{}",
            summary(&checks, &required_missing, fuse_and_9p_missing)
        );
    }
    Ok(if required_missing.is_empty() && !fuse_and_9p_missing {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &'static str, state: &'static str) -> Check {
        Check {
            name,
            state,
            detail: String::new(),
            consequence: if name == "cgroup v2" {
                CGROUP_FALLBACK
            } else {
                "-"
            },
        }
    }

    /// Without cgroup v2 the summary never says "no weaker mode": it names what is missing, and
    /// the fallback's line says what it does not hold.
    #[test]
    fn a_missing_cgroup_is_said_with_what_the_fallback_does_not_hold() {
        let checks = [check("landlock", "ok"), check("cgroup v2", "missing")];
        let said = summary(&checks, &[], false);
        assert!(!said.contains("no weaker mode"), "{said}");
        assert!(
            said.contains("not everything holds: without cgroup v2"),
            "{said}"
        );
        for held_not in [
            "not the namespace's memory",
            "per process only",
            "not cgroup.kill",
        ] {
            assert!(CGROUP_FALLBACK.contains(held_not), "{held_not}");
        }
        let all = summary(&[check("landlock", "ok")], &[], false);
        assert_eq!(
            all,
            "warren can run here, with every protection it has in force."
        );
        let cannot = summary(&checks, &["landlock"], false);
        assert_eq!(cannot, "warren cannot run here: missing landlock.");
    }
}
