//! CPU time of processes, as benchmarks report it: user plus system time from
//! `/proc/PID/stat`, in clock ticks (Linux).

use std::io::{Error, Result};
use std::process::Command;

/// utime + stime (fields 14 and 15 of /proc/PID/stat) in clock ticks.
pub fn ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces, so count from its ')'.
    let after_comm = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| Error::other("malformed /proc stat"))?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // `fields[0]` is field 3 (state), so field N is `fields[N - 3]`.
    let field = |n: usize| -> Result<u64> {
        let raw = fields
            .get(n - 3)
            .ok_or_else(|| Error::other("short /proc stat"))?;
        raw.parse().map_err(Error::other)
    };
    Ok(field(14)? + field(15)?)
}

/// CPU ticks of `pid` and its children (PostgreSQL's backends are the postmaster's).
pub fn tree_ticks(pid: u32) -> Result<u64> {
    let mut total = ticks(pid)?;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let parent = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if parent == Some(pid) {
            total += ticks(child).unwrap_or(0);
        }
    }
    Ok(total)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 when it cannot say).
pub fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}
