//! The memory bank (`MemoryBank`, PML's CrossBatchMemory) on the GPU and on the native CPU
//! path: a model-based test against a plain host ring, mining against the bank against the
//! reference, every miner against the same miner on host references, device-buffer enqueue,
//! budgets, lowered limits and every typed error.

use crate::common;

use ndarray::{s, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::triplet_select::triplet_select;
use wgpu_metric_learning::{
    all_pairs, batch_easy_hard_pairs, batch_hard_triplets, count_triplets, mine_triplets,
    multi_similarity_pairs, pair_margin_pairs, pairwise_distances, AllPairsConfig, BankConfig,
    BatchEasyHardConfig, BatchHardConfig, Context, ContextConfig, Distance, DistanceConfig,
    Embeddings, Error, MemoryBank, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    PairwiseConfig, SelfExclusion, TripletConfig, TripletRule, TripletType,
};

/// A plain host ring: what the bank must hold after every step.
#[derive(Debug, Clone)]
struct Ring {
    capacity: usize,
    rows: Vec<(Vec<f32>, u32)>,
    head: usize,
    filled: bool,
}

impl Ring {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            rows: Vec::new(),
            head: 0,
            filled: false,
        }
    }

    fn push(&mut self, row: Vec<f32>, label: u32) -> u32 {
        let slot = self.head;
        if slot < self.rows.len() {
            self.rows[slot] = (row, label);
        } else {
            self.rows.push((row, label));
        }
        self.head = (self.head + 1) % self.capacity;
        self.filled |= self.head == 0;
        slot as u32
    }

    fn snapshot(&self, dim: usize) -> (Array2<f32>, Array1<u32>) {
        let flat: Vec<f32> = self.rows.iter().flat_map(|(r, _)| r.clone()).collect();
        let emb = Array2::from_shape_vec((self.rows.len(), dim), flat).expect("sized");
        (emb, self.rows.iter().map(|(_, l)| *l).collect())
    }
}

/// A batch of `b` rows from `seed`: small integers (exact copies, frequent distance ties).
fn batch(b: usize, dim: usize, seed: u64) -> (Array2<f32>, Array1<u32>) {
    let emb = Array2::from_shape_fn((b, dim), |(i, k)| {
        (((seed % 1000) as usize * 31 + i * 7 + k * 3) % 9) as f32 - 4.0
    });
    let labels = Array1::from_shape_fn(b, |i| (((seed % 1000) as usize + i * 5) % 4) as u32);
    (emb, labels)
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        b: usize,
        seed: u64,
    },
    Masked {
        b: usize,
        seed: u64,
        mask: u32,
    },
    Reset,
    /// A batch larger than the capacity: a typed error, nothing changes.
    TooLarge,
    /// A batch with a NaN in row `b - 1`: a typed error, nothing changes.
    NonFinite {
        b: usize,
    },
}

fn op(capacity: usize) -> impl Strategy<Value = Op> {
    let b = prop_oneof![Just(capacity), Just(1usize), 0..=capacity];
    prop_oneof![
        6 => (b.clone(), any::<u64>()).prop_map(|(b, seed)| Op::Enqueue { b, seed }),
        2 => (0..=2 * capacity, any::<u64>(), any::<u32>())
            .prop_map(|(b, seed, mask)| Op::Masked { b, seed: seed % 1000, mask }),
        1 => Just(Op::Reset),
        1 => Just(Op::TooLarge),
        1 => (1..=capacity).prop_map(|b| Op::NonFinite { b }),
    ]
}

/// Capacity, dimension, forced page size (`None`: the device's) and a sequence of steps.
fn scenario() -> impl Strategy<Value = (usize, usize, Option<usize>, Vec<Op>)> {
    (1usize..24, 1usize..7).prop_flat_map(|(capacity, dim)| {
        (
            Just(capacity),
            Just(dim),
            prop_oneof![Just(None), (1..=capacity).prop_map(Some)],
            proptest::collection::vec(op(capacity), 1..10),
        )
    })
}

/// Applies `ops` to a bank on `ctx` and to the ring, comparing the snapshot after every step;
/// after each plain enqueue, mines the batch against the bank and checks it.
fn run_scenario(ctx: &Context, capacity: usize, dim: usize, page_rows: Option<usize>, ops: &[Op]) {
    let cfg = BankConfig {
        page_rows,
        ..BankConfig::new(capacity, dim)
    };
    let mut bank = MemoryBank::<u32>::new(ctx, &cfg).expect("bank");
    let mut ring = Ring::new(capacity);
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Enqueue { b, seed } => {
                let (emb, labels) = batch(*b, dim, *seed);
                let done = bank
                    .enqueue(ctx, &MiningSet::new(&emb, &labels))
                    .expect("enqueue");
                let want: Vec<u32> = emb
                    .rows()
                    .into_iter()
                    .zip(&labels)
                    .map(|(r, &l)| ring.push(r.to_vec(), l))
                    .collect();
                assert_eq!(done.slots, want, "step {step}: slots");
                assert_eq!(done.self_exclusion, SelfExclusion::QuerySlots(want));
                check_mining(ctx, &bank, &emb, &labels, &done.self_exclusion);
            }
            Op::Masked { b, seed, mask } => {
                let (emb, labels) = batch(*b, dim, *seed);
                let mask: Array1<bool> = (0..*b).map(|i| (mask >> (i % 32)) & 1 == 1).collect();
                let chosen = mask.iter().filter(|&&m| m).count();
                let got = bank.enqueue_masked(ctx, &MiningSet::new(&emb, &labels), mask.view());
                if chosen > capacity {
                    assert!(
                        matches!(got, Err(Error::InvalidParameter { .. })),
                        "step {step}: {got:?}"
                    );
                } else {
                    let done = got.expect("masked enqueue");
                    let mut slots = Vec::new();
                    for i in (0..*b).filter(|&i| mask[i]) {
                        slots.push(ring.push(emb.row(i).to_vec(), labels[i]));
                    }
                    assert_eq!(done.slots, slots, "step {step}: masked slots");
                    let rest: Vec<usize> = (0..*b).filter(|&i| !mask[i]).collect();
                    assert_eq!(done.query_rows, rest);
                    assert_eq!(done.self_exclusion, SelfExclusion::None);
                }
            }
            Op::Reset => {
                bank.reset();
                ring = Ring::new(capacity);
            }
            Op::TooLarge => {
                let (emb, labels) = batch(capacity + 1, dim, 1);
                let got = bank.enqueue(ctx, &MiningSet::new(&emb, &labels));
                assert!(
                    matches!(
                        got,
                        Err(Error::InvalidParameter {
                            what: "batch size",
                            ..
                        })
                    ),
                    "step {step}: {got:?}"
                );
            }
            Op::NonFinite { b } => {
                let (mut emb, labels) = batch(*b, dim, 2);
                emb[[b - 1, dim - 1]] = f32::NAN;
                let got = bank.enqueue(ctx, &MiningSet::new(&emb, &labels));
                match got {
                    Err(Error::NonFinite { row, col, .. }) => {
                        assert_eq!((row, col), (b - 1, dim - 1), "names the value")
                    }
                    other => panic!("step {step}: expected NonFinite, got {other:?}"),
                }
            }
        }
        let snap = bank.snapshot(ctx).expect("snapshot");
        let (emb, labels) = ring.snapshot(dim);
        assert_eq!(snap.embeddings, emb, "step {step} ({op:?}): embeddings");
        assert_eq!(snap.labels, labels, "step {step} ({op:?}): labels");
        assert_eq!(
            (bank.len(), bank.head(), bank.is_filled()),
            (ring.rows.len(), ring.head, ring.filled),
            "step {step}: len, head, filled"
        );
    }
}

/// Mines the batch against the bank (semihard, Euclidean) and checks triplets and count
/// against the reference on the bank's snapshot, with distances from the same context.
fn check_mining(
    ctx: &Context,
    bank: &MemoryBank<u32>,
    emb: &Array2<f32>,
    labels: &Array1<u32>,
    exclusion: &SelfExclusion,
) {
    let cfg = TripletConfig {
        self_exclusion: exclusion.clone(),
        ..TripletConfig::margin_miner(TripletType::Semihard)
    };
    let queries = MiningSet::new(emb, labels);
    let refs = bank.refs();
    let got = mine_triplets(ctx, &queries, Some(&refs), &cfg).expect("mine against the bank");
    let snap = bank.snapshot(ctx).expect("snapshot");
    let slots = match exclusion {
        SelfExclusion::QuerySlots(s) => s.clone(),
        _ => vec![u32::MAX; labels.len()],
    };
    let distances = pairwise_distances(
        ctx,
        emb.view(),
        snap.embeddings.view(),
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
    .expect("distances")
    .values;
    let want = triplet_select(
        labels.as_slice().expect("contiguous"),
        snap.labels.as_slice().expect("contiguous"),
        &slots,
        Some(distances.view()),
        &cfg.rule,
        false,
    );
    assert_eq!(got.indices, want, "triplets against the bank");
    let n = count_triplets(ctx, &queries, Some(&refs), &cfg).expect("count");
    assert_eq!(n.count, want.nrows() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(24)))]

    #[test]
    fn memory_bank_gpu_matches_a_host_ring((capacity, dim, page_rows, ops) in scenario()) {
        if let Some(ctx) = common::shared_gpu() {
            run_scenario(ctx, capacity, dim, page_rows, &ops);
        }
    }

    #[test]
    fn memory_bank_native_cpu_matches_a_host_ring((capacity, dim, page_rows, ops) in scenario()) {
        run_scenario(&Context::native_cpu(None), capacity, dim, page_rows, &ops);
    }
}

/// A bank of `capacity` rows filled by three batches of `b` (wrapping when `3b > capacity`).
fn filled_bank(
    ctx: &Context,
    cfg: &BankConfig,
    b: usize,
) -> (MemoryBank<u32>, Array2<f32>, Array1<u32>, SelfExclusion) {
    let mut bank = MemoryBank::new(ctx, cfg).expect("bank");
    let mut last = None;
    for seed in 0..3 {
        let (emb, labels) = batch(b, cfg.dim, seed);
        let done = bank
            .enqueue(ctx, &MiningSet::new(&emb, &labels))
            .expect("enqueue");
        last = Some((emb, labels, done.self_exclusion));
    }
    let (emb, labels, exclusion) = last.expect("three batches");
    (bank, emb, labels, exclusion)
}

/// Every miner against the bank gives what it gives against the same rows as host arrays.
fn every_miner_agrees(ctx: &Context, cfg: &BankConfig, b: usize) {
    let (bank, emb, labels, exclusion) = filled_bank(ctx, cfg, b);
    let snap = bank.snapshot(ctx).expect("snapshot");
    let queries = MiningSet::new(&emb, &labels);
    let on_bank = bank.refs();
    let on_host = MiningSet::new(snap.embeddings.view(), snap.labels.view());
    for refs in [&on_bank, &on_host] {
        assert_eq!(refs.labels.len(), bank.len());
    }
    let both = |f: &dyn Fn(&MiningSet<'_, u32>) -> String| {
        assert_eq!(f(&on_bank), f(&on_host), "bank vs host references");
    };
    for distance in [Distance::Euclidean, Distance::Cosine] {
        let d = DistanceConfig {
            distance,
            normalize: true,
        };
        for kind in [TripletType::All, TripletType::Hard, TripletType::Easy] {
            let cfg = TripletConfig {
                self_exclusion: exclusion.clone(),
                distance: d,
                ..TripletConfig::margin_miner(kind)
            };
            both(&|r| {
                format!(
                    "{:?}",
                    mine_triplets(ctx, &queries, Some(r), &cfg).map(|t| t.indices)
                )
            });
        }
        let all_valid = TripletConfig {
            self_exclusion: exclusion.clone(),
            rule: TripletRule::AllValid,
            ..Default::default()
        };
        both(&|r| {
            format!(
                "{:?}",
                mine_triplets(ctx, &queries, Some(r), &all_valid).map(|t| t.indices)
            )
        });
        both(&|r| {
            format!(
                "{:?}",
                all_pairs(
                    ctx,
                    &queries,
                    Some(r),
                    &AllPairsConfig {
                        self_exclusion: exclusion.clone(),
                        ..Default::default()
                    },
                )
                .map(|p| (p.positives, p.negatives))
            )
        });
        let pm = PairMarginConfig {
            distance: d,
            self_exclusion: exclusion.clone(),
            ..Default::default()
        };
        both(&|r| {
            format!(
                "{:?}",
                pair_margin_pairs(ctx, &queries, Some(r), &pm).map(|p| (p.positives, p.negatives))
            )
        });
        let ms = MultiSimilarityConfig {
            distance: d,
            self_exclusion: exclusion.clone(),
            ..Default::default()
        };
        both(&|r| {
            format!(
                "{:?}",
                multi_similarity_pairs(ctx, &queries, Some(r), &ms)
                    .map(|p| (p.positives, p.negatives))
            )
        });
        let eh = BatchEasyHardConfig {
            distance: d,
            self_exclusion: exclusion.clone(),
            ..Default::default()
        };
        both(&|r| {
            format!(
                "{:?}",
                batch_easy_hard_pairs(ctx, &queries, Some(r), &eh)
                    .map(|p| (p.positives, p.negatives))
            )
        });
        let bh = BatchHardConfig {
            distance: d,
            self_exclusion: exclusion.clone(),
            ..Default::default()
        };
        both(&|r| {
            format!(
                "{:?}",
                batch_hard_triplets(ctx, &queries, Some(r), &bh).map(|t| t.indices)
            )
        });
    }
}

#[test]
fn memory_bank_every_miner_matches_host_references_across_pages() {
    let cfg = BankConfig {
        page_rows: Some(7),
        ..BankConfig::new(50, 6)
    };
    if let Some(ctx) = common::shared_gpu() {
        every_miner_agrees(ctx, &cfg, 20);
    }
    every_miner_agrees(&Context::native_cpu(None), &cfg, 20);
}

#[test]
fn memory_bank_pages_itself_under_a_small_binding_limit() {
    // 16 KiB bindings hold 256 rows of 16 floats: a 600-row bank needs 3 pages.
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: 16 << 10,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let ctx = common::gpu_context_with(ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits");
    let cfg = BankConfig::new(600, 16);
    let bank = MemoryBank::<u32>::new(&ctx, &cfg).expect("bank");
    assert_eq!(bank.page_rows(), 256, "one page per binding");
    drop(bank);
    every_miner_agrees(&ctx, &cfg, 250);
}

#[test]
fn memory_bank_peak_bytes_stay_under_a_tight_budget() {
    // The bank (2000 × 16 floats + norms: 136 KB) and the mining chunks share 256 KiB.
    let budget = 256 << 10;
    let Some(ctx) = common::gpu_context(Some(budget)) else {
        return;
    };
    for ctx in [&ctx, &Context::native_cpu(Some(budget))] {
        ctx.reset_peak();
        {
            let cfg = BankConfig {
                page_rows: Some(300),
                ..BankConfig::new(2000, 16)
            };
            let (bank, emb, labels, exclusion) = filled_bank(ctx, &cfg, 700);
            let cfg = TripletConfig {
                self_exclusion: exclusion,
                ..TripletConfig::margin_miner(TripletType::Semihard)
            };
            let queries = MiningSet::new(&emb, &labels);
            let n = count_triplets(ctx, &queries, Some(&bank.refs()), &cfg).expect("count");
            assert!(n.count > 0);
        }
        let mem = ctx.memory();
        assert!(
            mem.peak_bytes <= budget && mem.peak_bytes >= 2000 * 16 * 4,
            "peak {} B, budget {budget} B",
            mem.peak_bytes
        );
        assert_eq!(mem.current_bytes, 0, "the bank and every chunk released");
    }
}

#[test]
fn memory_bank_enqueue_buffer_matches_host_enqueue() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let Some((device, queue)) = ctx.wgpu_device() else {
        panic!("a GPU context has a device");
    };
    for dim in [5, 8] {
        let (emb, labels) = batch(9, dim, 3);
        // The rows sit 16 bytes into the source, as in a larger application buffer.
        let mut bytes = vec![0u8; 16];
        bytes.extend(emb.iter().flat_map(|v| v.to_le_bytes()));
        let source = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("test source"),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&source, 0, &bytes);
        let cfg = BankConfig {
            page_rows: Some(4),
            ..BankConfig::new(12, dim)
        };
        let mut from_buffer = MemoryBank::<u32>::new(ctx, &cfg).expect("bank");
        let mut from_host = MemoryBank::<u32>::new(ctx, &cfg).expect("bank");
        for _ in 0..2 {
            let a = from_buffer
                .enqueue_buffer(ctx, &source, 16, labels.view())
                .expect("enqueue from a buffer");
            let b = from_host
                .enqueue(ctx, &MiningSet::new(&emb, &labels))
                .expect("enqueue");
            // The same placement; the traffic differs (the rows never cross the host).
            assert_eq!(
                (a.slots, a.query_rows, a.self_exclusion),
                (b.slots, b.query_rows, b.self_exclusion)
            );
            // Uploaded: the norm kernel's parameters and (sentinel mode) its output's fill.
            let rows = (4 * emb.len()) as u64;
            assert!(a.transfers.bytes_up < rows, "{:?}", a.transfers);
            assert!(b.transfers.bytes_up >= rows, "{:?}", b.transfers);
        }
        let (a, b) = (from_buffer.snapshot(ctx), from_host.snapshot(ctx));
        assert_eq!(a.expect("snapshot"), b.expect("snapshot"), "dim {dim}");

        // A NaN in the source is found on the device, named, and changes nothing.
        let mut bad = bytes.clone();
        let at = 16 + 4 * (2 * dim + 1);
        bad[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        queue.write_buffer(&source, 0, &bad);
        let got = from_buffer.enqueue_buffer(ctx, &source, 16, labels.view());
        assert!(
            matches!(got, Err(Error::NonFinite { row: 2, col: 1, .. })),
            "{got:?}"
        );
        let after = from_buffer.snapshot(ctx).expect("snapshot");
        assert_eq!(
            after,
            from_host.snapshot(ctx).expect("snapshot"),
            "unchanged"
        );

        for (offset, n, what) in [
            (2, 9, "misaligned offset"),
            (16, 10, "past the end"),
            (0, 13, "more rows than the capacity"),
        ] {
            let labels = Array1::from_elem(n, 0u32);
            let got = from_buffer.enqueue_buffer(ctx, &source, offset, labels.view());
            assert!(
                matches!(got, Err(Error::InvalidParameter { .. })),
                "{what}: {got:?}"
            );
        }
    }
    let no_copy = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("no COPY_SRC"),
        size: 64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(4, 4)).expect("bank");
    let got = bank.enqueue_buffer(ctx, &no_copy, 0, Array1::zeros(2).view());
    assert!(
        matches!(
            got,
            Err(Error::InvalidParameter {
                what: "embeddings",
                ..
            })
        ),
        "{got:?}"
    );
}

/// Typed errors shared by both paths; the bank is unchanged after each.
fn typed_errors(ctx: &Context) {
    for (capacity, dim) in [(0, 4), (4, 0)] {
        let got = MemoryBank::<u32>::new(ctx, &BankConfig::new(capacity, dim));
        assert!(
            matches!(got, Err(Error::InvalidParameter { .. })),
            "{got:?}"
        );
    }
    let huge = MemoryBank::<u32>::new(ctx, &BankConfig::new(1 << 30, 1024));
    assert!(matches!(huge, Err(Error::OverBudget { .. })), "{huge:?}");

    let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(8, 3)).expect("bank");
    let (emb, labels) = batch(5, 3, 0);
    bank.enqueue(ctx, &MiningSet::new(&emb, &labels))
        .expect("enqueue");
    let before = bank.snapshot(ctx).expect("snapshot");
    let wrong_dim = Array2::<f32>::zeros((2, 4));
    let got = bank.enqueue(ctx, &MiningSet::new(&wrong_dim, labels.slice(s![..2])));
    assert!(
        matches!(
            got,
            Err(Error::Shape {
                what: "embeddings",
                ..
            })
        ),
        "{got:?}"
    );
    let got = bank.enqueue(ctx, &MiningSet::new(&emb, labels.slice(s![..4])));
    assert!(
        matches!(got, Err(Error::Shape { what: "labels", .. })),
        "{got:?}"
    );
    let mask = Array1::from_elem(4, true);
    let got = bank.enqueue_masked(ctx, &MiningSet::new(&emb, &labels), mask.view());
    assert!(
        matches!(
            got,
            Err(Error::Shape {
                what: "enqueue_mask",
                ..
            })
        ),
        "{got:?}"
    );
    let transposed = emb.t().to_owned();
    let got = bank.enqueue(ctx, &MiningSet::new(transposed.t(), &labels));
    assert!(got.is_ok(), "a transposed view is accepted: {got:?}");
    bank.reset();
    bank.enqueue(ctx, &MiningSet::new(&emb, &labels))
        .expect("enqueue");
    assert_eq!(
        bank.snapshot(ctx).expect("snapshot"),
        before,
        "same rows again"
    );

    // The bank's rows are queries too: mining them against themselves is mining their copy.
    let refs = bank.refs();
    let Some(Embeddings::Host(_) | Embeddings::Bank(_)) = refs.embeddings else {
        panic!("the bank's references carry embeddings");
    };
    let hard = TripletConfig::margin_miner(TripletType::Hard);
    let got = mine_triplets(ctx, &refs, None, &hard).expect("the bank as queries");
    let snap = bank.snapshot(ctx).expect("snapshot");
    let copy = MiningSet::new(&snap.embeddings, &snap.labels);
    let want = mine_triplets(ctx, &copy, None, &hard).expect("its copy");
    assert_eq!(got.indices, want.indices);
    let wrong = Array2::<f32>::zeros((2, 5));
    let two = Array1::from_elem(2, 0u32);
    let q = MiningSet::new(&wrong, &two);
    let got = mine_triplets(
        ctx,
        &q,
        Some(&refs),
        &TripletConfig::margin_miner(TripletType::Hard),
    );
    assert!(
        matches!(got, Err(Error::Shape { what: "refs", .. })),
        "{got:?}"
    );
}

#[test]
fn memory_bank_typed_errors() {
    typed_errors(&Context::native_cpu(None));
    let Some(gpu) = common::shared_gpu() else {
        return;
    };
    typed_errors(gpu);

    // A GPU bank cannot be used with another context, native or wgpu.
    let mut bank = MemoryBank::<u32>::new(gpu, &BankConfig::new(8, 3)).expect("bank");
    let (emb, labels) = batch(4, 3, 0);
    bank.enqueue(gpu, &MiningSet::new(&emb, &labels))
        .expect("enqueue");
    let native = Context::native_cpu(None);
    let other = common::gpu_context(None).expect("a second GPU context");
    let queries = MiningSet::new(&emb, &labels);
    let cfg = TripletConfig::margin_miner(TripletType::Semihard);
    for ctx in [&native, &other] {
        let got = mine_triplets(ctx, &queries, Some(&bank.refs()), &cfg);
        assert!(
            matches!(
                got,
                Err(Error::InvalidParameter {
                    what: "context",
                    ..
                })
            ),
            "{got:?}"
        );
        let got = bank.enqueue(ctx, &MiningSet::new(&emb, &labels));
        assert!(
            matches!(
                got,
                Err(Error::InvalidParameter {
                    what: "context",
                    ..
                })
            ),
            "{got:?}"
        );
        let got = bank.snapshot(ctx);
        assert!(
            matches!(
                got,
                Err(Error::InvalidParameter {
                    what: "context",
                    ..
                })
            ),
            "{got:?}"
        );
    }
    assert_eq!(bank.len(), 4, "unchanged");
}

/// An empty bank (new, or after a reset) is a valid reference set with nothing in it.
fn empty_bank_mines_nothing(ctx: &Context) {
    let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(6, 3)).expect("bank");
    let (emb, labels) = batch(4, 3, 1);
    for round in 0..2 {
        let queries = MiningSet::new(&emb, &labels);
        let refs = bank.refs();
        let cfg = TripletConfig::margin_miner(TripletType::All);
        let t = mine_triplets(ctx, &queries, Some(&refs), &cfg).expect("mine");
        assert_eq!(t.len(), 0, "round {round}");
        let bh = BatchHardConfig::default();
        let t = batch_hard_triplets(ctx, &queries, Some(&refs), &bh).expect("batch hard");
        assert_eq!(t.len(), 0, "round {round}");
        let p = pair_margin_pairs(ctx, &queries, Some(&refs), &PairMarginConfig::default())
            .expect("pair margin");
        assert_eq!((p.positives.nrows(), p.negatives.nrows()), (0, 0));
        assert_eq!(
            bank.snapshot(ctx).expect("snapshot").embeddings.dim(),
            (0, 3)
        );
        bank.enqueue(ctx, &MiningSet::new(&emb, &labels))
            .expect("enqueue");
        bank.reset();
        assert!(bank.is_empty() && !bank.is_filled() && bank.head() == 0);
    }
}

#[test]
fn memory_bank_empty_refs_mine_nothing() {
    empty_bank_mines_nothing(&Context::native_cpu(None));
    if let Some(ctx) = common::shared_gpu() {
        empty_bank_mines_nothing(ctx);
    }
}
