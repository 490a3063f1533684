//! One context shared by many threads: `Context` is `Send + Sync`, and 8 threads running
//! mixed operations (distances, kNN, margin mining, the batch-hard miner, accuracy, and bank
//! enqueue + mining behind a lock) get exactly the answers of a sequential run, without
//! deadlock, and leave nothing allocated. `WML_STRESS_OPS` sets the operations per thread
//! (default 50).

use crate::common;

use std::sync::Mutex;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, batch_hard_triplets, knn, mine_triplets, pairwise_distances, AccuracyConfig,
    BankConfig, Context, DistanceConfig, KnnConfig, MemoryBank, MiningSet, PairwiseConfig,
    TripletConfig, TripletType,
};

const THREADS: usize = 8;
const DIM: usize = 16;
const BANK: usize = 200;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_context_and_the_bank_are_send_and_sync() {
    assert_send_sync::<Context>();
    assert_send_sync::<MemoryBank<u32>>();
    assert_send_sync::<MemoryBank<i64>>();
}

/// Input `i`: a batch of 40 rows in 5 classes, and 150 references.
fn input(i: usize) -> (Array2<f32>, Array1<u32>, Array2<f32>) {
    let v = |r: usize, k: usize, salt: usize| {
        let h = (r * 31 + k * 17 + i * 101 + salt).wrapping_mul(2_654_435_761) % 1000;
        ((r % 5) as f32 + k as f32 * 0.2).sin() + h as f32 * 1e-3
    };
    let x = Array2::from_shape_fn((40, DIM), |(r, k)| v(r, k, 0));
    let y = Array1::from_shape_fn(40, |r| (r % 5) as u32);
    let refs = Array2::from_shape_fn((150, DIM), |(r, k)| v(r, k, 7));
    (x, y, refs)
}

/// Operation `op` of the mix on input `i`, as comparable text (floats by their bits).
fn run(ctx: &Context, op: usize, i: usize) -> String {
    let (x, y, refs) = input(i);
    let set = MiningSet::new(&x, &y);
    match op % 5 {
        0 => {
            let d = pairwise_distances(
                ctx,
                x.view(),
                refs.view(),
                &PairwiseConfig {
                    distance: DistanceConfig::default(),
                    ..Default::default()
                },
            )
            .expect("distances");
            format!("{:?}", d.values.mapv(f32::to_bits))
        }
        1 => {
            let cfg = KnnConfig {
                k: 12,
                ..Default::default()
            };
            let found = knn(ctx, x.view(), refs.view(), &cfg).expect("knn");
            format!("{:?} {:?}", found.indices, found.scores.mapv(f32::to_bits))
        }
        2 => {
            let cfg = TripletConfig::margin_miner(TripletType::Semihard);
            let t = mine_triplets(ctx, &set, None, &cfg).expect("mine");
            format!("{:?}", t.indices)
        }
        3 => {
            let t = batch_hard_triplets(ctx, &set, None, &Default::default()).expect("hard");
            format!("{:?}", t.indices)
        }
        _ => {
            let acc = accuracy(
                ctx,
                &MiningSet::new(&x, &y),
                None,
                &AccuracyConfig::default(),
            )
            .expect("accuracy");
            format!("{:?}", acc.metrics)
        }
    }
}

/// Contexts made and dropped on several threads while others run kernels on a context of
/// their own and read the results back: a user's process with a trainer, a data loader and
/// an evaluation thread, each making its own context. This is the pattern that hung or
/// crashed NVIDIA's Vulkan driver until device creation, pipeline compilation and device
/// destruction were serialised (`lifecycle_lock`, RELIABILITY.md). Every answer must be the
/// bits of a sequential run on a context of the same adapter. `WML_CHURN_CONTEXTS` sets the
/// contexts each churning thread makes (default 3; the GPU hunt uses hundreds).
#[test]
fn contexts_made_and_dropped_beside_running_kernels() {
    const CHURNERS: usize = 4;
    const WORKERS: usize = 4;
    let per_thread: usize = std::env::var("WML_CHURN_CONTEXTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let Some(first) = common::gpu_context(None) else {
        return;
    };
    let expected: Vec<String> = (0..5).map(|op| run(&first, op, op)).collect();
    let churned = std::sync::atomic::AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let worker_ops = std::thread::scope(|scope| {
        let churners: Vec<_> = (0..CHURNERS)
            .map(|t| {
                let (expected, churned) = (&expected, &churned);
                scope.spawn(move || {
                    for n in 0..per_thread {
                        let ctx = common::gpu_context(None).expect("an adapter, as before");
                        let op = (t + n) % 5;
                        assert_eq!(run(&ctx, op, op), expected[op], "churner {t}, context {n}");
                        drop(ctx);
                        churned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let workers: Vec<_> = (0..WORKERS)
            .map(|t| {
                let (expected, churned) = (&expected, &churned);
                scope.spawn(move || {
                    let ctx = common::gpu_context(None).expect("an adapter, as before");
                    let mut n = 0;
                    // At least one operation each, then until every churner is done.
                    while n == 0
                        || churned.load(std::sync::atomic::Ordering::Relaxed)
                            < CHURNERS * per_thread
                    {
                        let op = (t + n) % 5;
                        assert_eq!(run(&ctx, op, op), expected[op], "worker {t}, op {n}");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for c in churners {
            c.join().expect("a churning thread panicked");
        }
        workers
            .into_iter()
            .map(|w| w.join().expect("a working thread panicked"))
            .sum::<usize>()
    });
    eprintln!(
        "{} contexts made and dropped beside {worker_ops} operations in {:.1} s on {}",
        CHURNERS * per_thread,
        started.elapsed().as_secs_f64(),
        first.device_name()
    );
}

/// The test that [`first_contexts_of_a_process_made_by_many_threads`] runs in a child
/// process of its own, by name.
const FIRST_CONTEXTS: &str = "concurrency::first_contexts_of_a_process_made_by_many_threads";

/// A process whose first contexts are made by 8 threads at once, each then running an
/// operation and dropping its context: a fresh process each time, since the library's
/// shared Vulkan instance is made once per process. This is what crashed NVIDIA's driver
/// (concurrent physical-device enumeration on a new instance; RELIABILITY.md). The test
/// runs itself as a child process `WML_FIRST_CONTEXT_RUNS` times (default 3), each under a
/// watchdog (`WML_FIRST_CONTEXT_TIMEOUT` seconds, default 60), and every answer must be the
/// bits of a context made afterwards. With the guard off (`WML_DEVICE_LOCK=off`) the first
/// child hung on an H200; with it, ten of ten passed.
#[test]
fn first_contexts_of_a_process_made_by_many_threads() {
    if std::env::var_os("WML_FIRST_CONTEXTS_CHILD").is_some() {
        return first_contexts_child();
    }
    // Whether there is an adapter (or a skip, without WML_REQUIRE_GPU=1), before any child.
    if common::gpu_context(None).is_none() {
        return;
    }
    let runs: usize = std::env::var("WML_FIRST_CONTEXT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // Shorter than the GPU hunt's watchdog (120 s), which then finds the hung child alive
    // and takes its stacks.
    let child_limit: u64 = std::env::var("WML_FIRST_CONTEXT_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    for run in 0..runs {
        let (status, text) = run_child(
            FIRST_CONTEXTS,
            &[("WML_FIRST_CONTEXTS_CHILD", "1")],
            child_limit,
        );
        match status {
            Some(s) if s.success() && text.contains("1 passed") => {}
            Some(s) => panic!("child {run} of {runs} failed ({s}):\n{text}"),
            None => panic!("child {run} of {runs} hung for {child_limit} s:\n{text}"),
        }
    }
}

/// This test binary's test `name` run alone in a child process with `env`, stopped after
/// `limit` seconds: its status (`None` if it was stopped) and its stdout and stderr.
fn run_child(
    name: &str,
    env: &[(&str, &str)],
    limit: u64,
) -> (Option<std::process::ExitStatus>, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the child process starts");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            break Some(status);
        }
        if started.elapsed() > std::time::Duration::from_secs(limit) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("the child's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (status, text)
}

/// In the child: 8 threads released at once, each making its context and running one
/// operation; then the answers compared with those of a context made afterwards.
fn first_contexts_child() {
    const THREADS: usize = 8;
    let barrier = std::sync::Barrier::new(THREADS);
    let answers: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let ctx = common::gpu_context(None).expect("an adapter, as the parent found");
                    run(&ctx, t % 5, t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a thread panicked"))
            .collect()
    });
    let after = common::gpu_context(None).expect("an adapter");
    for (t, got) in answers.iter().enumerate() {
        assert_eq!(*got, run(&after, t % 5, t), "thread {t}");
    }
}

const AT_EXIT: &str = "concurrency::devices_still_in_use_at_exit_are_destroyed_before_it";

/// A process that exits holding a context (in a static, a Python module, an unjoined
/// thread) still has its device when the exit reaches the driver's libraries, which on NVIDIA
/// (580.159.04, H200) died of SIGSEGV there in 3 of 9 runs of the integration tests. The exit
/// destroys such devices and the shared instance by hand first (`WML_EXIT_TEARDOWN`, `auto`
/// = NVIDIA only). Here the test runs itself as a child `WML_EXIT_RUNS` times (default 2) with
/// the teardown on every Vulkan device (`all`, unless `WML_EXIT_TEARDOWN` says otherwise):
/// the child holds one context for good and drops another, and must exit with status 0
/// having destroyed the held device and the instance. lavapipe forgives the driver's race, so
/// here this shows only that the teardown itself is sound; the GPU hunt's `exit` stage runs
/// it on NVIDIA with and without it.
#[test]
fn devices_still_in_use_at_exit_are_destroyed_before_it() {
    if std::env::var_os("WML_EXIT_CHILD").is_some() {
        return exit_child();
    }
    let Some(ctx) = common::gpu_context(None) else {
        return;
    };
    let mode = std::env::var("WML_EXIT_TEARDOWN").unwrap_or_else(|_| "all".into());
    // Where the exit must destroy the held device by hand: every Vulkan device with `all`,
    // NVIDIA's with `auto`.
    let vulkan = ctx
        .adapter_info()
        .is_some_and(|i| i.backend == wgpu::Backend::Vulkan);
    let by_hand = vulkan
        && ctx
            .adapter_info()
            .is_some_and(|i| mode == "all" || (mode == "auto" && i.vendor == 0x10de));
    drop(ctx);
    let runs: usize = std::env::var("WML_EXIT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let child_env = [
        ("WML_EXIT_CHILD", "1"),
        ("WML_EXIT_TEARDOWN", mode.as_str()),
        ("WML_EXIT_TEARDOWN_REPORT", "1"),
    ];
    let mut failures = Vec::new();
    for run in 0..runs {
        let (status, text) = run_child(AT_EXIT, &child_env, 60);
        // Every child runs: the GPU hunt counts how many fail.
        match status {
            Some(s) if s.success() && text.contains("1 passed") => {}
            Some(s) => failures.push(format!("child {run} failed ({s}):\n{text}")),
            None => failures.push(format!("child {run} hung for 60 s:\n{text}")),
        }
        if by_hand && !text.contains("wml exit: 1 devices destroyed by hand") {
            failures.push(format!(
                "child {run}: the exit did not destroy the held device:\n{text}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} children failed; the first: {}",
        failures.len(),
        failures[0]
    );
    // A destruction stuck in the driver: the exit must not wait for it for good, nor go on
    // beside it; with glibc the process ends with the status it was exiting with.
    let (status, text) = run_child(
        AT_EXIT,
        &[
            ("WML_EXIT_CHILD", "1"),
            ("WML_EXIT_CHILD_STATUS", "3"),
            ("WML_EXIT_TEARDOWN", "stall"),
            ("WML_EXIT_TEARDOWN_REPORT", "1"),
        ],
        60,
    );
    assert_eq!(status.and_then(|s| s.code()), Some(3), "{text}");
    if vulkan && cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(
            text.contains("wml exit: the destruction did not finish; ending with status 3"),
            "{text}"
        );
    }
}

/// In the child: one context held for good (with a result computed on it), another made,
/// used and dropped (parked, destroyed by the reaper at exit), the same answer from both.
fn exit_child() {
    let held = common::gpu_context(None).expect("an adapter, as the parent found");
    let answer = run(&held, 1, 0);
    let dropped = common::gpu_context(None).expect("an adapter");
    assert_eq!(run(&dropped, 1, 0), answer);
    drop(dropped);
    // Never dropped, as a context in a static is not.
    std::mem::forget(held);
    if let Some(code) = std::env::var("WML_EXIT_CHILD_STATUS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::process::exit(code);
    }
}

/// The ring-buffer model of the bank: slot contents as `(label, first float)`.
struct Model {
    slots: Vec<(u32, f32)>,
    head: usize,
}

#[test]
fn eight_threads_of_mixed_operations_match_a_sequential_run() {
    let contexts = [
        Some(Context::native_cpu(Some(256 << 20))),
        common::gpu_context(Some(256 << 20)),
    ];
    for ctx in contexts.into_iter().flatten() {
        stress(&ctx);
    }
}

fn stress(ctx: &Context) {
    let ops: usize = std::env::var("WML_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let inputs = 7;
    let expected: Vec<Vec<String>> = (0..5)
        .map(|op| (0..inputs).map(|i| run(ctx, op, i)).collect())
        .collect();
    let bank = Mutex::new((
        MemoryBank::<u32>::new(ctx, &BankConfig::new(BANK, DIM)).expect("bank"),
        Model {
            slots: Vec::new(),
            head: 0,
        },
    ));
    let baseline = ctx.memory().current_bytes;
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (expected, bank) = (&expected, &bank);
            scope.spawn(move || {
                for n in 0..ops {
                    let (op, i) = (t + n, (t * 3 + n) % inputs);
                    if n % 6 == 5 {
                        enqueue_and_mine(ctx, bank, t, n);
                        continue;
                    }
                    assert_eq!(
                        run(ctx, op, i),
                        expected[op % 5][i],
                        "thread {t}, operation {n}"
                    );
                }
            });
        }
    });
    let (bank, model) = bank
        .into_inner()
        .expect("no thread panicked holding the bank");
    let snap = bank.snapshot(ctx).expect("snapshot");
    let got: Vec<(u32, f32)> = snap
        .labels
        .iter()
        .zip(snap.embeddings.rows())
        .map(|(&l, r)| (l, r[0]))
        .collect();
    assert_eq!(got, model.slots, "the bank matches its model");
    assert_eq!(
        ctx.memory().current_bytes,
        baseline,
        "nothing else left allocated"
    );
    eprintln!(
        "{THREADS} threads x {ops} operations in {:.1} s on {}",
        started.elapsed().as_secs_f64(),
        ctx.device_name()
    );
}

/// Under the lock: enqueue a batch tagged with `(t, n)`, update the model, and mine every
/// valid triplet of the batch against the bank; the labels-only answer is checked against
/// the native path on the model's labels.
fn enqueue_and_mine(ctx: &Context, bank: &Mutex<(MemoryBank<u32>, Model)>, t: usize, n: usize) {
    let mut guard = bank.lock().expect("bank lock");
    let (bank, model) = &mut *guard;
    let rows = 30;
    let tag = (t * 1000 + n) as f32;
    let x = Array2::from_shape_fn((rows, DIM), |(r, k)| tag + r as f32 + k as f32 * 1e-3);
    let y = Array1::from_shape_fn(rows, |r| ((t + r) % 4) as u32);
    let done = bank.enqueue(ctx, &MiningSet::new(&x, &y)).expect("enqueue");
    for r in 0..rows {
        let slot = (model.head + r) % BANK;
        let entry = (y[r], x[[r, 0]]);
        match model.slots.get_mut(slot) {
            Some(s) => *s = entry,
            None => model.slots.push(entry),
        }
    }
    model.head = (model.head + rows) % BANK;
    let cfg = TripletConfig {
        self_exclusion: done.self_exclusion.clone(),
        ..Default::default()
    };
    let batch = MiningSet::from_labels(&y);
    let got = mine_triplets(ctx, &batch, Some(&bank.refs()), &cfg).expect("mine the bank");
    let labels = Array1::from_iter(model.slots.iter().map(|s| s.0));
    let native = Context::native_cpu(None);
    let want = mine_triplets(
        &native,
        &batch,
        Some(&MiningSet::from_labels(&labels)),
        &cfg,
    )
    .expect("native");
    assert_eq!(
        got.indices, want.indices,
        "thread {t}, operation {n}: bank mining"
    );
}
