//! The distributed operations checked against one process, under `mpirun` (CI runs it with 2
//! and 3 ranks):
//!
//! ```text
//! cargo build --features mpi --example distributed_check
//! mpirun -np 3 target/debug/examples/distributed_check
//! ```
//!
//! Every rank draws the same data from the case's seed, keeps its (uneven, sometimes empty)
//! shards, and compares what the group answers with what one process answers over all of
//! it, bit for bit: kNN for every distance and self-exclusion, several query blocks per rank,
//! `k` beyond one rank's references and ties across ranks; banks fed by random sequences of
//! `enqueue_global`; PML's losses with class weights, sharded and replicated (within f32
//! rounding: the sums run in another order); class-weight checkpoints saved on uneven shards
//! and loaded on the even split; a failure injected on one rank, which every rank must report; a rank
//! that arrives late, which the others must give up on after the timeout. Exits non-zero
//! (a panic, which ends the job) on the first difference.

use std::time::Duration;

use ndarray::{s, Array1, Array2};
use wgpu_metric_learning::distributed::mpi::traits::*;
use wgpu_metric_learning::distributed::{self, mpi, Group, GroupConfig};
use wgpu_metric_learning::distributed::{ClassWeights, DistributedClassifierConfig, RankGradients};
use wgpu_metric_learning::{
    accuracy, classifier_loss, knn, weights_step, AccuracyConfig, AccuracyK, AccuracyMetrics,
    BackendChoice, BankConfig, CancelToken, ClassSampling, ClassifierKind, ClassifierLossConfig,
    Context, ContextConfig, Distance, DistanceConfig, Error, Hooks, KnnConfig, MemoryBank,
    MiningSet, OptimizerState, SelfExclusion, WeightOptimizer, WeightsShard,
};

/// xorshift64*: the same numbers on every rank for the same seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `(n, d)` rows with some exact duplicates (ties that may fall on different ranks).
fn rows(rng: &mut Rng, n: usize, d: usize) -> Array2<f32> {
    let mut x = Array2::from_shape_fn((n, d), |_| rng.float());
    for i in 0..n {
        if i > 0 && rng.below(4) == 0 {
            let j = rng.below(i);
            let copy = x.row(j).to_owned();
            x.row_mut(i).assign(&copy);
        }
    }
    x
}

/// Uneven cut points of `n` rows over `p` ranks (some shards may be empty).
fn shards(rng: &mut Rng, n: usize, p: usize) -> Vec<(usize, usize)> {
    let mut cuts: Vec<usize> = (0..p - 1).map(|_| rng.below(n + 1)).collect();
    cuts.sort_unstable();
    cuts.insert(0, 0);
    cuts.push(n);
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

fn check_knn(group: &Group, ctx: &Context, case: u64) {
    let (rank, p) = (group.rank(), group.size());
    let mut rng = Rng::new(case);
    let d = [1, 3, 16, 300][rng.below(4)];
    let q = rng.below(40);
    let same = rng.below(3) == 0; // the references are the queries
    let n = if same { q } else { 1 + rng.below(60) };
    let queries = rows(&mut rng, q, d);
    let refs = if same {
        queries.clone()
    } else {
        rows(&mut rng, n, d)
    };
    let distance = [
        Distance::Euclidean,
        Distance::SquaredEuclidean,
        Distance::Cosine,
        Distance::DotProduct,
    ][rng.below(4)];
    let normalize = rng.below(2) == 0;
    let (exclusion, excluded) = match (same, rng.below(3)) {
        (true, _) if n >= 2 => (SelfExclusion::SameIndex, true),
        (false, 0) if n > q && q > 0 => (SelfExclusion::SameIndex, true),
        (false, 1) if q > 0 => (
            SelfExclusion::QuerySlots((0..q).map(|_| rng.below(n) as u32).collect()),
            true,
        ),
        _ => (SelfExclusion::None, false),
    };
    let visible = n - usize::from(excluded);
    if visible == 0 {
        return;
    }
    let k = match rng.below(3) {
        0 => 1,
        1 => visible,
        _ => 1 + rng.below(visible),
    };
    let query_shards = shards(&mut rng, q, p);
    let ref_shards = shards(&mut rng, n, p);
    let cfg = KnnConfig {
        k,
        distance: DistanceConfig {
            distance,
            normalize,
        },
        self_exclusion: exclusion.clone(),
        ..Default::default()
    };
    let one = knn(ctx, &queries, &refs, &cfg).expect("one process's kNN");

    let (qa, qb) = query_shards[rank];
    let (ra, rb) = ref_shards[rank];
    let local_cfg = KnnConfig {
        self_exclusion: match &exclusion {
            SelfExclusion::QuerySlots(slots) => SelfExclusion::QuerySlots(slots[qa..qb].to_vec()),
            other => other.clone(),
        },
        ..cfg.clone()
    };
    let found = distributed::knn(
        group,
        ctx,
        queries.slice(s![qa..qb, ..]),
        refs.slice(s![ra..rb, ..]),
        &local_cfg,
    )
    .unwrap_or_else(|e| panic!("case {case}: distributed kNN failed on rank {rank}: {e}"));
    let want_indices = one.indices.slice(s![qa..qb, ..]);
    let want_scores = one.scores.slice(s![qa..qb, ..]);
    assert_eq!(
        found.indices, want_indices,
        "case {case} (q {q}, n {n}, d {d}, k {k}, {distance:?}, normalize {normalize}, {exclusion:?}): indices differ on rank {rank}"
    );
    let bits = |a: ndarray::ArrayView2<'_, f32>| a.mapv(f32::to_bits);
    assert_eq!(
        bits(found.scores.view()),
        bits(want_scores),
        "case {case}: scores differ on rank {rank}"
    );
}

fn check_bank(group: &Group, ctx: &Context, case: u64) {
    let (rank, p) = (group.rank(), group.size());
    let mut rng = Rng::new(case);
    let (capacity, d) = (1 + rng.below(12), 1 + rng.below(5));
    let mut mine = MemoryBank::<i64>::new(ctx, &BankConfig::new(capacity, d)).expect("a bank");
    let mut one = MemoryBank::<i64>::new(ctx, &BankConfig::new(capacity, d)).expect("a bank");
    for step in 0..8 {
        // Every rank's batch size, the same draws everywhere; all of them fit the bank.
        let mut sizes: Vec<usize> = (0..p).map(|_| rng.below(4)).collect();
        while sizes.iter().sum::<usize>() > capacity {
            let biggest = (0..p).max_by_key(|&r| sizes[r]).unwrap_or(0);
            sizes[biggest] -= 1;
        }
        let total: usize = sizes.iter().sum();
        let x = rows(&mut rng, total, d);
        let y = Array1::from_shape_fn(total, |_| rng.below(3) as i64);
        let first: usize = sizes[..rank].iter().sum();
        let range = first..first + sizes[rank];
        let (bx, by) = (x.slice(s![range.clone(), ..]), y.slice(s![range.clone()]));
        let got = distributed::enqueue_global(group, ctx, &mut mine, &MiningSet::new(bx, by))
            .unwrap_or_else(|e| panic!("case {case} step {step}: enqueue_global: {e}"));
        let all = one
            .enqueue(ctx, &MiningSet::new(&x, &y))
            .expect("one process's enqueue");
        assert_eq!(
            got.slots,
            all.slots[range.clone()],
            "case {case} step {step}: slots"
        );
        assert_eq!(
            got.self_exclusion,
            SelfExclusion::QuerySlots(all.slots[range].to_vec())
        );
        let (a, b) = (
            mine.snapshot(ctx).expect("a snapshot"),
            one.snapshot(ctx).expect("a snapshot"),
        );
        assert_eq!(
            (a.embeddings, a.labels, mine.head(), mine.is_filled()),
            (b.embeddings, b.labels, one.head(), one.is_filled()),
            "case {case} step {step}: banks differ on rank {rank}"
        );
    }
}

/// Returns whether both succeeded (rather than failed alike).
fn check_accuracy(group: &Group, ctx: &Context, case: u64) -> bool {
    let (rank, p) = (group.rank(), group.size());
    let mut rng = Rng::new(case);
    let d = 1 + rng.below(6);
    let q = rng.below(30);
    let classes = 1 + rng.below(5) as i64;
    let queries = rows(&mut rng, q, d);
    let query_labels = Array1::from_shape_fn(q, |_| rng.below(classes as usize) as i64);
    // No references (the queries are their own), unrelated ones, or ones that start with the
    // queries (PML's ref_includes_query).
    let kind = rng.below(3);
    let extra = rng.below(25);
    let (refs, ref_labels) = match kind {
        0 => (queries.clone(), query_labels.clone()),
        _ => {
            let more = rows(&mut rng, extra, d);
            let more_labels = Array1::from_shape_fn(extra, |_| rng.below(classes as usize) as i64);
            match kind {
                1 => (more, more_labels),
                _ => (
                    ndarray::concatenate![ndarray::Axis(0), queries, more],
                    ndarray::concatenate![ndarray::Axis(0), query_labels, more_labels],
                ),
            }
        }
    };
    let cfg = AccuracyConfig {
        k: match rng.below(3) {
            0 => AccuracyK::All,
            1 => AccuracyK::MaxBinCount,
            _ => AccuracyK::Fixed(1 + rng.below(3)),
        },
        self_exclusion: match kind {
            2 => SelfExclusion::SameIndex,
            _ => SelfExclusion::Auto,
        },
        avg_of_avgs: rng.below(2) == 0,
        ..Default::default()
    };
    let query_shards = shards(&mut rng, q, p);
    let ref_shards = shards(&mut rng, refs.nrows(), p);
    let all_queries = MiningSet::new(&queries, &query_labels);
    let all_refs = MiningSet::new(&refs, &ref_labels);
    let one = accuracy(ctx, &all_queries, (kind != 0).then_some(&all_refs), &cfg);
    let (qa, qb) = query_shards[rank];
    // Without references, each rank's references are its queries.
    let (ra, rb) = if kind == 0 {
        (qa, qb)
    } else {
        ref_shards[rank]
    };
    let local_queries = MiningSet::new(
        queries.slice(s![qa..qb, ..]),
        query_labels.slice(s![qa..qb]),
    );
    let local_refs = MiningSet::new(refs.slice(s![ra..rb, ..]), ref_labels.slice(s![ra..rb]));
    let got = distributed::accuracy(
        group,
        ctx,
        &local_queries,
        (kind != 0).then_some(&local_refs),
        &cfg,
    );
    let summary = |a: &wgpu_metric_learning::Accuracy<i64>| {
        let bits = |m: &AccuracyMetrics| {
            [
                m.precision_at_1,
                m.r_precision,
                m.mean_average_precision_at_r,
                m.mean_average_precision,
                m.mean_reciprocal_rank,
            ]
            .map(f64::to_bits)
        };
        let per_class: Vec<_> = a.per_class.iter().map(|(l, m)| (*l, bits(m))).collect();
        (bits(&a.metrics), per_class, a.lone_queries, a.k)
    };
    match (one, got) {
        (Ok(one), Ok(got)) => {
            assert_eq!(
                summary(&got),
                summary(&one),
                "case {case} (q {q}, refs {}, kind {kind}, {cfg:?}): accuracy differs on rank {rank}",
                refs.nrows()
            );
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(
                std::mem::discriminant(&a),
                std::mem::discriminant(&b),
                "case {case}: {a} vs {b}"
            );
            false
        }
        (one, got) => panic!("case {case} on rank {rank}: one process {one:?}, the group {got:?}"),
    }
}

/// On a device, a rank's references are uploaded once for all query blocks, not per block.
fn check_resident(world: &impl Communicator, ctx: &Context) {
    let cfg = GroupConfig {
        query_block: 3,
        ..Default::default()
    };
    let group = Group::new(world, &cfg);
    let mut rng = Rng::new(77 + group.rank() as u64);
    let (queries, refs) = (rows(&mut rng, 40, 64), rows(&mut rng, 500, 64));
    let cfg = KnnConfig {
        k: 5,
        ..Default::default()
    };
    let found = distributed::knn(&group, ctx, &queries, &refs, &cfg).expect("a distributed kNN");
    let (sent, refs_bytes) = (found.transfers.bytes_up, refs.len() as u64 * 4);
    let blocks = (40 * group.size()).div_ceil(3) as u64;
    // Streaming would upload the references with each block: `blocks · refs_bytes` at least.
    // Once: the references, plus each block's queries and small per-block buffers.
    assert!(
        sent < 4 * refs_bytes,
        "{sent} bytes uploaded for {refs_bytes} bytes of references over {blocks} query blocks"
    );
}

/// The last rank fails; every rank must return an error naming it, and stay usable.
fn check_failure(world: &impl Communicator, group: &Group, ctx: &Context) {
    let (rank, p) = (group.rank(), group.size());
    let last = p - 1;
    let mut refs = Array2::<f32>::ones((4, 3));
    if rank == last {
        refs[[2, 1]] = f32::NAN;
    }
    let queries = Array2::<f32>::ones((2, 3));
    let cfg = KnnConfig {
        k: 2,
        ..Default::default()
    };
    match distributed::knn(group, ctx, queries.view(), refs.view(), &cfg) {
        Err(Error::NonFinite { row: 2, col: 1, .. }) if rank == last => {}
        Err(Error::RankFailed {
            rank: failed,
            message,
            ..
        }) if rank != last => {
            assert_eq!(failed, last);
            assert!(message.contains("non-finite"), "{message}");
        }
        other => panic!("rank {rank}: an injected NaN on rank {last} gave {other:?}"),
    }
    // A rule that spans the ranks: k above all ranks' references, the same error everywhere.
    let refs = Array2::<f32>::ones((4, 3));
    let cfg = KnnConfig {
        k: 4 * p + 1,
        ..Default::default()
    };
    match distributed::knn(group, ctx, queries.view(), refs.view(), &cfg) {
        Err(Error::InvalidParameter { what: "k", .. }) => {}
        other => panic!("rank {rank}: k past every reference gave {other:?}"),
    }
    // Settings that differ between ranks: refused on every rank, before any block moves.
    let cfg = KnnConfig {
        k: 2 + usize::from(rank == last),
        ..Default::default()
    };
    match distributed::knn(group, ctx, queries.view(), refs.view(), &cfg) {
        Err(Error::InvalidParameter { what: "k", .. }) => {}
        other => panic!("rank {rank}: k differing on rank {last} gave {other:?}"),
    }
    // Several ranks fail: each gets its own error, the others the lowest failing rank's.
    let mut bad = Array2::<f32>::ones((4, 3));
    if rank >= 1 {
        bad[[0, 0]] = f32::INFINITY;
    }
    let cfg = KnnConfig {
        k: 2,
        ..Default::default()
    };
    match distributed::knn(group, ctx, queries.view(), bad.view(), &cfg) {
        Err(Error::NonFinite { row: 0, col: 0, .. }) if rank >= 1 => {}
        Err(Error::RankFailed { rank: 1, .. }) if rank == 0 => {}
        other => panic!("rank {rank}: failures on ranks 1.. gave {other:?}"),
    }
    // A failure in the middle of the blocks (the last rank cancels after its first
    // search): every rank stops at that block with an error.
    let token = CancelToken::new();
    let cancel = token.clone();
    let hooks = match rank == last {
        true => Hooks::new()
            .cancel_with(&token)
            .on_progress(move |_| cancel.cancel()),
        false => Hooks::new(),
    };
    let many = Array2::<f32>::ones((20, 3));
    let cfg = KnnConfig {
        k: 2,
        hooks,
        ..Default::default()
    };
    let small_blocks = Group::new(
        world,
        &GroupConfig {
            query_block: 2,
            ..Default::default()
        },
    );
    match distributed::knn(&small_blocks, ctx, many.view(), refs.view(), &cfg) {
        Err(Error::Cancelled { .. }) if rank == last => {}
        Err(Error::RankFailed { rank: failed, .. }) if rank != last => assert_eq!(failed, last),
        other => panic!("rank {rank}: a cancel mid-way on rank {last} gave {other:?}"),
    }
    // The group goes on after errors.
    let cfg = KnnConfig {
        k: 3,
        ..Default::default()
    };
    let found = distributed::knn(group, ctx, queries.view(), refs.view(), &cfg)
        .expect("the group works after a failed call");
    assert_eq!(found.indices.row(0).to_vec(), vec![0, 1, 2]);
}

/// Rank 0 arrives late: the others give up after the timeout, and refuse later calls; rank 0
/// then times out alone. It leaves rank 0 with a collective that never completes, which Open
/// MPI's `MPI_Finalize` tolerates (the standard does not promise it: `wml` aborts instead).
fn check_timeout(world: &impl Communicator) {
    let cfg = GroupConfig {
        timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let group = Group::new(world, &cfg);
    let native = ContextConfig {
        backend: BackendChoice::NativeCpu,
        ..Default::default()
    };
    if group.rank() == 0 {
        std::thread::sleep(Duration::from_millis(1500));
        // Every other rank's wait is still posted: this one completes it.
        group.context(&native).expect("the late rank's agreement");
        // The others have given up on the group: the next step waits for them in vain and
        // times out too, rather than hang.
        match group.context(&native) {
            Err(Error::Timeout { rank: 0, .. }) => {}
            other => panic!("rank 0 went on alone: {other:?}"),
        }
        assert!(group.timed_out().is_some());
    } else {
        match group.context(&native) {
            Err(Error::Timeout { rank, .. }) => assert_eq!(rank, group.rank()),
            other => panic!("rank {}: a late rank 0 gave {other:?}", group.rank()),
        }
        match group.context(&native) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("a timed-out group was used again: {other:?}"),
        }
    }
}

/// Class weights trained a few steps on uneven shards, saved by the group, loaded back on
/// the even split (re-sharded): equal, bit for bit, to one process training them all (the
/// optimizer's update is element by element), its state included.
fn check_checkpoint(group: &Group, ctx: &Context, case: u64) {
    let (rank, size) = (group.rank(), group.size());
    let mut rng = Rng::new(case);
    let kinds = [
        ClassifierKind::arc_face(),
        ClassifierKind::sub_center_arc_face(),
        ClassifierKind::proxy_anchor(),
    ];
    let kind = &kinds[rng.below(kinds.len())];
    let opt = match rng.below(2) {
        0 => WeightOptimizer::sgd(0.1, 0.9),
        _ => WeightOptimizer::adamw(0.01),
    };
    let (classes, d, steps) = (
        size + rng.below(30),
        1 + rng.below(6),
        1 + rng.below(3) as u64,
    );
    // An uneven split, at least one class each (rank 0's range can be larger).
    let mut cuts: Vec<usize> = (1..size)
        .map(|_| 1 + rng.below(classes - size + 1))
        .collect();
    cuts.sort_unstable();
    let cut = |r: usize| match r {
        0 => 0,
        r if r == size => classes,
        r => cuts[r - 1] + r - 1,
    };
    let shape = kind.weight_shape(classes, d);
    let k = kind.centres_per_class();
    let part = |x: &Array2<f32>, r: std::ops::Range<usize>| match kind.classes_on_rows() {
        true => x.slice(s![r.start * k..r.end * k, ..]).to_owned(),
        false => x.slice(s![.., r.start * k..r.end * k]).to_owned(),
    };
    let w0 = Array2::from_shape_fn(shape, |_| rng.float());
    let grads: Vec<Array2<f32>> = (0..steps)
        .map(|_| Array2::from_shape_fn(shape, |_| rng.float()))
        .collect();
    let train = |r: std::ops::Range<usize>| {
        let (mut w, mut state) = (part(&w0, r.clone()), OptimizerState::new());
        for g in &grads {
            weights_step(
                ctx,
                w.view_mut(),
                part(g, r.clone()).view(),
                &mut state,
                &opt,
            )
            .expect("step");
        }
        (w, state)
    };
    let mine = cut(rank)..cut(rank + 1);
    let (w, state) = train(mine.clone());
    // One directory for every rank: rank 0's process id names it.
    let id = group
        .all_gather("checkpoint dir", &[u64::from(std::process::id())])
        .expect("gather")[0];
    let dir = std::env::temp_dir().join(format!("wml-dist-ckpt-{id}-{case}"));
    if rank == 0 {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
    }
    world_barrier(group);
    let shard = WeightsShard {
        kind,
        classes,
        first_class: mine.start,
        weights: w.view(),
        optimizer: &opt,
        state: &state,
    };
    distributed::save_class_weights(group, &dir, &shard).expect("save");
    let (range, loaded) = distributed::load_class_weights(group, ctx, &dir, kind).expect("load");
    assert_eq!(range, classes * rank / size..classes * (rank + 1) / size);
    let (expected, state) = train(range.clone());
    assert_eq!(
        loaded.weights, expected,
        "case {case}: rank {rank}'s classes {range:?}"
    );
    assert_eq!(loaded.state.buffers(), state.buffers(), "case {case}");
    assert_eq!((loaded.state.steps(), loaded.optimizer), (steps, opt));
    world_barrier(group);
    if rank == 0 {
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Every rank has arrived (an all-gather as a barrier, bounded by the group's timeout).
fn world_barrier(group: &Group) {
    group.all_gather("barrier", &[0u8]).expect("barrier");
}

/// PML's losses with class weights over the ranks against one process on the concatenated
/// batch and `W`: every kind, sharded and replicated `W`, both gradient scalings, uneven
/// batches (empty ones, every row on one rank) and class shards, classes absent from the
/// batch, PartialFC's sampling (odd cases) and the replicas' checksum. f32 sums in another
/// order: equal within 1e-6 of each array's largest value.
fn check_classifier(group: &Group, ctx: &Context, case: u64) {
    let (p, rank) = (group.size(), group.rank());
    let mut rng = Rng::new(case);
    let kinds = [
        ClassifierKind::arc_face(),
        ClassifierKind::sub_center_arc_face(),
        ClassifierKind::cos_face(),
        ClassifierKind::large_margin_softmax(),
        ClassifierKind::sphere_face(),
        ClassifierKind::normalized_softmax(),
        ClassifierKind::proxy_nca(),
        ClassifierKind::proxy_anchor(),
        ClassifierKind::soft_triple(),
    ];
    let kind = kinds[case as usize % kinds.len()];
    let per = kind.centres_per_class();
    let (d, classes, b) = (3 + rng.below(6), p + rng.below(9), 1 + rng.below(12));
    let x = rows(&mut rng, b, d);
    // Half of the classes at most have rows: the others are absent from the batch.
    let labels: Vec<i64> = (0..b).map(|_| rng.below(classes / 2 + 1) as i64).collect();
    let w = Array2::from_shape_fn(kind.weight_shape(classes, d), |_| rng.float());
    let row_cut = if case.is_multiple_of(4) {
        // Every row on one rank.
        let owner = rng.below(p);
        (0..p)
            .map(|r| {
                if r == owner {
                    (0, b)
                } else if r < owner {
                    (0, 0)
                } else {
                    (b, b)
                }
            })
            .collect()
    } else {
        shards(&mut rng, b, p)
    };
    // At least one class on each rank.
    let class_cut: Vec<(usize, usize)> = shards(&mut rng, classes - p, p)
        .iter()
        .enumerate()
        .map(|(r, &(c0, c1))| (c0 + r, c1 + r + 1))
        .collect();
    let weights = if (case / 9).is_multiple_of(2) {
        ClassWeights::Sharded
    } else {
        ClassWeights::Replicated
    };
    let gradients = if (case / 18).is_multiple_of(2) {
        RankGradients::Averaged
    } else {
        RankGradients::Summed
    };
    // The draw depends on the seed and the class only: the same classes as one process.
    let sampling = if case % 2 == 1 && !matches!(kind, ClassifierKind::ProxyAnchor { .. }) {
        ClassSampling {
            rate: 0.4,
            seed: case,
        }
    } else {
        ClassSampling::default()
    };
    let loss = ClassifierLossConfig {
        kind,
        sampling,
        ..Default::default()
    };
    let single = classifier_loss(ctx, x.view(), &labels, w.view(), &loss).expect("one process");
    let (r0, r1) = row_cut[rank];
    let (c0, c1) = (class_cut[rank].0 * per, class_cut[rank].1 * per);
    let on_rows = kind.classes_on_rows();
    let mine = match (weights, on_rows) {
        (ClassWeights::Replicated, _) => w.view(),
        (ClassWeights::Sharded, true) => w.slice(s![c0..c1, ..]),
        (ClassWeights::Sharded, false) => w.slice(s![.., c0..c1]),
    };
    let cfg = DistributedClassifierConfig {
        loss,
        weights,
        gradients,
        check_replicas: true,
    };
    let out = distributed::classifier_loss(
        group,
        ctx,
        x.slice(s![r0..r1, ..]),
        &labels[r0..r1],
        mine,
        &cfg,
    )
    .unwrap_or_else(|e| panic!("case {case} ({kind:?}, {weights:?}): {e}"));
    let what =
        format!("case {case}, {kind:?}, {weights:?}, {gradients:?}, {sampling:?}, rank {rank}");
    assert_eq!(
        out.classes_used, single.classes_used,
        "{what}: classes used"
    );
    let close = |a: f32, b: f32, scale: f32| (a - b).abs() <= 1e-6 * scale.max(1e-3);
    assert!(
        close(out.loss, single.loss, single.loss.abs()),
        "{what}: loss {} vs {}",
        out.loss,
        single.loss
    );
    assert_eq!(out.count, single.count, "{what}: count");
    let factor = if gradients == RankGradients::Averaged {
        p as f32
    } else {
        1.0
    };
    let expected = single.grad.slice(s![r0..r1, ..]).mapv(|v| v * factor);
    let top = single.grad.iter().fold(0.0f32, |m, v| m.max(v.abs())) * factor;
    assert_eq!(out.grad.dim(), expected.dim(), "{what}: grad shape");
    for (a, e) in out.grad.iter().zip(&expected) {
        assert!(
            close(*a, *e, top),
            "{what}: grad {a} vs {e} (largest {top})"
        );
    }
    let expected = match (weights, on_rows) {
        (ClassWeights::Replicated, _) => single.weight_grad.view(),
        (ClassWeights::Sharded, true) => single.weight_grad.slice(s![c0..c1, ..]),
        (ClassWeights::Sharded, false) => single.weight_grad.slice(s![.., c0..c1]),
    };
    let top = single
        .weight_grad
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    assert_eq!(
        out.weight_grad.dim(),
        expected.dim(),
        "{what}: weight_grad shape"
    );
    for (a, e) in out.weight_grad.iter().zip(&expected) {
        assert!(
            close(*a, *e, top),
            "{what}: weight_grad {a} vs {e} (largest {top})"
        );
    }
}

/// Replicated weights that differ on one rank fail every rank with the checksum's error, and
/// pass when `check_replicas` is off (the fault it guards against: nothing else notices).
fn check_replicas(group: &Group, ctx: &Context) {
    let (rank, last) = (group.rank(), group.size() - 1);
    let x = Array2::from_shape_fn((2, 4), |(i, j)| (i + 2 * j) as f32 - 2.5);
    let mut w = Array2::from_shape_fn((4, 6), |(i, j)| ((i * 6 + j) % 5) as f32 - 2.0);
    if rank == last {
        w[[3, 5]] += 1e-3;
    }
    let mut cfg = DistributedClassifierConfig {
        weights: ClassWeights::Replicated,
        check_replicas: true,
        ..Default::default()
    };
    match distributed::classifier_loss(group, ctx, x.view(), &[0, 5], w.view(), &cfg) {
        Err(Error::InvalidParameter { what, value, .. }) => {
            assert_eq!(what, "replicated weights' checksum", "rank {rank}");
            assert!(
                value.contains(&format!("rank {last}")) || rank == last,
                "{value}"
            );
        }
        other => panic!("rank {rank}: replicas that differ gave {other:?}"),
    }
    cfg.check_replicas = false;
    distributed::classifier_loss(group, ctx, x.view(), &[0, 5], w.view(), &cfg)
        .expect("unchecked replicas run");
}

fn main() {
    let (universe, threading) =
        mpi::initialize_with_threading(mpi::Threading::Funneled).expect("MPI initialises once");
    assert_ne!(
        threading,
        mpi::Threading::Single,
        "MPI_THREAD_FUNNELED is needed"
    );
    let world = universe.world();
    let mut scored = 0;
    for block in [3, 2048] {
        let cfg = GroupConfig {
            query_block: block,
            timeout: Some(Duration::from_secs(120)),
        };
        let group = Group::new(&world, &cfg);
        let ctx = group
            .context(&ContextConfig {
                backend: BackendChoice::NativeCpu,
                ..Default::default()
            })
            .expect("a native context");
        for case in 0..60 {
            check_knn(&group, &ctx, case);
        }
        for case in 0..20 {
            check_bank(&group, &ctx, 1000 + case);
        }
        for case in 0..40 {
            scored += usize::from(check_accuracy(&group, &ctx, 2000 + case));
        }
        for case in 0..36 {
            check_classifier(&group, &ctx, 3000 + case);
        }
        for case in 0..6 {
            check_checkpoint(&group, &ctx, 4000 + case);
        }
        check_replicas(&group, &ctx);
        check_failure(&world, &group, &ctx);
    }
    // Most cases must compare values, not just errors alike (the data makes few invalid).
    assert!(
        scored >= 70,
        "only {scored} of 80 native accuracy cases were scored"
    );
    // The same on this machine's wgpu adapter (lavapipe in CI), which each rank picks by its
    // local rank.
    let group = Group::new(&world, &GroupConfig::default());
    let gpu = group.context(&ContextConfig {
        backend: BackendChoice::Wgpu,
        fill_outputs_with_sentinel: true,
        ..Default::default()
    });
    match gpu {
        Ok(ctx) => {
            let before = scored;
            for case in 0..15 {
                check_knn(&group, &ctx, 5000 + case);
                scored += usize::from(check_accuracy(&group, &ctx, 6000 + case));
            }
            assert!(
                scored - before >= 12,
                "{} of 15 GPU accuracy cases scored",
                scored - before
            );
            check_resident(&world, &ctx);
            check_failure(&world, &group, &ctx);
        }
        Err(e) if std::env::var("WML_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("WML_REQUIRE_GPU=1 and no adapter: {e}")
        }
        Err(e) => eprintln!("no wgpu adapter, the GPU cases are skipped: {e}"),
    }
    check_timeout(&world);
    world.barrier();
    if world.rank() == 0 {
        println!(
            "distributed checks passed on {} ranks (kNN, banks, accuracy: {scored} cases scored, \
             the others failing alike; classifier losses, sampled too, and replicas' checksums; \
             class-weight checkpoints re-sharded; failures, timeout)",
            world.size()
        );
    }
}
