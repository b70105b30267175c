//! Bounded exec output: the daemon holds at most a fixed window of one exec's output, however
//! slowly its client reads.
//!
//! A [`Window`] counts the bytes of one exec that the daemon has taken from its producer and
//! that have not yet left for the client. Every chunk carries a [`Hold`] on its window; the
//! hold is dropped where the chunk leaves (the gRPC response stream takes it), which gives its
//! bytes back:
//!
//! * to the in-sandbox agent as credit (`frame::Flow`), when the producer is an agent: the agent
//!   reads the process's pipes only while it has credit, so a stalled client blocks the
//!   process on its write and the daemon holds at most the window;
//! * to the containerd exec's FIFO readers, which wait for [`Window::room`] before each read.
//!
//! An external relay worker cannot be paused by sandbox.v1: the relay ends its exec once the
//! window is over ([`Window::is_over`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use crate::relay::frame::Flow;
use crate::relay::ToAgent;

/// Default per-exec window.
pub const DEFAULT_WINDOW: usize = 1 << 20;

/// Credit is sent back in batches of at least this much of the window (a frame per chunk
/// would cost the agent a read per chunk for nothing).
const CREDIT_BATCH_DIVISOR: usize = 8;

/// The output window of one exec.
#[derive(Debug)]
pub struct Window {
    limit: usize,
    held: AtomicUsize,
    room: Notify,
    credit: Option<Credit>,
}

#[derive(Debug)]
struct Credit {
    req_id: u64,
    tx: mpsc::UnboundedSender<ToAgent>,
    unsent: AtomicUsize,
    batch: usize,
}

impl Window {
    /// A window of `limit` bytes whose producer waits for [`Window::room`].
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            held: AtomicUsize::new(0),
            room: Notify::new(),
            credit: None,
        })
    }

    /// A window of `limit` bytes whose producer (an agent's exec `req_id`) is paced by the
    /// credit sent on `tx`.
    pub fn with_credit(limit: usize, req_id: u64, tx: mpsc::UnboundedSender<ToAgent>) -> Arc<Self> {
        let limit = limit.max(1);
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
            room: Notify::new(),
            credit: Some(Credit {
                req_id,
                tx,
                unsent: AtomicUsize::new(0),
                batch: (limit / CREDIT_BATCH_DIVISOR).max(1),
            }),
        })
    }

    /// The window's size.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Whether more than the window is held (a producer that does not honour it).
    pub fn is_over(&self) -> bool {
        self.held() > self.limit
    }

    /// Counts `n` more bytes as held until the returned hold is dropped.
    pub fn hold(self: &Arc<Self>, n: usize) -> Hold {
        self.held.fetch_add(n, Ordering::AcqRel);
        Hold(Some((self.clone(), n)))
    }

    /// Waits until less than the window is held.
    pub async fn room(&self) {
        loop {
            let freed = self.room.notified();
            if self.held() < self.limit {
                return;
            }
            freed.await;
        }
    }

    fn release(&self, n: usize) {
        let before = self.held.fetch_sub(n, Ordering::AcqRel);
        if before >= self.limit && before - n < self.limit {
            self.room.notify_waiters();
        }
        if let Some(c) = &self.credit {
            let unsent = c.unsent.fetch_add(n, Ordering::AcqRel) + n;
            if unsent >= c.batch {
                let credit = c.unsent.swap(0, Ordering::AcqRel);
                if credit > 0 {
                    let _ = c.tx.send(ToAgent::Flow(Flow {
                        req_id: c.req_id,
                        credit: credit as u64,
                        window: 0,
                    }));
                }
            }
        }
    }
}

/// Bytes held in a window until this is dropped (or none).
#[derive(Debug, Default)]
pub struct Hold(Option<(Arc<Window>, usize)>);

impl Hold {
    /// A hold on nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |(_, n)| *n)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some((w, n)) = self.0.take() {
            w.release(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_count_until_dropped_and_room_waits_for_them() {
        let w = Window::new(100);
        let a = w.hold(60);
        let b = w.hold(40);
        assert_eq!(w.held(), 100);
        assert!(!w.is_over());
        let waiter = {
            let w = w.clone();
            tokio::spawn(async move { w.room().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a full window has no room");
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("room once bytes leave")
            .unwrap();
        let c = w.hold(70);
        assert!(w.is_over());
        drop((b, c));
        assert_eq!(w.held(), 0);
        assert_eq!(Hold::none().bytes(), 0);
    }

    #[tokio::test]
    async fn credit_goes_back_in_batches_of_an_eighth() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let w = Window::with_credit(800, 7, tx);
        let holds: Vec<Hold> = (0..8).map(|_| w.hold(50)).collect();
        let mut it = holds.into_iter();
        drop(it.next());
        assert!(rx.try_recv().is_err(), "50 bytes: under a batch of 100");
        drop(it.next());
        assert_eq!(
            rx.try_recv().unwrap(),
            ToAgent::Flow(Flow {
                req_id: 7,
                credit: 100,
                window: 0
            })
        );
        drop(it);
        let total: u64 = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|f| match f {
                ToAgent::Flow(f) => f.credit,
                other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(total, 300, "everything taken is credited back");
        assert_eq!(w.held(), 0);
    }
}
