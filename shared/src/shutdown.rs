//! Waiting for the signals that ask a process to stop.

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C). If the signal handlers cannot be
/// installed it falls back to Ctrl-C alone, and if even that fails it never resolves, so a
/// broken handler never stops a healthy process.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
                    _ = int.recv() => tracing::info!("SIGINT received; shutting down"),
                }
                return;
            }
            (term, int) => {
                tracing::warn!(
                    term_ok = term.is_ok(),
                    int_ok = int.is_ok(),
                    "could not install signal handlers; falling back to Ctrl-C"
                );
            }
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A token cancelled on the first SIGTERM or SIGINT (see [`signal`]). Call it inside a runtime.
pub fn token() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        signal().await;
        cancel.cancel();
    });
    token
}
