//! Ownership of background tasks: every task a node (or its relay) starts is spawned through
//! one [`Tasks`], which cancels them together and waits for them to finish on shutdown.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A set of background tasks with one cancellation token. Cheap to clone; clones share the
/// tasks and the token.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    token: CancellationToken,
}

impl Tasks {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The token cancelled at shutdown.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// A token cancelled at shutdown or when its owner cancels it (e.g. one sandbox's work).
    pub fn child_token(&self) -> CancellationToken {
        self.token.child_token()
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Spawns `f`, dropped at shutdown (at its next await point). For tasks whose work can be
    /// cut anywhere: loops, watchers, anything recovery finishes after a restart.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_until(self.token.clone(), f)
    }

    /// Spawns `f`, dropped when `token` (a child of this set's, or its own) is cancelled.
    pub fn spawn_until<F>(&self, token: CancellationToken, f: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                _ = token.cancelled() => {}
                _ = f => {}
            }
        })
    }

    /// Spawns `f`, which watches the shutdown token itself and ends in its own time (an exec
    /// that must stop its process and account for it). Shutdown waits for it.
    pub fn spawn_graceful<F, Fut>(&self, f: F) -> tokio::task::JoinHandle<()>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(f(self.token.clone()))
    }

    /// How many tasks are running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Cancels every task and waits up to `timeout` for all of them to end; returns whether
    /// they did. New tasks spawned afterwards are cancelled at once.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        self.token.cancel();
        self.tracker.close();
        tokio::time::timeout(timeout, self.tracker.wait())
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn shutdown_cancels_and_drains() {
        let tasks = Tasks::new();
        tasks.spawn(std::future::pending());
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        tasks.spawn_graceful(|token| async move {
            token.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            f.store(true, Ordering::SeqCst);
        });
        let child = tasks.child_token();
        let per_sandbox = tasks.spawn_until(child.clone(), std::future::pending());
        child.cancel();
        assert!(
            per_sandbox.await.is_ok(),
            "a child token ends its own tasks"
        );
        assert_eq!(tasks.len(), 2);
        assert!(tasks.shutdown(Duration::from_secs(5)).await);
        assert!(
            finished.load(Ordering::SeqCst),
            "graceful tasks finish their work"
        );
        assert!(tasks.is_empty());
        let late = tasks.spawn(std::future::pending());
        assert!(
            late.await.is_ok(),
            "a task spawned after shutdown ends at once"
        );
    }

    #[tokio::test]
    async fn shutdown_gives_up_after_its_timeout() {
        let tasks = Tasks::new();
        tasks.spawn_graceful(|_| std::future::pending());
        assert!(!tasks.shutdown(Duration::from_millis(20)).await);
    }
}
