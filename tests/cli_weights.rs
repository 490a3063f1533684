//! `wml weights step|export` against the library calls they wrap: optimizer steps through
//! checkpoints, a learning rate changed between steps, both layouts, and the refusals.

use std::path::Path;

use ndarray::Array2;
use ndarray_npy::{read_npy, write_npy};
use wgpu_metric_learning::{weights_step, Context, OptimizerState, WeightOptimizer};

use crate::cli::{arg, dir, fails_with, json_field, ok, wml};

/// Values with every bit of the mantissa in use, so that a step taken otherwise shows.
fn values(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        let h = (i as u64 * 131 + j as u64 * 71 + seed * 1009).wrapping_mul(0x2545_F491_4F6C_DD1D);
        (h >> 41) as f32 / (1u32 << 22) as f32 - 1.0
    })
}

/// The library's steps, one per `(optimizer, gradient)`, from `w` and no state.
fn library(w: &Array2<f32>, steps: &[(WeightOptimizer, &Array2<f32>)]) -> Array2<f32> {
    let ctx = Context::native_cpu(None);
    let (mut w, mut state) = (w.clone(), OptimizerState::new());
    for (opt, g) in steps {
        weights_step(&ctx, w.view_mut(), g.view(), &mut state, opt).expect("step");
    }
    w
}

fn exported(ckpt: &Path, out: &Path, layout: &[&str]) -> Array2<f32> {
    let mut args = vec![
        "weights",
        "export",
        "--checkpoint",
        arg(ckpt),
        "--out",
        arg(out),
    ];
    args.extend_from_slice(layout);
    let json = ok(&wml(&args));
    let bytes = std::fs::metadata(out).expect("exported").len();
    assert_eq!(json_field(&json, "bytes"), bytes as f64, "{json}");
    read_npy(out).expect("read")
}

#[test]
fn steps_through_checkpoints_are_the_library_steps() {
    let d = dir("weights-steps");
    let p = |n: &str| d.join(n);
    // ArcFace's W is (d, classes); ProxyNCA's proxies are (classes, d).
    for (layout, shape) in [
        (["--loss", "arcface"], (5, 7)),
        (["--loss", "proxy-nca"], (7, 5)),
    ] {
        let (w, g1, g2) = (
            values(shape.0, shape.1, 1),
            values(shape.0, shape.1, 2),
            values(shape.0, shape.1, 3),
        );
        let (wf, g1f, g2f) = (p("w.npy"), p("g1.npy"), p("g2.npy"));
        write_npy(&wf, &w).expect("write");
        write_npy(&g1f, &g1).expect("write");
        write_npy(&g2f, &g2).expect("write");
        let ckpt = p(&format!("ckpt-{}", layout[1]));
        // SGD with momentum, then the same checkpoint stepped again at a lower rate.
        let mut first = vec![
            "weights",
            "step",
            "--weights",
            arg(&wf),
            "--grad",
            arg(&g1f),
        ];
        first.extend([
            "--optimizer",
            "sgd",
            "--lr",
            "0.1",
            "--momentum",
            "0.9",
            "--out",
            arg(&ckpt),
        ]);
        first.extend_from_slice(&layout);
        let json = ok(&wml(&first));
        assert_eq!(json_field(&json, "steps"), 1.0, "{json}");
        assert_eq!(json_field(&json, "classes"), 7.0, "{json}");
        assert!(json.contains("\"optimizer\": \"sgd\""), "{json}");
        let mut second = vec![
            "weights",
            "step",
            "--checkpoint",
            arg(&ckpt),
            "--grad",
            arg(&g2f),
        ];
        second.extend(["--lr", "0.05", "--out", arg(&ckpt)]);
        second.extend_from_slice(&layout);
        let json = ok(&wml(&second));
        assert_eq!(json_field(&json, "steps"), 2.0, "{json}");
        assert_eq!(json_field(&json, "lr"), f64::from(0.05f32), "{json}");
        let sgd = |lr| WeightOptimizer::Sgd {
            lr,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        };
        let want = library(&w, &[(sgd(0.1), &g1), (sgd(0.05), &g2)]);
        assert_eq!(
            exported(&ckpt, &p("w-sgd.npy"), &layout),
            want,
            "{layout:?}"
        );
        // AdamW with every setting given, into another directory.
        let adam = p(&format!("adam-{}", layout[1]));
        let mut first = vec![
            "weights",
            "step",
            "--weights",
            arg(&wf),
            "--grad",
            arg(&g1f),
        ];
        first.extend([
            "--optimizer",
            "adamw",
            "--lr",
            "0.01",
            "--betas",
            "0.8,0.99",
            "--eps",
            "1e-6",
        ]);
        first.extend(["--weight-decay", "0.1", "--out", arg(&adam)]);
        first.extend_from_slice(&layout);
        ok(&wml(&first));
        let mut second = vec![
            "weights",
            "step",
            "--checkpoint",
            arg(&adam),
            "--grad",
            arg(&g2f),
        ];
        second.extend(["--out", arg(&adam)]);
        second.extend_from_slice(&layout);
        ok(&wml(&second));
        let adamw = WeightOptimizer::AdamW {
            lr: 0.01,
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.1,
        };
        let want = library(&w, &[(adamw, &g1), (adamw, &g2)]);
        assert_eq!(
            exported(&adam, &p("w-adam.npy"), &layout),
            want,
            "{layout:?}"
        );
    }
}

#[test]
fn a_checkpoint_of_weights_alone_takes_any_optimizer_with_a_rate() {
    use wgpu_metric_learning::{save_weights, ClassifierKind, WeightsShard};
    let d = dir("weights-alone");
    let p = |n: &str| d.join(n);
    let (w, g) = (values(4, 6, 1), values(4, 6, 2));
    let (gf, ck) = (p("g.npy"), p("ckpt"));
    write_npy(&gf, &g).expect("write");
    std::fs::create_dir_all(&ck).expect("dir");
    // What Python saves without an optimizer: SGD at rate 0, no state.
    let (kind, none) = (ClassifierKind::arc_face(), WeightOptimizer::sgd(0.0, 0.0));
    let state = OptimizerState::new();
    let shard = WeightsShard {
        kind: &kind,
        classes: 6,
        first_class: 0,
        weights: w.view(),
        optimizer: &none,
        state: &state,
    };
    save_weights(&ck, &shard).expect("save");
    let step = |extra: &[&str]| {
        let mut args = vec!["weights", "step", "--loss", "arcface", "--grad", arg(&gf)];
        args.extend(["--checkpoint", arg(&ck), "--out", arg(&ck)]);
        args.extend_from_slice(extra);
        wml(&args)
    };
    fails_with(&step(&[]), &["--lr"]);
    fails_with(&step(&["--optimizer", "adamw"]), &["--lr"]);
    ok(&step(&["--optimizer", "adamw", "--lr", "0.01"]));
    let want = library(&w, &[(WeightOptimizer::adamw(0.01), &g)]);
    assert_eq!(exported(&ck, &p("w.npy"), &["--loss", "arcface"]), want);
}

#[test]
fn weights_refusals_are_one_line_and_write_nothing() {
    let d = dir("weights-refusals");
    let p = |n: &str| d.join(n);
    let (w, g) = (values(4, 6, 1), values(4, 6, 2));
    write_npy(p("w.npy"), &w).expect("write");
    write_npy(p("g.npy"), &g).expect("write");
    write_npy(p("g-short.npy"), &values(4, 5, 2)).expect("write");
    let (wf, gf, ck) = (p("w.npy"), p("g.npy"), p("ckpt"));
    let step = |extra: &[&str]| {
        let mut args = vec!["weights", "step", "--loss", "arcface", "--grad", arg(&gf)];
        args.extend_from_slice(extra);
        wml(&args)
    };
    fails_with(
        &step(&["--weights", arg(&wf), "--out", arg(&ck)]),
        &["--optimizer", "--lr"],
    );
    fails_with(
        &step(&[
            "--weights",
            arg(&wf),
            "--optimizer",
            "sgd",
            "--out",
            arg(&ck),
        ]),
        &["--lr"],
    );
    fails_with(
        &step(&[
            "--weights",
            arg(&wf),
            "--optimizer",
            "sgd",
            "--lr",
            "0.1",
            "--betas",
            "0.9,0.99",
            "--out",
            arg(&ck),
        ]),
        &["--betas", "sgd"],
    );
    let g_short = p("g-short.npy");
    let mut short = vec![
        "weights",
        "step",
        "--loss",
        "arcface",
        "--grad",
        arg(&g_short),
    ];
    short.extend([
        "--weights",
        arg(&wf),
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--out",
        arg(&ck),
    ]);
    fails_with(&wml(&short), &["g-short.npy", "grad"]);
    assert!(
        !ck.join("manifest.txt").exists(),
        "a refused step saves nothing"
    );
    // Whole classes of the sub-centres, and centre options only where the loss has them.
    let sub = ["--loss", "sub-center-arcface", "--sub-centers", "4"];
    let mut args = vec!["weights", "step", "--grad", arg(&gf), "--weights", arg(&wf)];
    args.extend(["--optimizer", "sgd", "--lr", "0.1", "--out", arg(&ck)]);
    args.extend_from_slice(&sub);
    fails_with(&wml(&args), &["w.npy", "whole classes"]);
    fails_with(
        &step(&[
            "--weights",
            arg(&wf),
            "--optimizer",
            "sgd",
            "--lr",
            "0.1",
            "--sub-centers",
            "2",
            "--out",
            arg(&ck),
        ]),
        &["--sub-centers", "arcface"],
    );
    // A checkpoint of SGD refuses AdamW (its state does not fit), and a damaged shard
    // exports nothing.
    ok(&step(&[
        "--weights",
        arg(&wf),
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--momentum",
        "0.5",
        "--out",
        arg(&ck),
    ]));
    fails_with(
        &step(&[
            "--checkpoint",
            arg(&ck),
            "--optimizer",
            "adamw",
            "--out",
            arg(&ck),
        ]),
        &["sgd"],
    );
    // SGD's momentum cannot be turned off once it keeps a buffer; `--centers-per-class`
    // is named as itself.
    let off = [
        "--checkpoint",
        arg(&ck),
        "--momentum",
        "0",
        "--out",
        arg(&ck),
    ];
    fails_with(&step(&off), &["--momentum"]);
    let stray = [
        "--checkpoint",
        arg(&ck),
        "--centers-per-class",
        "2",
        "--out",
        arg(&ck),
    ];
    fails_with(&step(&stray), &["--centers-per-class", "arcface"]);
    // Naming the checkpoint's own optimizer keeps its settings (momentum 0.5, no refusal).
    let same = [
        "--checkpoint",
        arg(&ck),
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--out",
        arg(&ck),
    ];
    ok(&step(&same));
    // Stepped in place, the directory keeps one checkpoint: the previous shard is removed.
    ok(&step(&["--checkpoint", arg(&ck), "--out", arg(&ck)]));
    let shards = || {
        std::fs::read_dir(&ck)
            .expect("ckpt")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.extension().is_some_and(|x| x == "wmlc"))
            .count()
    };
    assert_eq!(shards(), 1, "one shard after a step in place");
    let shard = std::fs::read_dir(&ck)
        .expect("ckpt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|f| f.extension().is_some_and(|x| x == "wmlc"))
        .expect("a shard");
    let bytes = std::fs::read(&shard).expect("shard");
    std::fs::write(&shard, &bytes[..bytes.len() - 9]).expect("truncate");
    let out = p("w-out.npy");
    let export = [
        "weights",
        "export",
        "--loss",
        "arcface",
        "--checkpoint",
        arg(&ck),
        "--out",
        arg(&out),
    ];
    fails_with(&wml(&export), &["--checkpoint"]);
    assert!(!out.exists(), "a damaged checkpoint exports nothing");
}
