//! Beyond one machine (feature `mpi`): kNN evaluation, its accuracy metrics, a consistent
//! memory bank, and PML's losses with class weights split by class, over MPI.
//!
//! Every rank holds a contiguous shard of the queries and of the references, in rank order;
//! the operations here give each rank the answers a single process would give for its own
//! rows over the concatenation of all shards, while no rank ever holds the whole reference
//! set. The answers are equal bit for bit when every rank computes on the same path as that
//! process (the native path, or GPUs of one kind and driver): a rank's scores are its
//! device's.
//!
//! **Failures.** Each collective step starts with an agreement: the ranks exchange whether
//! their local part succeeded before any data moves. A rank whose part failed returns its own
//! error and every other rank returns [`Error::RankFailed`] naming the lowest failing rank
//! with its message, so no rank is left waiting in a collective the others never enter.
//! Settings that must match (`k`, the distance, a bank's capacity, …) are compared first and
//! refused on every rank when they differ. Every wait of an operation, at agreements and
//! for data, is bounded by [`GroupConfig::timeout`] (not MPI's own setup and teardown:
//! [`Group::new`], dropping a group, `MPI_Finalize`): a rank that stops coming (stuck, or
//! killed) makes the others return [`Error::Timeout`], after which the group refuses every
//! call and the job should end with `MPI_Abort` ([`Group::timed_out`]).
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
//! let queries = ndarray::Array2::<f32>::zeros((100, 8)); // this rank's shards
//! let refs = ndarray::Array2::<f32>::zeros((1000, 8));
//! let found = distributed::knn(&group, &ctx, queries.view(), &refs, &KnnConfig::default())?;
//! assert_eq!(found.indices.nrows(), 100); // global reference indices for this rank's queries
//! # Ok::<(), wgpu_metric_learning::Error>(())
//! ```

mod accuracy;
mod bank;
mod class_weights;
mod classifier;
mod knn;

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;

use crate::context::{nth_best_adapter, AdapterSelector, BackendChoice, Context, ContextConfig};
use crate::error::{Error, Result};

pub use accuracy::accuracy;
pub use bank::enqueue_global;
pub use class_weights::{load_class_weights, save_class_weights};
pub use classifier::{classifier_loss, ClassWeights, DistributedClassifierConfig, RankGradients};
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
    /// The longest a rank waits for the others at any collective step of an operation, which
    /// includes the time they spend on their local part of it (one query block's search: a
    /// slow shard needs a smaller `query_block` or a longer timeout). `None` waits forever.
    /// Default 10 minutes.
    pub timeout: Option<Duration>,
    /// Queries per block sent to every rank by [`knn()`]: the owner of a block holds about
    /// `query_block · (d + (8 + 4 · ranks) · k) · 4` bytes of host buffers for it (every
    /// rank's partial lists, and their merge), every other rank about
    /// `query_block · (d + 6 · k) · 4`.
    /// Default 2 048.
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
        let statuses = self.all_gather_word(op, status)?;
        let Some(failed) = statuses.iter().position(|&s| s != 0) else {
            return Ok(());
        };
        // Every rank has arrived: the failed rank's message follows at once.
        let len = usize::try_from(statuses[failed] - 1).unwrap_or(0);
        let bytes = match (&message, failed == self.rank) {
            (Some(m), true) => m.clone().into_bytes(),
            _ => vec![0u8; len],
        };
        let bytes = self.broadcast(op, failed, bytes)?;
        match message {
            Some(_) => Ok(()),
            None => Err(Error::RankFailed {
                op,
                rank: failed,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }

    /// When an earlier wait of this group timed out, how long it waited: the ranks'
    /// collectives are out of step from then on, and every later call fails at once with
    /// [`Error::Timeout`]. MPI cannot withdraw a collective a rank has entered, so the job
    /// should then end with `MPI_Abort` (`world.abort(code)`), as `wml --distributed` does:
    /// a rank left waiting would otherwise hang in `MPI_Finalize`.
    pub fn timed_out(&self) -> Option<Duration> {
        self.broken.get()
    }

    /// Every rank's `values`, concatenated in rank order, on every rank (collective; the
    /// lengths may differ). The wait is bounded by the group's timeout.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (on every rank) when the total passes MPI's `i32` counts;
    /// [`Error::Timeout`].
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::distributed::{mpi, Group, GroupConfig};
    /// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
    ///     .expect("MPI initialises once");
    /// let group = Group::new(&universe.world(), &GroupConfig::default());
    /// let ranks = group.all_gather("ranks", &[group.rank() as u64])?;
    /// assert_eq!(ranks.len(), group.size());
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn all_gather<T: Equivalence + Copy + Default + 'static>(
        &self,
        op: &'static str,
        values: &[T],
    ) -> Result<Vec<T>> {
        let counts = self.all_gather_counts(op, values.len())?;
        self.varcount(op, &counts, values.to_vec(), |comm, send, part| {
            comm.immediate_all_gather_varcount_into(StaticScope, send, part)
        })
    }

    /// Every rank's `values` (the lengths may differ), concatenated in rank order, on rank
    /// `root` (`Some`); `None` on the others (collective). The wait is bounded by the group's
    /// timeout.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (on every rank) for a `root` past the ranks or a total
    /// past MPI's `i32` counts; [`Error::Timeout`].
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::distributed::{mpi, Group, GroupConfig};
    /// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
    ///     .expect("MPI initialises once");
    /// let group = Group::new(&universe.world(), &GroupConfig::default());
    /// let rows = vec![group.rank() as f32; group.rank()]; // rank r sends r values
    /// if let Some(all) = group.gather("results", 0, &rows)? {
    ///     assert_eq!(all.len(), group.size() * (group.size() - 1) / 2); // only on rank 0
    /// }
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn gather<T: Equivalence + Copy + Default + 'static>(
        &self,
        op: &'static str,
        root: usize,
        values: &[T],
    ) -> Result<Option<Vec<T>>> {
        if root >= self.size {
            return Err(Error::InvalidParameter {
                op,
                what: "root",
                value: root.to_string(),
                rule: "a rank of the group",
            });
        }
        let counts = self.all_gather_counts(op, values.len())?;
        self.gather_counted(op, root, values.to_vec(), &counts)
    }

    /// [`Group::gather`] of owned `values` whose lengths on every rank, `counts`, all ranks
    /// know already (no exchange of them first).
    pub(crate) fn gather_counted<T: Equivalence + Copy + Default + 'static>(
        &self,
        op: &'static str,
        root: usize,
        values: Vec<T>,
        counts: &[usize],
    ) -> Result<Option<Vec<T>>> {
        // Checked on every rank, so that all refuse alike.
        within_counts(op, counts)?;
        let root = root as Rank;
        if self.comm.rank() != root {
            self.bounded(op, values, |comm, send| {
                comm.process_at_rank(root)
                    .immediate_gather_varcount_into(StaticScope, &send[..])
            })?;
            return Ok(None);
        }
        let all = self.varcount(op, counts, values, |comm, send, part| {
            comm.process_at_rank(root)
                .immediate_gather_varcount_into_root(StaticScope, send, part)
        })?;
        Ok(Some(all))
    }

    /// `buf` from rank `root` on every rank (collective; the same length everywhere), the
    /// wait bounded by the group's timeout.
    pub(crate) fn broadcast<T: Equivalence + 'static>(
        &self,
        op: &'static str,
        root: usize,
        buf: Vec<T>,
    ) -> Result<Vec<T>> {
        self.bounded(op, buf, |comm, buf| {
            comm.process_at_rank(root as Rank)
                .immediate_broadcast_into(StaticScope, &mut buf[..])
        })
    }

    /// Block `rank` of the element-wise sum over every rank of `send` (`size · block` values
    /// on every rank, in blocks in rank order), the wait bounded by the group's timeout.
    pub(crate) fn reduce_scatter_sum(
        &self,
        op: &'static str,
        send: Vec<f64>,
        block: usize,
    ) -> Result<Vec<f64>> {
        within_counts(op, &[send.len()])?;
        let (_, recv) = self.bounded(op, (send, vec![0.0f64; block]), |comm, (send, recv)| {
            comm.immediate_reduce_scatter_block_into(
                StaticScope,
                &send[..],
                &mut recv[..],
                SystemOperation::sum(),
            )
        })?;
        Ok(recv)
    }

    /// Every rank's `n`, in rank order.
    pub(crate) fn all_gather_counts(&self, op: &'static str, n: usize) -> Result<Vec<usize>> {
        let all = self.all_gather_word(op, n as u64)?;
        Ok(all.into_iter().map(|c| c as usize).collect())
    }

    /// Every rank's `word`, in rank order.
    fn all_gather_word(&self, op: &'static str, word: u64) -> Result<Vec<u64>> {
        let (_, all) = self.bounded(op, (word, vec![0u64; self.size]), |comm, (w, all)| {
            comm.immediate_all_gather_into(StaticScope, &*w, &mut all[..])
        })?;
        Ok(all)
    }

    /// A varcount collective that `start` begins from `send` into a buffer of every rank's
    /// `counts` elements, in rank order; returns that buffer.
    fn varcount<T: Equivalence + Copy + Default + 'static>(
        &self,
        op: &'static str,
        counts: &[usize],
        send: Vec<T>,
        start: impl FnOnce(
            &SimpleCommunicator,
            &'static [T],
            &'static mut Partition<T>,
        ) -> Request<'static, Partition<T>>,
    ) -> Result<Vec<T>> {
        let (all, part) = self.partition(op, counts)?;
        let (_, part) = self.bounded(op, (send, part), |comm, (send, part)| {
            start(comm, &send[..], part)
        })?;
        drop(part);
        // SAFETY: the request completed and the partition, the buffer's only user, is gone.
        Ok(unsafe { all.reclaim() })
    }

    /// Fails unless every rank passed the same `values` (settings that must agree, named),
    /// on every rank alike: [`Error::InvalidParameter`] naming the first that differs.
    pub(crate) fn same_everywhere(
        &self,
        op: &'static str,
        values: &[(&'static str, u64)],
    ) -> Result<()> {
        let mine: Vec<u64> = values.iter().map(|&(_, v)| v).collect();
        let all = self.all_gather(op, &mine)?;
        for (r, theirs) in all.chunks_exact(mine.len().max(1)).enumerate() {
            if let Some(j) = (0..mine.len()).find(|&j| theirs[j] != mine[j]) {
                return Err(Error::InvalidParameter {
                    op,
                    what: values[j].0,
                    value: format!(
                        "{} on rank {}, {} on rank {r}",
                        mine[j], self.rank, theirs[j]
                    ),
                    rule: "the same on every rank",
                });
            }
        }
        Ok(())
    }

    /// A receive buffer of `counts` elements in rank order, partitioned for a varcount
    /// collective. The buffer is owned by the returned [`Leased`] and borrowed by the
    /// partition for as long as MPI may write into it.
    fn partition<T: Equivalence + Copy + Default + 'static>(
        &self,
        op: &'static str,
        counts: &[usize],
    ) -> Result<(Leased<T>, Partition<T>)> {
        within_counts(op, counts)?;
        // Refused before anything is leased (`bounded` would refuse after).
        self.check_open(op)?;
        let all = Leased::new(vec![T::default(); counts.iter().sum::<usize>()]);
        let (counts, displs) = counts_and_displs(counts);
        // SAFETY: the partition is the buffer's only user until it is dropped, which the
        // callers do before reclaiming it (or never, on a timeout: both are leaked).
        let part = mpi::datatype::PartitionMut::new(unsafe { all.borrow() }, counts, displs);
        Ok((all, part))
    }

    /// [`Error::Timeout`] when an earlier wait timed out (see [`Group::timed_out`]).
    fn check_open(&self, op: &'static str) -> Result<()> {
        match self.broken.get() {
            Some(waited) => Err(Error::Timeout {
                op,
                rank: self.rank,
                waited,
            }),
            None => Ok(()),
        }
    }

    /// Runs one non-blocking collective that `start` begins on `buffers` and waits for it,
    /// at most the group's timeout; returns the buffers. MPI may still write into them after
    /// a timeout (when the others arrive), so they are then leaked with the request and the
    /// group is marked broken. Every data step goes through here, so that a rank whose peers
    /// stopped coming (they timed out earlier) fails in bounded time instead of hanging.
    fn bounded<B: 'static, D: ?Sized + 'static>(
        &self,
        op: &'static str,
        buffers: B,
        start: impl FnOnce(&SimpleCommunicator, &'static mut B) -> Request<'static, D>,
    ) -> Result<B> {
        self.check_open(op)?;
        let raw = Box::into_raw(Box::new(buffers));
        // SAFETY: `raw` is touched again only once the request has completed (below) or
        // never (leaked on a timeout), so the buffers outlive every use MPI makes of them.
        let mut request = start(&self.comm, unsafe { &mut *raw });
        let begun = Instant::now();
        loop {
            match request.test() {
                Ok(_) => break,
                Err(pending) => {
                    let waited = begun.elapsed();
                    if self.cfg.timeout.is_some_and(|limit| waited >= limit) {
                        // SAFETY: the request is forgotten with its buffers (see above).
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
        // SAFETY: the request completed; `raw` is the box made above, taken back once.
        Ok(*unsafe { Box::from_raw(raw) })
    }
}

/// A receive buffer split into every rank's block, for varcount collectives.
type Partition<T> = mpi::datatype::PartitionMut<'static, [T], Vec<i32>, Vec<i32>>;

/// A buffer handed to MPI for a request that may outlive the call (on a timeout): owned
/// through a raw pointer, so that a partition can borrow it for `'static` and the owner can
/// either take it back after the request completed or leak it.
struct Leased<T>(*mut [T]);

impl<T> Leased<T> {
    fn new(values: Vec<T>) -> Self {
        Self(Box::into_raw(values.into_boxed_slice()))
    }

    /// The buffer, for MPI.
    /// # Safety
    /// At most one borrow at a time, and none left when [`Leased::reclaim`] is called.
    unsafe fn borrow(&self) -> &'static mut [T] {
        // SAFETY: the pointer came from a live box (see the caller's contract).
        unsafe { &mut *self.0 }
    }

    /// The buffer back.
    /// # Safety
    /// No borrow is left and MPI no longer uses it (its request completed).
    unsafe fn reclaim(self) -> Vec<T> {
        // SAFETY: the pointer came from `Box::into_raw` and is taken back once.
        unsafe { Box::from_raw(self.0) }.into_vec()
    }
}

/// [`Error::InvalidParameter`] when blocks of these lengths pass MPI's `i32` counts together.
fn within_counts(op: &'static str, counts: &[usize]) -> Result<()> {
    let total = counts.iter().sum::<usize>();
    if total > i32::MAX as usize {
        return Err(Error::InvalidParameter {
            op,
            what: "elements gathered from all ranks",
            value: total.to_string(),
            rule: "at most 2^31 - 1 (MPI's counts)",
        });
    }
    Ok(())
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

/// A setting as one word for [`Group::same_everywhere`]: the same for the same value in every
/// rank (the same build hashes alike).
fn fingerprint(value: &impl std::fmt::Debug) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    format!("{value:?}").hash(&mut hasher);
    hasher.finish()
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
