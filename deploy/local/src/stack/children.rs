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
            self.wait_healthy(index, address, path).await?;
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
            match tokio::time::timeout(Duration::from_secs(2), http_get_status(address, path)).await
            {
                Ok(Ok(200)) => {
                    tracing::info!("{} is ready on http://{address}", running.label);
                    return Ok(());
                }
                Ok(Ok(code)) => last_error = format!("HTTP status {code}"),
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
            tracing::info!("stopping PostgreSQL");
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

/// Sends `GET path` over HTTP/1.1 and returns the response's status code.
pub async fn http_get_status(address: SocketAddr, path: &str) -> io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(256);
    let mut chunk = [0_u8; 256];
    while !response.windows(2).any(|pair| pair == b"\r\n") && response.len() < 4096 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok(code),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an HTTP response: {status_line:?}"),
        )),
    }
}

#[cfg(test)]
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
}
