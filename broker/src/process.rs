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

/// The memory limit of this process's cgroup (the least of its own and its
/// ancestors' `memory.max` on cgroup v2, `memory.limit_in_bytes` on v1),
/// `None` when there is none or it cannot be read. Past it the kernel's
/// OOM killer ends the whole process, whichever guest grew.
pub fn cgroup_memory_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |file: &std::path::Path| -> Option<u64> {
        let text = std::fs::read_to_string(file).ok()?;
        // "max" (v2) or a page-rounded i64::MAX (v1): no limit.
        text.trim().parse::<u64>().ok().filter(|&n| n < (1 << 62))
    };
    let mut least: Option<u64> = None;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, file) = match controllers {
            "" => ("/sys/fs/cgroup", "memory.max"),
            c if c.split(',').any(|c| c == "memory") => {
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
            }
            _ => continue,
        };
        // The group and each ancestor up to the mount's root: a parent's
        // limit binds the child too.
        let mut dir = std::path::PathBuf::from(root).join(path.trim_start_matches('/'));
        loop {
            if let Some(n) = read(&dir.join(file)) {
                least = Some(least.map_or(n, |l| l.min(n)));
            }
            if dir.as_os_str().len() <= root.len() || !dir.pop() {
                break;
            }
        }
    }
    least
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
