//! Trains a small embedding network with burn's autodiff, mining its triplets with the library
//! against a cross-batch memory bank (PML's `CrossBatchMemory` with a semihard
//! `TripletMarginMiner` and `TripletMarginLoss`), and reports PML's accuracy metrics on a
//! held-out split.
//!
//! Each step embeds a batch, enqueues it into the library's `MemoryBank` (on a GPU straight
//! from burn's buffer), mines semihard triplets of the batch against the bank (on the
//! device, into a device array that burn's index tensors are copied from there), computes the
//! triplet margin loss in burn from the mined indices and steps Adam.
//! With a hardware adapter burn and the library share its wgpu device; without one the same
//! loop runs on burn's CPU backend (flex) and the library's native path, which beats both on
//! lavapipe for a network this small.
//!
//! ```text
//! cargo run --release -p wgpu-metric-learning-burn --example triplet_training -- \
//!     [--steps 300] [--backend auto|wgpu|cpu] [--checkpoint bank.ckpt] [--loss triplet|arcface]
//! ```
//!
//! With `--loss arcface` the same network trains with PML's `ArcFaceLoss` instead (no bank,
//! no mining): the library computes the loss and both gradients, burn takes the embeddings'
//! through its autodiff (a surrogate `Σ emb · ∂loss/∂emb`), and the class weights `W`
//! `(EMBEDDING, CLASSES)` are a plain array stepped by SGD with momentum, as a PML user's
//! separate loss optimizer would.
//!
//! With `--checkpoint`, the bank is restored from that file when it exists and saved to it
//! (atomically) at every evaluation and at the end; the network's weights are not saved (a
//! resumed run starts from fresh weights and the restored bank). Its last line is
//! `precision_at_1 before <x> after <y>`.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{s, Array1, Array2, Axis};
use wgpu_metric_learning::{
    accuracy, classifier_loss, list_adapters, mine_triplets, mine_triplets_on_device,
    AccuracyConfig, BankConfig, ClassifierLossConfig, Context, ContextConfig, Hooks, MemoryBank,
    MiningSet, TripletConfig, TripletType,
};
use wgpu_metric_learning_burn::{
    from_array, index_columns, index_columns_on_device, shared_wgpu, to_array, DeviceTensor,
};

const CLASSES: usize = 20;
const INPUT: usize = 32;
const HIDDEN: usize = 128;
const EMBEDDING: usize = 16;
/// Classes per batch, and samples of each.
const BATCH_CLASSES: usize = 8;
const PER_CLASS: usize = 8;
const BANK_ROWS: usize = 1024;
/// PML's `TripletMarginLoss` default margin.
const LOSS_MARGIN: f32 = 0.05;
const LEARNING_RATE: f64 = 2e-3;
/// SGD with momentum for ArcFace's class weights.
const WEIGHT_RATE: f32 = 0.01;
const WEIGHT_MOMENTUM: f32 = 0.9;

type Failure = Box<dyn std::error::Error>;

#[derive(Module, Debug)]
struct Net {
    l1: Linear,
    act: Relu,
    l2: Linear,
}

impl Net {
    fn new(device: &Device) -> Self {
        Self {
            l1: LinearConfig::new(INPUT, HIDDEN).init(device),
            act: Relu::new(),
            l2: LinearConfig::new(HIDDEN, EMBEDDING).init(device),
        }
    }

    /// L2-normalised embeddings `(n, EMBEDDING)` (PML's `LpDistance(normalize_embeddings=True)`).
    fn embed(&self, x: Tensor<2>) -> Tensor<2> {
        let e = self.l2.forward(self.act.forward(self.l1.forward(x)));
        let norm = e
            .clone()
            .powf_scalar(2.0)
            .sum_dim(1)
            .clamp_min(1e-12)
            .sqrt();
        e / norm
    }
}

/// A small deterministic generator (xorshift64*), so that runs compare.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Classes as noisy points around random centres, squashed through a fixed random
/// nonlinearity so that raw distances rank them poorly.
fn dataset(rng: &mut Rng, per_class: usize) -> (Array2<f32>, Array1<i64>) {
    let centres = Array2::from_shape_fn((CLASSES, INPUT), |_| rng.normal());
    let mix = Array2::from_shape_fn((INPUT, INPUT), |_| rng.normal() / (INPUT as f32).sqrt());
    let n = CLASSES * per_class;
    let labels = Array1::from_shape_fn(n, |i| (i % CLASSES) as i64);
    let mut x = Array2::from_shape_fn((n, INPUT), |(i, k)| {
        centres[[i % CLASSES, k]] + 1.6 * rng.normal()
    });
    x = x.dot(&mix).mapv(|v| v.tanh() * 3.0);
    (x, labels)
}

/// Where the run happens.
enum Backend {
    /// burn and the library on one wgpu device.
    Wgpu,
    /// burn's CPU backend and the library's native path.
    Cpu,
}

struct Args {
    steps: usize,
    backend: Option<String>,
    checkpoint: Option<PathBuf>,
    arcface: bool,
}

fn args() -> Result<Args, Failure> {
    let mut out = Args {
        steps: 300,
        backend: None,
        checkpoint: None,
        arcface: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => out.steps = value()?.parse()?,
            "--backend" => out.backend = Some(value()?),
            "--checkpoint" => out.checkpoint = Some(PathBuf::from(value()?)),
            "--loss" => match value()?.as_str() {
                "triplet" => out.arcface = false,
                "arcface" => out.arcface = true,
                other => return Err(format!("--loss {other}: triplet or arcface").into()),
            },
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(out)
}

fn main() -> Result<(), Failure> {
    let args = args()?;
    let hardware = list_adapters(None).iter().any(|a| !a.is_software());
    let backend = match args.backend.as_deref() {
        Some("wgpu") => Backend::Wgpu,
        Some("cpu") => Backend::Cpu,
        Some("auto") | None if hardware => Backend::Wgpu,
        Some("auto") | None => Backend::Cpu,
        Some(other) => return Err(format!("--backend {other}: auto, wgpu or cpu").into()),
    };
    let (device, ctx) = match backend {
        Backend::Wgpu => {
            let shared = shared_wgpu(&ContextConfig::default())?;
            println!(
                "running on {} (burn and the library share its wgpu device)",
                shared.ctx.device_name()
            );
            (shared.device, shared.ctx)
        }
        Backend::Cpu => {
            println!(
                "running on the CPU: burn's flex backend and the library's native path ({})",
                if hardware {
                    "as asked"
                } else {
                    "no hardware adapter; faster than lavapipe here"
                }
            );
            (Device::flex(), Context::native_cpu(None))
        }
    };
    let train_device = device.clone().autodiff();

    // 150 samples per class: the first 100 train, the last 50 are held out.
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (x, y) = dataset(&mut rng, 150);
    let split = 100 * CLASSES;
    let (train_x, eval_x) = (
        x.slice(s![..split, ..]),
        x.slice(s![split.., ..]).to_owned(),
    );
    let (train_y, eval_y) = (y.slice(s![..split]), y.slice(s![split..]).to_owned());

    let bank_cfg = BankConfig::new(BANK_ROWS, EMBEDDING);
    let mut bank = match &args.checkpoint {
        Some(path) if path.exists() => {
            let bank = MemoryBank::<i64>::load(&ctx, path, &bank_cfg)?;
            println!(
                "resumed the bank from {} ({} rows)",
                path.display(),
                bank.len()
            );
            bank
        }
        _ => MemoryBank::<i64>::new(&ctx, &bank_cfg)?,
    };
    // The bank's rows as burn sees them (detached), for the loss: updated as the bank is.
    let mut memory = match bank.len() {
        0 => Tensor::<2>::zeros([BANK_ROWS, EMBEDDING], &train_device),
        _ => {
            let snap = bank.snapshot(&ctx)?;
            let mut rows = Array2::<f32>::zeros((BANK_ROWS, EMBEDDING));
            rows.slice_mut(s![..snap.embeddings.nrows(), ..])
                .assign(&snap.embeddings);
            from_array(rows.view(), &train_device)
        }
    };

    let mut model = Net::new(&train_device);
    let mut optim = AdamConfig::new().init();
    let eval = |model: &Net, when: &str| {
        evaluate(&ctx, &backend, model, &eval_x, &eval_y, &train_device, when)
    };
    let before = eval(&model, "before")?;
    let eval_every = (args.steps / 3).max(1);
    let started = Instant::now();
    let mut mined_total = 0usize;
    // ArcFace's class weights, PML's initialisation (standard normal), and their momentum.
    let mut weights = Array2::from_shape_fn((EMBEDDING, CLASSES), |_| rng.normal());
    let mut velocity = Array2::<f32>::zeros((EMBEDDING, CLASSES));
    for step in 1..=args.steps {
        // A batch of BATCH_CLASSES classes, PER_CLASS samples each.
        let mut rows = Vec::with_capacity(BATCH_CLASSES * PER_CLASS);
        let first = rng.below(CLASSES);
        for c in 0..BATCH_CLASSES {
            let class = (first + c * 3) % CLASSES;
            for _ in 0..PER_CLASS {
                rows.push(class + CLASSES * rng.below(100));
            }
        }
        let x = train_x.select(Axis(0), &rows);
        let y = train_y.select(Axis(0), &rows);
        let emb = model.embed(from_array(x.view(), &train_device));
        if args.arcface {
            let rows = to_array(&emb.clone().detach())?;
            let out = classifier_loss(
                &ctx,
                rows.view(),
                &y.to_vec(),
                weights.view(),
                &ClassifierLossConfig::default(),
            )?;
            velocity = velocity * WEIGHT_MOMENTUM + &out.weight_grad;
            weights.scaled_add(-WEIGHT_RATE, &velocity);
            // burn's autodiff takes ∂loss/∂emb on through the network.
            let surrogate = (emb * from_array(out.grad.view(), &train_device)).sum();
            let grads = GradientsParams::from_grads(surrogate.backward(), &model);
            model = optim.step(LEARNING_RATE, model, grads);
            if step % eval_every == 0 && step < args.steps {
                println!("step {step}: ArcFace loss {:.4}", out.loss);
                eval(&model, "held-out")?;
            }
            continue;
        }

        // Enqueue, then mine the batch against the bank (PML's CrossBatchMemory order).
        let semihard = TripletConfig::margin_miner(TripletType::Semihard);
        // The triplets' anchor, positive and negative columns as burn index tensors: on a GPU
        // mined into a device array and copied into burn's tensor there, with only the count
        // on the host.
        let (enqueued, count, columns) = match backend {
            Backend::Wgpu => {
                let rows = DeviceTensor::of(&emb)?;
                let enq = bank.enqueue(&ctx, &MiningSet::new(rows.embeddings(), &y))?;
                let cfg = TripletConfig {
                    self_exclusion: enq.self_exclusion.clone(),
                    ..semihard
                };
                let mined = mine_triplets_on_device(
                    &ctx,
                    &MiningSet::new(rows.embeddings(), &y),
                    Some(&bank.refs()),
                    &cfg,
                )?;
                let columns = index_columns_on_device::<3>(&ctx, &mined.triplets, &train_device)?;
                (enq, mined.len(), columns)
            }
            Backend::Cpu => {
                let rows = to_array(&emb.clone().detach())?;
                let enq = bank.enqueue(&ctx, &MiningSet::new(&rows, &y))?;
                let cfg = TripletConfig {
                    self_exclusion: enq.self_exclusion.clone(),
                    ..semihard
                };
                let t = mine_triplets(&ctx, &MiningSet::new(&rows, &y), Some(&bank.refs()), &cfg)?;
                let columns = index_columns::<3>(t.indices.view(), &train_device)?;
                (enq, t.len(), columns)
            }
        };
        memory = mirror(memory, &emb, &enqueued.slots);
        mined_total += count;

        // PML's TripletMarginLoss over the mined triplets, averaged over the non-zero ones
        // (nothing to learn from a batch that mined none).
        if count > 0 {
            let [a, p, n] = columns;
            let anchors = emb.select(0, a);
            let distance = |other: Tensor<2>| {
                (anchors.clone() - other)
                    .powf_scalar(2.0)
                    .sum_dim(1)
                    .clamp_min(1e-12)
                    .sqrt()
            };
            let ap = distance(memory.clone().select(0, p));
            let an = distance(memory.clone().select(0, n));
            let losses = (ap - an + LOSS_MARGIN).clamp_min(0.0);
            let nonzero = losses
                .clone()
                .greater_elem(0.0)
                .float()
                .sum()
                .clamp_min(1.0);
            let loss = losses.sum() / nonzero;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LEARNING_RATE, model, grads);
        }

        if step % eval_every == 0 && step < args.steps {
            println!(
                "step {step}: {count} triplets mined in this batch, {mined_total} so far, {:.1} s",
                started.elapsed().as_secs_f64()
            );
            eval(&model, "held-out")?;
            save(&ctx, &bank, args.checkpoint.as_deref())?;
        }
    }
    let what = match args.arcface {
        true => "with ArcFace".to_string(),
        false => format!("{mined_total} triplets mined"),
    };
    println!(
        "{} steps: {what}, {:.1} s",
        args.steps,
        started.elapsed().as_secs_f64()
    );
    save(&ctx, &bank, args.checkpoint.as_deref())?;
    let after = eval(&model, "after")?;
    println!("precision_at_1 before {before:.4} after {after:.4}");
    Ok(())
}

/// Saves the bank to `path` (atomically), when a checkpoint was asked for.
fn save(
    ctx: &Context,
    bank: &MemoryBank<i64>,
    path: Option<&std::path::Path>,
) -> Result<(), Failure> {
    if let Some(path) = path {
        let saved = bank.save(ctx, path)?;
        println!("bank saved to {} ({} bytes)", path.display(), saved.bytes);
    }
    Ok(())
}

/// `memory` with the rows of `emb` (detached) written at `slots` (consecutive, wrapping at
/// most once), as the bank wrote them.
fn mirror(memory: Tensor<2>, emb: &Tensor<2>, slots: &[u32]) -> Tensor<2> {
    let Some(&first) = slots.first() else {
        return memory;
    };
    let values = emb.clone().detach();
    let first = first as usize;
    let run = slots.len().min(BANK_ROWS - first);
    let mut memory = memory.slice_assign(
        [first..first + run, 0..EMBEDDING],
        values.clone().slice([0..run, 0..EMBEDDING]),
    );
    if run < slots.len() {
        let rest = slots.len() - run;
        memory = memory.slice_assign(
            [0..rest, 0..EMBEDDING],
            values.slice([run..slots.len(), 0..EMBEDDING]),
        );
    }
    memory
}

/// PML's accuracy metrics of the held-out split against itself (each query skipping itself),
/// computed by the library behind a progress bar; returns precision@1.
fn evaluate(
    ctx: &Context,
    backend: &Backend,
    model: &Net,
    x: &Array2<f32>,
    y: &Array1<i64>,
    device: &Device,
    when: &str,
) -> Result<f64, Failure> {
    let emb = model.embed(from_array(x.view(), device)).detach();
    let bar = ProgressBar::new(1000).with_style(
        ProgressStyle::with_template("  {msg} [{bar:30}] {percent:>3}%")?.progress_chars("=> "),
    );
    bar.set_message(format!("accuracy ({when})"));
    let progress = bar.clone();
    let cfg = AccuracyConfig {
        hooks: Hooks::new()
            .on_progress(move |p| progress.set_position((p.fraction() * 1000.0) as u64)),
        ..Default::default()
    };
    let found = match backend {
        Backend::Wgpu => {
            let rows = DeviceTensor::of(&emb)?;
            accuracy(ctx, &MiningSet::new(rows.embeddings(), y), None, &cfg)?
        }
        Backend::Cpu => {
            let rows = to_array(&emb)?;
            accuracy(ctx, &MiningSet::new(&rows, y), None, &cfg)?
        }
    };
    bar.finish_and_clear();
    let m = found.metrics;
    println!(
        "{when}: precision_at_1 {:.4}, r_precision {:.4}, mean_average_precision_at_r {:.4}",
        m.precision_at_1, m.r_precision, m.mean_average_precision_at_r
    );
    Ok(m.precision_at_1)
}
