//! Starting and stopping the service processes. Start and stop are kept together because they
//! are the two halves of one ordering contract ([`ServiceSpec::stop_stage`]): replicas start in
//! table order, each once the one before is healthy, and stop in stages, clients before the
//! services they use, so nothing here may be changed without looking at the other half.

use std::io;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::process::{send_signal, spawn_tied_to_process};

use super::config::ServiceSpec;
use super::{Endpoint, HEALTH_TIMEOUT, POLL_INTERVAL, RunningChild, STOP_GRACE, Signals, Stack};

impl Stack {
    pub(super) async fn start_replica(
        &mut self,
        service: &ServiceSpec,
        binary: &Path,
        replica: u16,
    ) -> anyhow::Result<()> {
        let label = if service.replicas > 1 {
            format!("{}#{}", service.binary, replica + 1)
        } else {
            service.binary.to_owned()
        };
        let mut command = Command::new(binary);
        command
            .args(&service.args)
            .envs(service.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            // Own process group: Ctrl-C reaches only the runner, which then
            // stops the children in order.
            .process_group(0);
        let address = match &service.listen {
            Some(listen) => {
                let address = listen.address(replica).with_context(|| {
                    format!(
                        "{label}: port {} + {replica} is out of range",
                        listen.base_port
                    )
                })?;
                command.env(listen.env_var, address.to_string());
                Some((address, listen.health_path))
            }
            None => None,
        };
        if let Some((address, _)) = address {
            refuse_taken(&label, address, service.listen.map(|l| l.flag))?;
        }
        tracing::info!("starting {label}");
        // SIGTERM reaches the child even if the runner itself is killed.
        let child = spawn_tied_to_process(command, Signal::SIGTERM)
            .with_context(|| format!("could not start {}", binary.display()))?;
        let index = self.children.len();
        self.children.push(RunningChild {
            label: label.clone(),
            child,
            stop_stage: service.stop_stage,
        });
        if let Some((address, path)) = address {
            let flag = service.listen.map(|listen| listen.flag);
            self.wait_healthy(index, address, path, flag).await?;
            self.endpoints.push(Endpoint {
                label,
                url: format!("http://{address}"),
            });
        }
        Ok(())
    }

    pub(super) async fn wait_healthy(
        &mut self,
        index: usize,
        address: SocketAddr,
        path: &str,
        flag: Option<&str>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        let mut last_error;
        loop {
            let running = &mut self.children[index];
            if let Some(status) = running.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before answering GET http://{address}{path}; see its output above",
                    running.label
                );
            }
            match tokio::time::timeout(Duration::from_secs(2), http_get(address, path)).await {
                // Ready only when the answer names this child: a stranger answering on the port
                // (our child then failed to bind, and is about to exit) is no readiness of ours.
                Ok(Ok((200, body))) => match answering_pid(&body) {
                    Some(pid) if pid == running.child.id() => {
                        tracing::info!("{} is ready on http://{address}", running.label);
                        return Ok(());
                    }
                    other => bail!(
                        "another process answers GET http://{address}{path} (pid {}), not the {} \
                         this launcher started (pid {}): {}",
                        other.map_or_else(|| "not given".to_owned(), |pid| pid.to_string()),
                        running.label,
                        running.child.id(),
                        free_or_choose(address, flag)
                    ),
                },
                Ok(Ok((code, _))) => last_error = format!("HTTP status {code}"),
                Ok(Err(error)) => last_error = error.to_string(),
                Err(_) => last_error = "no answer within 2 s".to_owned(),
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not answer GET http://{address}{path} with 200 within {} s (last: {last_error})",
                    running.label,
                    HEALTH_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until a child exits or the private PostgreSQL stops.
    pub(super) async fn wait_for_exit(&mut self) -> (String, String) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        loop {
            tick.tick().await;
            for running in &mut self.children {
                match running.child.try_wait() {
                    Ok(None) => {}
                    Ok(Some(status)) => return (running.label.clone(), status.to_string()),
                    Err(error) => {
                        return (
                            running.label.clone(),
                            format!("could not wait for it: {error}"),
                        );
                    }
                }
            }
            if let Some(pg) = &self.postgres
                && pg.pid().is_none()
            {
                return (
                    "PostgreSQL".to_owned(),
                    format!("see {}", pg.log_path().display()),
                );
            }
        }
    }

    /// Stops the children stage by stage (see [`ServiceSpec::stop_stage`]): `SIGTERM` to a
    /// stage's processes, `SIGKILL` to those still there after [`STOP_GRACE`] (or to every
    /// process left at once on a second Ctrl-C), then the next stage; then stops the private
    /// PostgreSQL.
    pub(super) async fn shutdown(&mut self, signals: &mut Signals) {
        let mut stages: Vec<u8> = self.children.iter().map(|c| c.stop_stage).collect();
        stages.sort_unstable();
        stages.dedup();
        let mut hurry: Option<String> = None;
        for stage in stages {
            let (mut now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.children)
                .into_iter()
                .partition(|running| running.stop_stage == stage);
            self.children = later;
            if let Some(reason) = &hurry {
                kill_all(&mut now, reason);
                continue;
            }
            hurry = stop_together(&mut now, signals).await;
        }
        if let Some(pg) = self.postgres.take() {
            tracing::info!(
                "stopping PostgreSQL (with a checkpoint, so that its next start recovers nothing)"
            );
            match tokio::task::spawn_blocking(move || pg.stop()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!("{error}"),
                Err(error) => tracing::error!(%error, "the PostgreSQL stop task failed"),
            }
        }
    }
}

/// `SIGTERM` to each of `children`, then waits until all have exited; `SIGKILL` to those still
/// there after [`STOP_GRACE`]. A second Ctrl-C kills them at once, and the returned reason
/// says so: the caller kills the rest without waiting.
pub(super) async fn stop_together(
    children: &mut Vec<RunningChild>,
    signals: &mut Signals,
) -> Option<String> {
    for running in children.iter_mut() {
        if matches!(running.child.try_wait(), Ok(None)) {
            tracing::info!("stopping {} (pid {})", running.label, running.child.id());
            if let Err(error) = send_signal(running.child.id(), Signal::SIGTERM) {
                tracing::warn!(%error, "could not send SIGTERM to {}", running.label);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    loop {
        children.retain_mut(|running| matches!(running.child.try_wait(), Ok(None)));
        if children.is_empty() {
            return None;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL_INTERVAL) => {
                if tokio::time::Instant::now() >= deadline {
                    kill_all(children, &format!("did not stop within {} s", STOP_GRACE.as_secs()));
                    return None;
                }
            }
            name = signals.recv() => {
                let reason = format!("still running after a second {name}");
                kill_all(children, &reason);
                return Some(reason);
            }
        }
    }
}

pub(super) fn kill_all(children: &mut Vec<RunningChild>, reason: &str) {
    for running in children.iter_mut() {
        if matches!(running.child.try_wait(), Ok(None)) {
            tracing::warn!("{} {reason}; killing it", running.label);
            let _ = running.child.kill();
        }
        let _ = running.child.wait();
    }
    children.clear();
}

/// Fails when a port any replica of `services` is to listen on is taken (see [`refuse_taken`]).
pub(super) fn refuse_taken_ports(services: &[ServiceSpec]) -> anyhow::Result<()> {
    for service in services {
        let Some(listen) = service.listen else {
            continue;
        };
        for replica in 0..service.replicas {
            if let Some(address) = listen.address(replica) {
                refuse_taken(service.binary, address, Some(listen.flag))?;
            }
        }
    }
    Ok(())
}

/// Fails at once, before anything is started on it, when `address` is taken: a process of
/// ours would fail to bind, and the answers on the port would be another's.
fn refuse_taken(label: &str, address: SocketAddr, flag: Option<&str>) -> anyhow::Result<()> {
    match std::net::TcpListener::bind(address) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => bail!(
            "{label} cannot listen on {address}: another process holds the port. {}",
            free_or_choose(address, flag)
        ),
        Err(error) => Err(error).with_context(|| format!("{label}: checking {address}")),
    }
}

/// What to do about a port another process holds: the command that shows it (to stop it), or
/// the flag that picks another port.
fn free_or_choose(address: SocketAddr, flag: Option<&str>) -> String {
    let port = address.port();
    let see = format!("see who holds it with `ss -ltnp 'sport = :{port}'` and stop it");
    match flag {
        Some(flag) => format!("{see}, or choose another port with `{flag} PORT`"),
        None => see,
    }
}

/// The `pid` a health answer names, if it is the JSON body a Leasehold process gives.
fn answering_pid(body: &str) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    u32::try_from(value.get("pid")?.as_u64()?).ok()
}

/// Sends `GET path` over HTTP/1.1 and returns the response's status code.
pub async fn http_get_status(address: SocketAddr, path: &str) -> io::Result<u16> {
    http_get(address, path).await.map(|(status, _)| status)
}

/// Sends `GET path` over HTTP/1.1 (`Connection: close`) and returns the response's status
/// code and its body (at most 64 KiB of it; a health answer is a few bytes, unchunked).
pub async fn http_get(address: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(512);
    let mut chunk = [0_u8; 1024];
    while response.len() < 64 * 1024 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok((code, body)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an HTTP response: {status_line:?}"),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_check_reads_the_status_code() -> io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let server = tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut socket, _) = listener.accept().await?;
                let mut buffer = [0_u8; 1024];
                let _ = socket.read(&mut buffer).await?;
                socket
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await?;
            }
            io::Result::Ok(())
        });
        assert_eq!(http_get_status(address, "/healthz").await?, 200);
        assert_eq!(http_get_status(address, "/healthz").await?, 503);
        server.await.map_err(io::Error::other)??;
        Ok(())
    }

    /// A server on a port of its own that answers every request 200 with `body`.
    async fn answering(body: String) -> io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buffer = [0_u8; 1024];
                let _ = socket.read(&mut buffer).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        Ok(address)
    }

    /// A stack whose one child is a process that listens nowhere (as a service that failed
    /// to bind, before it exits).
    fn with_silent_child() -> Stack {
        let mut stack = Stack::default();
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        stack.children.push(RunningChild {
            label: "lease-service".to_owned(),
            child,
            stop_stage: 0,
        });
        stack
    }

    /// Readiness is the child's own answer: a stranger's 200 on the port (our child then
    /// failed to bind) is refused at once, naming the flag that picks another port, where the
    /// launcher used to call the stranger ready and start the rest of the stack against it.
    #[tokio::test]
    async fn a_200_from_another_process_is_not_readiness() -> io::Result<()> {
        let stranger = answering(r#"{"status":"ready","pid":1}"#.to_owned()).await?;
        let mut stack = with_silent_child();
        let refusal = stack
            .wait_healthy(0, stranger, "/readyz", Some("--lease-service-port"))
            .await
            .unwrap_err()
            .to_string();
        assert!(refusal.contains("another process answers"), "{refusal}");
        assert!(refusal.contains("--lease-service-port PORT"), "{refusal}");
        let anonymous = answering(r#"{"status":"ok"}"#.to_owned()).await?;
        assert!(
            stack
                .wait_healthy(0, anonymous, "/healthz", None)
                .await
                .is_err()
        );

        let pid = stack.children[0].child.id();
        let own = answering(format!(r#"{{"status":"ready","pid":{pid}}}"#)).await?;
        stack.wait_healthy(0, own, "/readyz", None).await.unwrap();
        kill_all(&mut stack.children, "test over");
        Ok(())
    }

    #[test]
    fn only_an_answer_naming_a_pid_names_one() {
        assert_eq!(answering_pid(r#"{"status":"ok","pid":42}"#), Some(42));
        assert_eq!(answering_pid(r#"{"status":"ok"}"#), None);
        assert_eq!(answering_pid("ok"), None);
    }

    #[test]
    fn a_taken_port_is_refused_naming_the_flag_to_choose_another() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap();
        let refusal = refuse_taken("lease-service", address, Some("--lease-service-port"))
            .unwrap_err()
            .to_string();
        assert!(refusal.contains("--lease-service-port PORT"), "{refusal}");
        assert!(
            refusal.contains(&format!("sport = :{}", address.port())),
            "{refusal}"
        );
        drop(taken);
        refuse_taken("lease-service", address, None).unwrap();
    }
}
