//! What the process inherited from whoever started it: the CPUs it may run
//! on (its affinity mask: `taskset`, a container's cpuset) and how many
//! descriptors it may open. Shards are counted and placed within the first;
//! the second is raised as far as it may go before anything is opened.

use thiserror::Error;

/// Descriptors the broker opens besides frame-edge connections: listeners,
/// each shard's ring and eventfds, the admin endpoint's connections, the
/// gRPC edge's connections and runtime, router files, stdio. Generous on
/// purpose: running out costs a refused connection, a spare costs nothing.
pub const SPARE_DESCRIPTORS: u64 = 256 + crate::metrics::MAX_ADMIN_CONNECTIONS as u64;
/// Descriptors per shard besides its connections (listener, ring, eventfds).
pub const DESCRIPTORS_PER_SHARD: u64 = 8;

/// The CPUs this process may run on, ascending (its affinity mask as the
/// main thread inherited it). `None` when the mask cannot be read.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    // core_affinity reads the calling thread's mask (sched_getaffinity),
    // which is the inherited one until a shard pins itself.
    let mut ids: Vec<usize> = core_affinity::get_core_ids()?
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    (!ids.is_empty()).then_some(ids)
}

/// The directories of this process's cgroup for `controller`, the group's
/// own first, then each ancestor up to the hierarchy's root (a parent's
/// limit binds the child too): on cgroup v2 under `/sys/fs/cgroup`, on v1
/// under `/sys/fs/cgroup/<controller>`. Each with the file name to read
/// there: `v2_file` or `v1_file`.
fn cgroup_dirs<'a>(
    controller: &str,
    v2_file: &'a str,
    v1_file: &'a str,
) -> Vec<(std::path::PathBuf, &'a str)> {
    let Ok(groups) = std::fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, file) = match controllers {
            "" => ("/sys/fs/cgroup".to_owned(), v2_file),
            c if c.split(',').any(|c| c == controller) => {
                (format!("/sys/fs/cgroup/{controller}"), v1_file)
            }
            _ => continue,
        };
        let mut dir = std::path::PathBuf::from(&root).join(path.trim_start_matches('/'));
        loop {
            dirs.push((dir.clone(), file));
            if dir.as_os_str().len() <= root.len() || !dir.pop() {
                break;
            }
        }
    }
    dirs
}

/// A number in a cgroup file; `None` for "max" (v2), a page-rounded
/// i64::MAX (v1: no limit), or a file that is not there.
fn cgroup_number(file: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.trim().parse::<u64>().ok().filter(|&n| n < (1 << 62))
}

/// The memory limit of this process's cgroup (the least of its own and its
/// ancestors' `memory.max` on cgroup v2, `memory.limit_in_bytes` on v1),
/// `None` when there is none or it cannot be read. Past it the kernel's
/// OOM killer ends the whole process, whichever guest grew.
pub fn cgroup_memory_limit() -> Option<u64> {
    cgroup_dirs("memory", "memory.max", "memory.limit_in_bytes")
        .into_iter()
        .filter_map(|(dir, file)| cgroup_number(&dir.join(file)))
        .min()
}

/// What bounds the threads this process may start: a limit, the tasks
/// already counted against it, and its name for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRoom {
    pub limit: u64,
    pub used: u64,
    pub bound: String,
}

impl ThreadRoom {
    pub fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// The tightest bound on the threads this process may start, if any:
/// `RLIMIT_NPROC` (counted over every task of the real user; root is
/// exempt) or a cgroup's `pids.max` (over the group's tasks, systemd's
/// `TasksMax=`, a container's pids limit). Short of threads, a thread pool
/// fails with its own panic message, not a sentence of ours.
pub fn thread_room() -> Option<ThreadRoom> {
    let mut rooms = Vec::new();
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively
    // borrowed `r`; getuid cannot fail.
    let (got, uid) = unsafe { (libc::getrlimit(libc::RLIMIT_NPROC, &mut r), libc::getuid()) };
    if got == 0 && r.rlim_cur != libc::RLIM_INFINITY && uid != 0 {
        rooms.push(ThreadRoom {
            limit: r.rlim_cur,
            used: user_tasks(std::path::Path::new("/proc"), uid),
            bound: "RLIMIT_NPROC (ulimit -u, systemd's LimitNPROC=)".into(),
        });
    }
    for (dir, file) in cgroup_dirs("pids", "pids.max", "pids.max") {
        if let (Some(limit), Some(used)) = (
            cgroup_number(&dir.join(file)),
            cgroup_number(&dir.join("pids.current")),
        ) {
            rooms.push(ThreadRoom {
                limit,
                used,
                bound: format!(
                    "the pids limit of cgroup {} (systemd's TasksMax=, a container's pids limit)",
                    dir.display()
                ),
            });
        }
    }
    rooms.into_iter().min_by_key(ThreadRoom::left)
}

/// Tasks (threads) of real user `uid` under `proc`, as RLIMIT_NPROC counts
/// them: the `Threads:` of each process whose real `Uid:` is `uid`.
fn user_tasks(proc: &std::path::Path, uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return 0;
    };
    let mut tasks = 0;
    for e in entries.flatten() {
        if !e
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // A process may end between the listing and the read.
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if status_field(&status, "Uid:") == Some(u64::from(uid)) {
            tasks += status_field(&status, "Threads:").unwrap_or(1);
        }
    }
    tasks
}

/// The first number of field `name` ("Uid:", "Threads:") in a
/// `/proc/<pid>/status` text.
fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Threads this process's own `/proc/self/status` counts now.
pub fn own_threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| status_field(&s, "Threads:"))
        .unwrap_or(1)
}

/// Where the shards run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Per shard: the CPU it is pinned to, or `None` (not pinned).
    pub cpus: Vec<Option<usize>>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error(
        "broker.cpus: CPU {} {} outside this process's CPU affinity (allowed: {}); \
         start it with those CPUs (taskset, the container's cpuset) or pin within the allowed ones",
        list(.outside), is_are(.outside), list(.allowed)
    )]
    OutsideMask {
        outside: Vec<usize>,
        allowed: Vec<usize>,
    },
}

fn is_are(v: &[usize]) -> &'static str {
    if v.len() == 1 { "is" } else { "are" }
}

fn list(v: &[usize]) -> String {
    v.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Places `shards` shards within `allowed`: explicit `cpus` in order (each
/// must be allowed; shards beyond the list are not pinned), else shard i
/// on the i-th allowed CPU when there are enough of them, else unpinned
/// (more shards than CPUs: the scheduler spreads them better than a fixed
/// double-booking would).
pub fn place(
    shards: usize,
    cpus: &[usize],
    allowed: &[usize],
) -> Result<Placement, PlacementError> {
    if !cpus.is_empty() {
        let mut outside: Vec<usize> = cpus
            .iter()
            .copied()
            .filter(|c| !allowed.contains(c))
            .collect();
        outside.sort_unstable();
        outside.dedup();
        if !outside.is_empty() {
            return Err(PlacementError::OutsideMask {
                outside,
                allowed: allowed.to_vec(),
            });
        }
        return Ok(Placement {
            cpus: (0..shards).map(|i| cpus.get(i).copied()).collect(),
        });
    }
    let fits = shards <= allowed.len();
    Ok(Placement {
        cpus: (0..shards).map(|i| fits.then(|| allowed[i])).collect(),
    })
}

/// The descriptor limit after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft RLIMIT_NOFILE to the hard one (the usual soft 1024 is
/// far below one shard's default 4096 connections; the hard limit is what
/// the operator allows). Returns the limit in effect, or `None` when it
/// cannot be read.
pub fn raise_nofile_limit() -> Option<NofileLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively
    // borrowed `r`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit only reads the `rlimit` it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r = raised;
        } else {
            // An infinite hard limit is above fs.nr_open and refused: keep
            // the soft one, the check below says whether it suffices.
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                soft = r.rlim_cur,
                hard = r.rlim_max,
                "could not raise the open-file limit"
            );
        }
    }
    Some(NofileLimit {
        soft: r.rlim_cur,
        hard: r.rlim_max,
    })
}

/// Descriptors a configuration may need at its connection limits:
/// `per_shard` connections on each shard (the frame and HTTP edges'
/// bounds) and `edge_wide` more (the gRPC edge's, which bounds the whole
/// edge).
pub fn descriptors_needed(shards: usize, per_shard: usize, edge_wide: usize) -> u64 {
    let shards = shards as u64;
    shards
        .saturating_mul((per_shard as u64).saturating_add(DESCRIPTORS_PER_SHARD))
        .saturating_add(edge_wide as u64)
        .saturating_add(SPARE_DESCRIPTORS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_tasks_are_the_threads_of_its_processes_by_real_uid() {
        let proc = tempfile::tempdir().unwrap();
        let status = |pid: &str, uid: &str, threads: &str| {
            let dir = proc.path().join(pid);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(
                dir.join("status"),
                format!("Name:\tx\nUid:\t{uid}\nGid:\t0\t0\t0\t0\nThreads:\t{threads}\n"),
            )
            .unwrap();
        };
        status("1", "0\t0\t0\t0", "1");
        status("20", "1000\t1000\t1000\t1000", "13");
        status("21", "1000\t0\t0\t0", "2");
        // Effective 1000, real 0: RLIMIT_NPROC counts the real user.
        status("22", "0\t1000\t1000\t1000", "7");
        // Not a process.
        std::fs::create_dir(proc.path().join("sys")).unwrap();
        assert_eq!(user_tasks(proc.path(), 1000), 15);
        assert_eq!(user_tasks(proc.path(), 0), 8);
        assert_eq!(user_tasks(proc.path(), 5), 0);
        assert_eq!(user_tasks(&proc.path().join("none"), 1000), 0);
    }

    #[test]
    fn shards_take_the_allowed_cpus_in_order() {
        let p = place(2, &[], &[4, 5]).unwrap();
        assert_eq!(p.cpus, [Some(4), Some(5)]);
        let p = place(1, &[], &[1]).unwrap();
        assert_eq!(p.cpus, [Some(1)]);
        // More shards than CPUs: none pinned.
        let p = place(3, &[], &[4, 5]).unwrap();
        assert_eq!(p.cpus, [None, None, None]);
    }

    #[test]
    fn explicit_cpus_outside_the_mask_are_all_named() {
        let e = place(3, &[0, 5, 7, 0], &[4, 5]).unwrap_err();
        assert_eq!(
            e,
            PlacementError::OutsideMask {
                outside: vec![0, 7],
                allowed: vec![4, 5]
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("CPU 0, 7 are outside"), "{msg}");
        assert!(msg.contains("allowed: 4, 5"), "{msg}");
        let p = place(3, &[5, 4], &[4, 5]).unwrap();
        assert_eq!(p.cpus, [Some(5), Some(4), None]);
    }

    #[test]
    fn descriptor_need_counts_every_shards_connections() {
        assert_eq!(
            descriptors_needed(2, 4096 + 10_000, 10_000),
            2 * (14_096 + DESCRIPTORS_PER_SHARD) + 10_000 + SPARE_DESCRIPTORS
        );
        assert_eq!(descriptors_needed(usize::MAX, usize::MAX, 0), u64::MAX);
    }
}
