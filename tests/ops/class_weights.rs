//! Class weights that outlive a call (`weights_step`, `save_weights_shard`, `load_weights`,
//! `export_weights_npy`): torch's SGD and AdamW against their formulas in f64, the same bits
//! on any layout; checkpoints saved by N shards loading on M (re-sharding) with the optimizer's
//! state, a resumed run equal to an unbroken one, and every damaged or mismatched file a typed
//! error.

use crate::common;

use std::path::{Path, PathBuf};

use ndarray::{s, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::weights_step as reference;
use wgpu_metric_learning::{
    export_weights_npy, load_weights, save_weights, save_weights_manifest, save_weights_shard,
    weights_step, weights_step_plan, ClassifierKind, Context, Error, OptimizerState, ShardRecord,
    WeightOptimizer, WeightsShard,
};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wml-class-weights-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Values from `seed`, each distinct, some negative.
fn array(shape: (usize, usize), seed: u64) -> Array2<f32> {
    Array2::from_shape_fn(shape, |(i, j)| {
        let x = (seed.wrapping_mul(7919) as usize + i * 131 + j * 17) % 1009;
        (x as f32 - 500.0) / 250.0
    })
}

fn optimizer() -> impl Strategy<Value = WeightOptimizer> {
    prop_oneof![
        (0.0f32..1.0, 0.0f32..0.99, 0.0f32..0.5, 0.0f32..0.1).prop_map(|(lr, m, damp, wd)| {
            WeightOptimizer::Sgd {
                lr,
                momentum: m,
                dampening: damp,
                weight_decay: wd,
                nesterov: false,
            }
        }),
        (0.0f32..1.0, 0.01f32..0.99, 0.0f32..0.1).prop_map(|(lr, m, wd)| {
            WeightOptimizer::Sgd {
                lr,
                momentum: m,
                dampening: 0.0,
                weight_decay: wd,
                nesterov: true,
            }
        }),
        (
            1e-4f32..0.1,
            0.0f32..0.99,
            0.5f32..0.9999,
            1e-8f32..1e-3,
            0.0f32..0.1
        )
            .prop_map(
                |(lr, beta1, beta2, eps, weight_decay)| WeightOptimizer::AdamW {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay
                }
            ),
        Just(WeightOptimizer::sgd(0.1, 0.0)),
        Just(WeightOptimizer::default()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64)))]

    /// Several steps against torch's formulas in f64, on shapes off every split (empty too).
    #[test]
    fn steps_match_torch_formulas(
        rows in 0usize..40, cols in 0usize..40, steps in 1u64..5, seed in any::<u64>(),
        opt in optimizer(),
    ) {
        let ctx = Context::native_cpu(None);
        let mut w = array((rows, cols), seed);
        let mut w64 = w.mapv(f64::from);
        let (mut state, mut bufs) = (OptimizerState::new(), Vec::new());
        for step in 1..=steps {
            let g = array((rows, cols), seed ^ step);
            weights_step(&ctx, w.view_mut(), g.view(), &mut state, &opt).expect("step");
            reference::weights_step(&mut w64, &g.mapv(f64::from), &mut bufs, step, &opt);
        }
        prop_assert_eq!(state.steps(), steps);
        prop_assert_eq!(state.buffers().len(), opt.buffers());
        let scale = w64.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (a, b) in w.iter().zip(&w64) {
            prop_assert!((f64::from(*a) - b).abs() <= 2e-6 * scale, "{} vs {}", a, b);
        }
        for (mine, theirs) in state.buffers().iter().zip(&bufs) {
            let scale = theirs.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            for (a, b) in mine.iter().zip(theirs) {
                prop_assert!((f64::from(*a) - b).abs() <= 2e-6 * scale, "{} vs {}", a, b);
            }
        }
    }
}

#[test]
fn the_layout_does_not_change_the_bits() {
    let ctx = Context::native_cpu(None);
    let opt = WeightOptimizer::adamw(0.01);
    let (mut w, mut t) = (array((300, 70), 1), array((70, 300), 1).t().to_owned());
    t.assign(&w);
    let mut t = t
        .reversed_axes()
        .as_standard_layout()
        .to_owned()
        .reversed_axes();
    let (mut a, mut b) = (OptimizerState::new(), OptimizerState::new());
    for step in 0..3 {
        let g = array((300, 70), 10 + step);
        weights_step(&ctx, w.view_mut(), g.view(), &mut a, &opt).expect("step");
        weights_step(&ctx, t.view_mut(), g.view(), &mut b, &opt).expect("step");
    }
    assert!(!t.is_standard_layout());
    assert_eq!(w, t);
}

#[test]
fn bad_calls_are_typed_errors_and_change_nothing() {
    let ctx = Context::native_cpu(None);
    let mut w = array((4, 3), 2);
    let before = w.clone();
    let mut state = OptimizerState::new();
    let opt = WeightOptimizer::sgd(0.1, 0.9);
    let wrong = array((3, 4), 2);
    let got = weights_step(&ctx, w.view_mut(), wrong.view(), &mut state, &opt);
    assert!(
        matches!(got, Err(Error::Shape { what: "grad", .. })),
        "{got:?}"
    );
    let mut nan = array((4, 3), 3);
    nan[[2, 1]] = f32::NAN;
    let got = weights_step(&ctx, w.view_mut(), nan.view(), &mut state, &opt);
    assert!(
        matches!(got, Err(Error::NonFinite { row: 2, col: 1, .. })),
        "{got:?}"
    );
    for bad in [
        WeightOptimizer::sgd(-1.0, 0.0),
        WeightOptimizer::Sgd {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: true,
        },
        WeightOptimizer::AdamW {
            lr: 0.1,
            beta1: 1.0,
            beta2: 0.9,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        WeightOptimizer::AdamW {
            lr: f32::NAN,
            beta1: 0.9,
            beta2: 0.9,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    ] {
        let got = weights_step(&ctx, w.view_mut(), before.view(), &mut state, &bad);
        assert!(
            matches!(got, Err(Error::InvalidParameter { .. })),
            "{bad:?}: {got:?}"
        );
    }
    assert_eq!((w.clone(), state.steps()), (before.clone(), 0));
    // A state kept by SGD cannot be stepped by AdamW.
    weights_step(&ctx, w.view_mut(), before.view(), &mut state, &opt).expect("step");
    let got = weights_step(
        &ctx,
        w.view_mut(),
        before.view(),
        &mut state,
        &WeightOptimizer::default(),
    );
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "state", .. })),
        "{got:?}"
    );
}

#[test]
fn the_state_is_counted_in_the_budget() {
    let shape = (64, 100);
    let opt = WeightOptimizer::default();
    let plan = weights_step_plan(&Context::native_cpu(None), shape, &opt).expect("plan");
    let bytes = plan.bytes;
    assert_eq!((bytes, plan.min_bytes), (2 * 4 * 64 * 100, bytes));
    let tight = Context::native_cpu(Some(bytes - 1));
    let refused = weights_step_plan(&tight, shape, &opt);
    assert!(
        matches!(refused, Err(Error::OverBudget { .. })),
        "{refused:?}"
    );
    let (mut w, g) = (array(shape, 4), array(shape, 5));
    let mut state = OptimizerState::new();
    let got = weights_step(&tight, w.view_mut(), g.view(), &mut state, &opt);
    assert!(matches!(got, Err(Error::BudgetExceeded { .. })), "{got:?}");
    let ctx = Context::native_cpu(Some(bytes));
    weights_step(&ctx, w.view_mut(), g.view(), &mut state, &opt).expect("fits");
    assert_eq!(ctx.memory().current_bytes, bytes);
    drop(state);
    assert_eq!(ctx.memory().current_bytes, 0);
}

/// The kinds of layout: classes on columns (one and three centres), on rows.
fn kinds() -> Vec<ClassifierKind> {
    vec![
        ClassifierKind::arc_face(),
        ClassifierKind::sub_center_arc_face(),
        ClassifierKind::proxy_anchor(),
    ]
}

/// Classes `range` of `w` (laid out for `kind`).
fn classes_of(
    kind: &ClassifierKind,
    w: &Array2<f32>,
    range: std::ops::Range<usize>,
) -> Array2<f32> {
    let k = kind.centres_per_class();
    match kind.classes_on_rows() {
        true => w.slice(s![range.start * k..range.end * k, ..]).to_owned(),
        false => w.slice(s![.., range.start * k..range.end * k]).to_owned(),
    }
}

/// Class ranges cut at `cuts` within `0 .. classes`.
fn ranges(cuts: &[usize], classes: usize) -> Vec<std::ops::Range<usize>> {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(classes);
    bounds.windows(2).map(|b| b[0]..b[1]).collect()
}

/// The weights of `classes` classes at `d` for `kind`, after `steps` of `opt` on gradients
/// from the step's seed, as one process holding the classes of `range` trains them: its
/// part of the weights and of every gradient.
fn trained(
    kind: &ClassifierKind,
    (classes, d): (usize, usize),
    range: std::ops::Range<usize>,
    (opt, steps): (&WeightOptimizer, u64),
) -> (Array2<f32>, OptimizerState) {
    let ctx = Context::native_cpu(None);
    let shape = kind.weight_shape(classes, d);
    let mut w = classes_of(kind, &array(shape, 7), range.clone());
    let mut state = OptimizerState::new();
    for step in 0..steps {
        let g = classes_of(kind, &array(shape, 100 + step), range.clone());
        weights_step(&ctx, w.view_mut(), g.view(), &mut state, opt).expect("step");
    }
    (w, state)
}

/// Saves the shards cut at `cuts` (each trained as its process would), in any order, and the
/// manifest.
fn save_trained(
    dir: &Path,
    kind: &ClassifierKind,
    (classes, d): (usize, usize),
    (opt, steps): (&WeightOptimizer, u64),
    cuts: &[usize],
) {
    let records: Vec<ShardRecord> = ranges(cuts, classes)
        .into_iter()
        .rev()
        .map(|r| {
            let (w, state) = trained(kind, (classes, d), r.clone(), (opt, steps));
            let shard = WeightsShard {
                kind,
                classes,
                first_class: r.start,
                weights: w.view(),
                optimizer: opt,
                state: &state,
            };
            save_weights_shard(dir, &shard).expect("save shard")
        })
        .collect();
    save_weights_manifest(dir, classes, &records).expect("manifest");
}

#[test]
fn shards_saved_by_four_load_on_two_three_and_one() {
    let (classes, d) = (23, 5);
    for kind in kinds() {
        for opt in [
            WeightOptimizer::sgd(0.1, 0.9),
            WeightOptimizer::default(),
            WeightOptimizer::sgd(0.1, 0.0),
        ] {
            let dir = scratch_dir("reshard");
            save_trained(&dir, &kind, (classes, d), (&opt, 3), &[4, 5, 17]);
            let ctx = Context::native_cpu(None);
            for cuts in [vec![11], vec![7, 15], vec![], vec![0, 0, 23], vec![3, 3]] {
                for r in ranges(&cuts, classes) {
                    let loaded = load_weights(&ctx, &dir, &kind, r.clone()).expect("load");
                    let (w, state) = trained(&kind, (classes, d), r.clone(), (&opt, 3));
                    assert_eq!(loaded.weights, w, "{kind:?} {r:?}");
                    assert_eq!((loaded.classes, loaded.optimizer), (classes, opt));
                    assert_eq!(loaded.state.steps(), 3);
                    assert_eq!(loaded.state.buffers(), state.buffers(), "{kind:?} {r:?}");
                }
            }
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}

#[test]
fn a_resumed_run_is_the_unbroken_run() {
    let (kind, classes, d) = (ClassifierKind::sub_center_arc_face(), 17, 6);
    let opt = WeightOptimizer::adamw(0.05);
    let dir = scratch_dir("resume");
    save_trained(&dir, &kind, (classes, d), (&opt, 2), &[6, 12]);
    let ctx = Context::native_cpu(None);
    let shape = kind.weight_shape(classes, d);
    // Two processes now, three more steps each on its part of the gradients.
    let mut parts = Vec::new();
    for r in ranges(&[9], classes) {
        let mut loaded = load_weights(&ctx, &dir, &kind, r.clone()).expect("load");
        for step in 2..5 {
            let g = classes_of(&kind, &array(shape, 100 + step), r.clone());
            weights_step(
                &ctx,
                loaded.weights.view_mut(),
                g.view(),
                &mut loaded.state,
                &loaded.optimizer,
            )
            .expect("step");
        }
        parts.push(loaded.weights);
    }
    let joined =
        ndarray::concatenate(ndarray::Axis(1), &[parts[0].view(), parts[1].view()]).expect("join");
    let (unbroken, _) = trained(&kind, (classes, d), 0..classes, (&opt, 5));
    assert_eq!(joined, unbroken);
    std::fs::remove_dir_all(&dir).ok();
}

/// The array of a `.npy` file this crate wrote (C order, `<f4`).
fn read_npy(path: &Path) -> Array2<f32> {
    let bytes = std::fs::read(path).expect("npy");
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + len) % 64, 0, "header padded to 64 bytes");
    let dict = std::str::from_utf8(&bytes[10..10 + len]).expect("ascii");
    assert!(
        dict.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (")
            && dict.ends_with('\n')
    );
    let shape: Vec<usize> = dict
        .split("'shape': (")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .expect("shape")
        .split(", ")
        .map(|v| v.trim_end_matches(',').parse().expect("int"))
        .collect();
    let values: Vec<f32> = bytes[10 + len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Array2::from_shape_vec((shape[0], shape[1]), values).expect("shape")
}

#[test]
fn the_whole_weights_export_as_one_npy() {
    let (classes, d) = (19, 4);
    for kind in kinds() {
        let opt = WeightOptimizer::default();
        let dir = scratch_dir("export");
        save_trained(&dir, &kind, (classes, d), (&opt, 2), &[1, 10]);
        let out = dir.join("W.npy");
        let bytes = export_weights_npy(&dir, &kind, &out).expect("export");
        assert_eq!(bytes, std::fs::metadata(&out).expect("file").len());
        let (whole, _) = trained(&kind, (classes, d), 0..classes, (&opt, 2));
        assert_eq!(read_npy(&out), whole, "{kind:?}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// One process's shard of every class of `w`.
fn every_class<'a>(
    kind: &'a ClassifierKind,
    w: &'a Array2<f32>,
    optimizer: &'a WeightOptimizer,
    state: &'a OptimizerState,
) -> WeightsShard<'a> {
    let classes = w.len_of(ndarray::Axis(usize::from(!kind.classes_on_rows())));
    let classes = classes / kind.centres_per_class();
    WeightsShard {
        kind,
        classes,
        first_class: 0,
        weights: w.view(),
        optimizer,
        state,
    }
}

#[test]
fn one_process_saves_and_loads_every_class() {
    let (kind, classes, d) = (ClassifierKind::arc_face(), 9, 3);
    let opt = WeightOptimizer::sgd(0.5, 0.5);
    let dir = scratch_dir("whole");
    let (w, state) = trained(&kind, (classes, d), 0..classes, (&opt, 1));
    let shard = every_class(&kind, &w, &opt, &state);
    save_weights(&dir, &shard).expect("save");
    // Saving again after another step moves the manifest to the new files at once.
    let (w2, state2) = trained(&kind, (classes, d), 0..classes, (&opt, 2));
    let shard = WeightsShard {
        weights: w2.view(),
        state: &state2,
        ..shard
    };
    save_weights(&dir, &shard).expect("save again");
    let back = load_weights(&Context::native_cpu(None), &dir, &kind, 0..classes).expect("load");
    assert_eq!((back.weights, back.state.steps()), (w2, 2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn damaged_or_mismatched_checkpoints_are_typed_errors() {
    let (kind, classes, d) = (ClassifierKind::arc_face(), 12, 4);
    let opt = WeightOptimizer::default();
    let ctx = Context::native_cpu(None);
    let fresh = || {
        let dir = scratch_dir("damage");
        save_trained(&dir, &kind, (classes, d), (&opt, 1), &[5]);
        let shard = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().contains("classes-5-12"))
            .expect("second shard");
        (dir, shard)
    };
    let load = |dir: &Path, kind: &ClassifierKind| load_weights(&ctx, dir, kind, 0..classes);
    let what = |got: wgpu_metric_learning::Result<wgpu_metric_learning::LoadedWeights>| match got {
        Err(Error::Checkpoint { what, .. }) => what,
        other => panic!("expected a checkpoint error, got {other:?}"),
    };
    // One flipped bit in the body, past the header.
    let (dir, shard) = fresh();
    let mut bytes = std::fs::read(&shard).expect("read");
    let at = bytes.len() - 20;
    bytes[at] ^= 1;
    std::fs::write(&shard, &bytes).expect("write");
    assert_eq!(what(load(&dir, &kind)), "checksum");
    // Truncated.
    std::fs::write(&shard, &bytes[..bytes.len() - 4]).expect("write");
    assert_eq!(what(load(&dir, &kind)), "size");
    // Another loss's layout (classes on rows; three centres per class).
    let (dir, _) = fresh();
    assert_eq!(what(load(&dir, &ClassifierKind::proxy_anchor())), "layout");
    assert_eq!(
        what(load(&dir, &ClassifierKind::sub_center_arc_face())),
        "layout"
    );
    // A manifest that leaves classes out, or points outside its directory.
    let manifest = dir.join("manifest.txt");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let first_shard_only: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(&manifest, first_shard_only).expect("write");
    assert_eq!(what(load(&dir, &kind)), "shards");
    std::fs::write(&manifest, text.replace(" classes-", " ../classes-")).expect("write");
    assert_eq!(what(load(&dir, &kind)), "manifest");
    // No checkpoint at all.
    std::fs::remove_file(&manifest).expect("remove");
    assert!(matches!(load(&dir, &kind), Err(Error::Io { .. })));
    // A range past the classes; records that leave a class out.
    let (dir, _) = fresh();
    let got = load_weights(&ctx, &dir, &kind, 3..13);
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "range", .. })),
        "{got:?}"
    );
    let record = ShardRecord {
        file: "x".into(),
        first_class: 1,
        classes: 11,
        bytes: 0,
        checksum: 0,
    };
    let got = save_weights_manifest(&dir, classes, &[record]);
    assert!(
        matches!(got, Err(Error::InvalidParameter { .. })),
        "{got:?}"
    );
    // Weights that are not whole classes of the kind.
    let w = Array2::<f32>::zeros((4, 5));
    let state = OptimizerState::new();
    let shard = WeightsShard {
        kind: &ClassifierKind::sub_center_arc_face(),
        classes: 10,
        first_class: 0,
        weights: w.view(),
        optimizer: &opt,
        state: &state,
    };
    assert!(matches!(
        save_weights_shard(&dir, &shard),
        Err(Error::Shape { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_damaged_header_is_a_typed_error() {
    let (kind, classes, d) = (ClassifierKind::arc_face(), 8, 3);
    let opt = WeightOptimizer::sgd(0.1, 0.9);
    let ctx = Context::native_cpu(None);
    // (offset, byte xor, what): the shard's classes, `d`, steps, optimizer code, padding.
    for (at, flip, what) in [
        (32usize, 1u8, "classes"),
        (48, 0x40, "size"),
        (56, 1, "checksum"),
        (64, 4, "optimizer"),
        (92, 1, "padding"),
        (0, 1, "magic"),
    ] {
        let dir = scratch_dir("header");
        save_trained(&dir, &kind, (classes, d), (&opt, 2), &[]);
        let shard = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "wmlc"))
            .expect("shard");
        let mut bytes = std::fs::read(&shard).expect("read");
        bytes[at] ^= flip;
        std::fs::write(&shard, &bytes).expect("write");
        match load_weights(&ctx, &dir, &kind, 0..classes) {
            Err(Error::Checkpoint { what: got, .. }) => assert_eq!(got, what, "byte {at}"),
            other => panic!("byte {at}: {other:?}"),
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_save_never_writes_over_what_the_manifest_names() {
    let (kind, classes, d) = (ClassifierKind::arc_face(), 6, 2);
    let opt = WeightOptimizer::sgd(0.1, 0.0);
    let dir = scratch_dir("no-overwrite");
    let (w, state) = trained(&kind, (classes, d), 0..classes, (&opt, 1));
    let shard = every_class(&kind, &w, &opt, &state);
    save_weights(&dir, &shard).expect("save");
    // The same step again with other weights, its manifest never written (a crash).
    let other = w.mapv(|v| v + 1.0);
    save_weights_shard(
        &dir,
        &WeightsShard {
            weights: other.view(),
            ..shard
        },
    )
    .expect("shard");
    let back = load_weights(&Context::native_cpu(None), &dir, &kind, 0..classes).expect("load");
    assert_eq!(back.weights, w);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn saves_refuse_what_cannot_load() {
    let (kind, classes, d) = (ClassifierKind::arc_face(), 6, 2);
    let dir = scratch_dir("refused");
    let sgd = WeightOptimizer::sgd(0.1, 0.9);
    let (w, state) = trained(&kind, (classes, d), 0..classes, (&sgd, 1));
    // A state of SGD's one buffer saved as AdamW's.
    let adamw = WeightOptimizer::default();
    let shard = every_class(&kind, &w, &adamw, &state);
    let got = save_weights_shard(&dir, &shard);
    assert!(
        matches!(
            got,
            Err(Error::InvalidParameter {
                what: "optimizer state",
                ..
            })
        ),
        "{got:?}"
    );
    // No class, or a part of the classes through the one-process save.
    let fresh = OptimizerState::new();
    let (none, part) = (
        Array2::<f32>::zeros((d, 0)),
        w.slice(s![.., ..3]).to_owned(),
    );
    for (weights, whole) in [(none.view(), false), (part.view(), true)] {
        let refused = WeightsShard {
            weights,
            optimizer: &sgd,
            state: &fresh,
            ..shard
        };
        let got = match whole {
            false => save_weights_shard(&dir, &refused).map(|_| ()),
            true => save_weights(&dir, &refused),
        };
        assert!(matches!(got, Err(Error::Shape { .. })), "{got:?}");
    }
    assert_eq!(
        std::fs::read_dir(&dir).expect("dir").count(),
        0,
        "nothing written"
    );
    std::fs::remove_dir_all(&dir).ok();
}
