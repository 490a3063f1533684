//! Beyond one machine (feature `mpi`): kNN evaluation, its accuracy metrics and a consistent
//! memory bank over MPI.
//!
//! Every rank holds a contiguous shard of the queries and of the references, in rank order;
//! the operations here give each rank the answers a single process would give for its own
//! rows over the concatenation of all shards, bit for bit, while no rank ever holds the whole
//! reference set.
//!
//! **Failures.** Each collective step starts with an agreement: the ranks exchange whether
//! their local part succeeded before any data moves. A rank whose part failed returns its own
//! error and every other rank returns [`Error::RankFailed`] naming the lowest failing rank
//! with its message, so no rank is left waiting in a collective the others never enter. The
//! wait at an agreement is bounded by [`GroupConfig::timeout`] ([`Error::Timeout`]).
//!
//! **Threads.** Only the calling thread makes MPI calls (the native path's worker threads
//! never do): initialise MPI with at least `Threading::Funneled`, as below.
//!
//! # Example
//! ```no_run
//! use wgpu_metric_learning::distributed::mpi::{self, traits::*};
//! use wgpu_metric_learning::distributed::{self, Group, GroupConfig};
//! use wgpu_metric_learning::{ContextConfig, KnnConfig};
//! let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
//!     .expect("MPI initialises once");
//! let group = Group::new(&universe.world(), &GroupConfig::default());
//! let ctx = group.context(&ContextConfig::default())?; // this rank's GPU of its node
//! let (queries, refs) = (ndarray::Array2::<f32>::zeros((100, 8)), ndarray::Array2::<f32>::zeros((1000, 8)));
//! let found = distributed::knn(&group, &ctx, queries.view(), &refs, &KnnConfig::default())?;
//! assert_eq!(found.indices.nrows(), 100); // global reference indices for this rank's queries
//! # Ok::<(), wgpu_metric_learning::Error>(())
//! ```

mod accuracy;
mod bank;
mod knn;

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::request::StaticScope;
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;

use crate::context::{nth_best_adapter, AdapterSelector, BackendChoice, Context, ContextConfig};
use crate::error::{Error, Result};

pub use accuracy::accuracy;
pub use bank::enqueue_global;
pub use knn::knn;
/// The MPI bindings this module is built on (rsmpi), for a matching `initialize` and
/// communicators.
pub use mpi;

/// How a [`Group`] waits for its ranks. Every field has a documented default.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use wgpu_metric_learning::distributed::GroupConfig;
/// let cfg = GroupConfig { timeout: Some(Duration::from_secs(60)), ..Default::default() };
/// assert_eq!(GroupConfig::default().query_block, 2048);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// The longest a rank waits at an agreement for the others, which includes the time they
    /// spend on their local part of the step (one query block's search). `None` waits
    /// forever. Default 10 minutes.
    pub timeout: Option<Duration>,
    /// Queries per block sent to every rank by [`knn`]: the owner of a block holds
    /// `query_block · (d + 2 · ranks · (k + 1)) · 4` bytes of host buffers for it, every
    /// other rank `query_block · (d + 2 · (k + 1)) · 4`. Default 2 048.
    pub query_block: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            timeout: Some(Duration::from_secs(600)),
            query_block: 2048,
        }
    }
}

/// The ranks of an MPI communicator taking part in the distributed operations: a duplicate
/// of the caller's communicator (so that its messages never mix with the caller's), the
/// rank's place on its node, and the wait limit.
///
/// All operations are collective: every rank of the group calls the same ones in the same
/// order.
///
/// See the [module example](self).
pub struct Group {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    cfg: GroupConfig,
    /// Set when a wait timed out: the ranks' collectives are out of step from then on.
    broken: Cell<Option<Duration>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("local_size", &self.local_size)
            .field("cfg", &self.cfg)
            .field("broken", &self.broken.get())
            .finish_non_exhaustive()
    }
}

impl Group {
    /// The group of `comm`'s ranks (collective: every rank of `comm` calls it).
    ///
    /// See the [module example](self).
    pub fn new(comm: &impl Communicator, cfg: &GroupConfig) -> Self {
        let comm = comm.duplicate();
        let (rank, size) = (index(comm.rank()), index(comm.size()));
        // The ranks that share this one's memory: its node.
        let node = comm.split_shared(comm.rank());
        let (local_rank, local_size) = (index(node.rank()), index(node.size()));
        Self {
            comm,
            rank,
            size,
            local_rank,
            local_size,
            cfg: GroupConfig {
                query_block: cfg.query_block.max(1),
                ..cfg.clone()
            },
            broken: Cell::new(None),
        }
    }

    /// This rank, `0 ≤ rank < size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's place among the ranks of its node (those sharing its memory).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The number of ranks on this rank's node.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// This rank's context (collective). With [`AdapterSelector::Best`] and no
    /// `WGPU_ADAPTER_NAME`, the ranks of a node are spread over the adapters of the best kind
    /// present (local rank modulo their number), so that a node with several GPUs uses all of
    /// them; any other choice in `cfg` is taken as it is.
    ///
    /// # Errors
    /// As [`Context::new`] on this rank; [`Error::RankFailed`] when it failed on another.
    pub fn context(&self, cfg: &ContextConfig) -> Result<Context> {
        let mut cfg = cfg.clone();
        let named = std::env::var("WGPU_ADAPTER_NAME").is_ok_and(|n| !n.is_empty());
        if cfg.adapter == AdapterSelector::Best && cfg.backend != BackendChoice::NativeCpu && !named
        {
            if let Some(i) = nth_best_adapter(cfg.wgpu_backends, self.local_rank) {
                cfg.adapter = AdapterSelector::Index(i);
            }
        }
        self.agree("context", Context::new(&cfg))
    }

    /// Makes a local step collective (every rank calls it): the ranks exchange whether their
    /// `local` result is an error. Returns `Ok(local)` on a rank whose step failed (its own
    /// error) and on every rank when all succeeded; otherwise [`Error::RankFailed`], naming
    /// the lowest failed rank with its message. What the library's own operations do before
    /// each step, for a caller's steps (reading a shard of a file, say), so that one rank's
    /// failure ends every rank's run instead of leaving them waiting.
    ///
    /// # Errors
    /// [`Error::RankFailed`] as above; [`Error::Timeout`] when the others do not arrive
    /// within the group's timeout.
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::distributed::{mpi, Group, GroupConfig};
    /// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
    ///     .expect("MPI initialises once");
    /// let group = Group::new(&universe.world(), &GroupConfig::default());
    /// let shard = std::fs::read(format!("shard-{}.bin", group.rank())).map_err(|e| e.to_string());
    /// match group.agree_on("read shards", shard)? {
    ///     Ok(bytes) => println!("{} bytes", bytes.len()),
    ///     Err(mine) => eprintln!("this rank failed: {mine}"),
    /// }
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn agree_on<T, E: std::fmt::Display>(
        &self,
        op: &'static str,
        local: std::result::Result<T, E>,
    ) -> Result<std::result::Result<T, E>> {
        let message = local.as_ref().err().map(ToString::to_string);
        self.verdict(op, message)?;
        Ok(local)
    }

    /// [`Group::agree_on`] for the library's own steps: a failed rank gets its own error,
    /// the others [`Error::RankFailed`].
    pub(crate) fn agree<T>(&self, op: &'static str, local: Result<T>) -> Result<T> {
        let message = local.as_ref().err().map(chain);
        self.verdict(op, message)?;
        local
    }

    /// The exchange behind an agreement: `Err(RankFailed)` when another rank failed and this
    /// one (`message = None`) did not.
    fn verdict(&self, op: &'static str, message: Option<String>) -> Result<()> {
        /// Longest message carried to the other ranks.
        const MAX_MESSAGE: usize = 4096;
        let message = message.map(|mut m| {
            if m.len() > MAX_MESSAGE {
                let mut end = MAX_MESSAGE;
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                m.truncate(end);
            }
            m
        });
        let status = message.as_ref().map_or(0, |m| 1 + m.len() as u64);
        let statuses = self.gather_status(op, status)?;
        let Some(failed) = statuses.iter().position(|&s| s != 0) else {
            return Ok(());
        };
        // Every rank has arrived: the failed rank's message follows at once.
        let len = usize::try_from(statuses[failed] - 1).unwrap_or(0);
        let mut bytes = match (&message, failed == self.rank) {
            (Some(m), true) => m.clone().into_bytes(),
            _ => vec![0u8; len],
        };
        self.comm
            .process_at_rank(failed as Rank)
            .broadcast_into(&mut bytes[..]);
        match message {
            Some(_) => Ok(()),
            None => Err(Error::RankFailed {
                op,
                rank: failed,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }

    /// Every rank's status word, waiting at most the group's timeout.
    fn gather_status(&self, op: &'static str, status: u64) -> Result<Vec<u64>> {
        if let Some(waited) = self.broken.get() {
            return Err(Error::Timeout {
                op,
                rank: self.rank,
                waited,
            });
        }
        let send = Box::into_raw(Box::new(status));
        let recv = Box::into_raw(vec![0u64; self.size].into_boxed_slice());
        // SAFETY: the buffers are only touched again once MPI has completed the request (then
        // freed below) or never (leaked with the request on a timeout), so they outlive it.
        let mut request = unsafe {
            self.comm
                .immediate_all_gather_into(StaticScope, &*send, &mut *recv)
        };
        let start = Instant::now();
        loop {
            match request.test() {
                Ok(_) => break,
                Err(pending) => {
                    let waited = start.elapsed();
                    if self.cfg.timeout.is_some_and(|limit| waited >= limit) {
                        // MPI still holds the request and may write into `recv` when the
                        // others arrive: the request and both buffers are leaked.
                        // SAFETY: the buffers are never freed (see above).
                        let _ = unsafe { pending.into_raw() };
                        self.broken.set(Some(waited));
                        return Err(Error::Timeout {
                            op,
                            rank: self.rank,
                            waited,
                        });
                    }
                    request = pending;
                    // Spin briefly (a step's agreement is usually immediate), then sleep.
                    if waited < Duration::from_millis(2) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        }
        // SAFETY: the request completed; these are the boxes made above, freed once.
        let statuses = unsafe { Box::from_raw(recv) }.into_vec();
        drop(unsafe { Box::from_raw(send) });
        Ok(statuses)
    }

    /// Every rank's `values`, concatenated in rank order (after an agreement: all ranks are
    /// there).
    /// # Errors
    /// [`Error::InvalidParameter`] (on every rank) when the total passes MPI's `i32` counts.
    pub(crate) fn all_gather<T: Equivalence + Copy + Default>(
        &self,
        op: &'static str,
        values: &[T],
    ) -> Result<Vec<T>> {
        let counts = self.all_gather_counts(values.len());
        let total = counts.iter().sum::<usize>();
        if total > i32::MAX as usize {
            return Err(Error::InvalidParameter {
                op,
                what: "elements gathered from all ranks",
                value: total.to_string(),
                rule: "at most 2^31 - 1 (MPI's counts)",
            });
        }
        let mut all = vec![T::default(); total];
        let (counts, displs) = counts_and_displs(&counts);
        let mut partition = mpi::datatype::PartitionMut::new(&mut all[..], counts, displs);
        self.comm.all_gather_varcount_into(values, &mut partition);
        Ok(all)
    }

    /// Every rank's `n`, in rank order.
    pub(crate) fn all_gather_counts(&self, n: usize) -> Vec<usize> {
        let mut all = vec![0u64; self.size];
        self.comm.all_gather_into(&(n as u64), &mut all[..]);
        all.into_iter().map(|c| c as usize).collect()
    }
}

/// MPI's counts and displacements (`i32`) for blocks of these lengths.
fn counts_and_displs(lengths: &[usize]) -> (Vec<i32>, Vec<i32>) {
    let counts: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
    let displs = counts
        .iter()
        .scan(0i32, |at, &c| {
            let here = *at;
            *at += c;
            Some(here)
        })
        .collect();
    (counts, displs)
}

/// An MPI rank or size as an index (never negative).
fn index(r: Rank) -> usize {
    usize::try_from(r).unwrap_or(0)
}

/// The error's message followed by its causes.
fn chain(e: &Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}
