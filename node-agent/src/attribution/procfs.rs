//! What `/proc` and `/etc/passwd` tell of a process: its command, its user, and the pod and container its
//! cgroup places it in.

use std::collections::HashMap;
use std::path::Path;

/// The pod and container a process's cgroup places it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPod {
    /// The pod's UID (dashes, as the API server writes it).
    pub pod_uid: String,
    /// The container's id (64 hex digits, as in `containerStatuses[].containerID` after the runtime prefix),
    /// where the cgroup path names one.
    pub container_id: Option<String>,
}

/// Where a process sits, from its cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In a pod's cgroup.
    Pod(CgroupPod),
    /// In no pod's cgroup: a process of the host (or of a container outside Kubernetes).
    Host,
}

/// The pod a cgroup file (`/proc/<pid>/cgroup`, v1 or v2) places its process in. Both of the kubelet's cgroup
/// drivers are read:
///
/// - systemd: `.../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope` (also `crio-<id>.scope`,
///   `docker-<id>.scope`);
/// - cgroupfs: `/kubepods/burstable/pod<uid>/<id>`.
pub fn parse_cgroup(text: &str) -> Placement {
    for line in text.lines() {
        // `hierarchy-id:controllers:path`; the path may itself hold colons.
        let Some(path) = line.splitn(3, ':').nth(2) else { continue };
        if let Some(found) = pod_of_path(path) {
            return Placement::Pod(found);
        }
    }
    Placement::Host
}

fn pod_of_path(path: &str) -> Option<CgroupPod> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let at = parts.iter().position(|p| pod_uid_of(p).is_some())?;
    let pod_uid = pod_uid_of(parts[at])?;
    // A path relative to the reader's own cgroup namespace (`/../../pod<uid>/<id>`, as a containerised agent on
    // cgroup v2 sees other pods) has no `kubepods` left above the pod: its `..` say it is outside the reader's.
    let relative = parts[..at].contains(&"..");
    if !relative && !parts[..at].iter().any(|p| p.starts_with("kubepods")) && !parts[at].starts_with("kubepods") {
        return None;
    }
    let container_id = parts.get(at + 1).and_then(|c| container_id_of(c));
    Some(CgroupPod { pod_uid, container_id })
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    if at > 0 && !part[..at].ends_with('-') {
        return None;
    }
    let uid = part[at + 3..].replace('_', "-");
    let hex = uid.chars().filter(|c| *c != '-').count();
    (hex == 32 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && uid.matches('-').count() == 4)
        .then_some(uid)
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` or a bare `<id>`.
fn container_id_of(part: &str) -> Option<String> {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let id = part.rsplit('-').next()?;
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The real uid of a process, from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
pub fn parse_status_uid(text: &str) -> Option<u32> {
    let line = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// User names by uid, from a passwd file (`name:x:uid:gid:...`).
pub fn parse_passwd(text: &str) -> HashMap<u32, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let uid = f.nth(1)?.parse().ok()?;
            (!name.is_empty()).then(|| (uid, name.to_string()))
        })
        .collect()
}

/// What `/proc/<pid>` tells of one process; `None` when it cannot be read (the process ended, or the agent does
/// not share the host's process namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// `/proc/<pid>/comm`.
    pub command: Option<String>,
    /// The real uid.
    pub uid: Option<u32>,
    /// Where its cgroup places it.
    pub placement: Placement,
}

/// Reads `/proc/<pid>` under `root` (`/proc`, or the host's proc mounted elsewhere).
pub fn read(root: &Path, pid: u32) -> Option<ProcInfo> {
    let dir = root.join(pid.to_string());
    let cgroup = std::fs::read_to_string(dir.join("cgroup")).ok()?;
    let command = std::fs::read_to_string(dir.join("comm")).ok().map(|c| c.trim_end_matches('\n').to_string());
    let uid = std::fs::read_to_string(dir.join("status")).ok().as_deref().and_then(parse_status_uid);
    Some(ProcInfo { command: command.filter(|c| !c.is_empty()), uid, placement: parse_cgroup(&cgroup) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5b1a8e-6c0d-4a7e-9d57-3c2f7d1e9b44";
    const CID: &str = "5d3c0b5e0f4a2c1b9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c";

    #[test]
    fn cgroups_of_both_drivers_and_both_versions_name_the_pod_and_container() {
        let systemd_v2 = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            UID.replace('-', "_")
        );
        let cgroupfs_v1 =
            format!("12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n");
        let guaranteed = format!("0::/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope\n", UID.replace('-', "_"));
        let want = Placement::Pod(CgroupPod { pod_uid: UID.into(), container_id: Some(CID.into()) });
        assert_eq!(parse_cgroup(&systemd_v2), want);
        assert_eq!(parse_cgroup(&cgroupfs_v1), want);
        assert_eq!(parse_cgroup(&guaranteed), want);
        // Relative to a containerised reader's cgroup namespace (cgroup v2): both drivers.
        let relative_cgroupfs = format!("0::/../../pod{UID}/{CID}\n");
        let relative_systemd =
            format!("0::/../../kubepods-besteffort-pod{}.slice/cri-containerd-{CID}.scope\n", UID.replace('-', "_"));
        assert_eq!(parse_cgroup(&relative_cgroupfs), want);
        assert_eq!(parse_cgroup(&relative_systemd), want);
        // The pod's own cgroup (a process the runtime put in no container's): the pod, no container.
        let pod_only = format!("0::/kubepods/pod{UID}\n");
        assert_eq!(parse_cgroup(&pod_only), Placement::Pod(CgroupPod { pod_uid: UID.into(), container_id: None }));
    }

    #[test]
    fn host_processes_and_look_alikes_are_no_pod() {
        for text in [
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/system.slice/docker-0123.scope\n",
            // A pod-like name outside the kubelet's hierarchy.
            &format!("0::/system.slice/pod{UID}.slice\n"),
            // Not a UID.
            "0::/kubepods/burstable/podcast/abc\n",
            "",
        ] {
            assert_eq!(parse_cgroup(text), Placement::Host, "{text}");
        }
    }

    #[test]
    fn status_and_passwd_give_the_user() {
        let status = "Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1001\t1001\t1001\t1001\nGid:\t100\n";
        assert_eq!(parse_status_uid(status), Some(1001));
        assert_eq!(parse_status_uid("Name:\tx\n"), None);
        let passwd = "root:x:0:0:root:/root:/bin/bash\n# comment\nann:x:1001:100::/home/ann:/bin/sh\nbroken\n";
        let users = parse_passwd(passwd);
        assert_eq!(users.get(&1001).map(String::as_str), Some("ann"));
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.len(), 2);
    }
}
