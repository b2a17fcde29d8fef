//! Names for running processes.

/// `host:pid:random`: unique per process and readable in tables and logs. The host is
/// [`host_name`]'s.
pub fn instance_id(fallback: &str) -> String {
    let host = host_name(fallback);
    let suffix: u64 = rand::random();
    format!("{host}:{}:{suffix:016x}", std::process::id())
}

/// The machine's (or container's) name: `HOSTNAME` or `/etc/hostname`, falling back to
/// `fallback`.
pub fn host_name(fallback: &str) -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && !h.chars().any(char::is_control))
        .unwrap_or_else(|| fallback.to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_differ_within_one_process() {
        let (a, b) = (super::instance_id("x"), super::instance_id("x"));
        assert_ne!(a, b);
        assert!(a.contains(&format!(":{}:", std::process::id())));
    }
}
