//! `--distributed`: `wml knn`, `wml accuracy` and `wml loss arcface|…` as one rank of an MPI
//! job. Each rank reads only its rows of the inputs (and its classes of the weights); rank 0
//! writes or prints the result.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::distributed::mpi::environment::Universe;
use wgpu_metric_learning::distributed::mpi::traits::*;
use wgpu_metric_learning::distributed::{
    self, mpi, ClassWeights, DistributedClassifierConfig, Group, GroupConfig, RankGradients,
};
use wgpu_metric_learning::{ClassifierLossConfig, Context, Hooks, MiningSet};

use crate::classifier::ClassifierArgs;
use crate::commands::{
    accuracy_config, accuracy_inputs, context_config, given, knn_config, print_accuracy, timed,
    with_causes,
};
use crate::npy::{self, problem};
use crate::{AccuracyArgs, DistributedArgs, Failure, KnnArgs};

/// Rank `rank`'s share of `n` rows: contiguous, in rank order, sizes differing by at most
/// one.
fn share(n: usize, rank: usize, size: usize) -> Range<usize> {
    let at = |r: usize| (n as u128 * r as u128 / size.max(1) as u128) as usize;
    at(rank)..at(rank + 1)
}

/// MPI, and the group of all ranks with the `--timeout`.
fn start(args: &DistributedArgs) -> Result<(Universe, Group), Failure> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(format!(
            "--timeout must be a positive number of seconds, got {}",
            args.timeout
        )
        .into());
    }
    // Funneled: the native path's worker threads never call MPI, only this one does.
    let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Funneled)
        .ok_or("MPI could not be initialised")?;
    if threading == mpi::Threading::Single {
        return Err(
            "this MPI gives single-threaded processes only; wml needs MPI_THREAD_FUNNELED".into(),
        );
    }
    let cfg = GroupConfig {
        timeout: Some(Duration::from_secs_f64(args.timeout)),
        query_block: usize::try_from(args.query_block).unwrap_or(usize::MAX),
    };
    let group = Group::new(&universe.world(), &cfg);
    Ok((universe, group))
}

/// A step every rank takes: its own value, or the failure of this rank or of the lowest
/// failed one (every rank then fails).
fn agreed<T>(group: &Group, step: &'static str, local: Result<T, String>) -> Result<T, Failure> {
    match group.agree_on(step, local) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(mine)) => Err(format!("rank {}: {mine}", group.rank()).into()),
        Err(e) => Err(format!("rank {}: {}", group.rank(), with_causes(&e)).into()),
    }
}

/// A failure's message, naming this rank (a row number in it counts from the start of this
/// rank's share).
fn on_rank(group: &Group, failure: Failure) -> Failure {
    match failure {
        Failure::Message(m) => Failure::Message(format!("rank {}: {m}", group.rank())),
        other => other,
    }
}

/// This rank's context: the common options, its node's GPUs spread over its ranks.
fn context(group: &Group, a: &crate::Common) -> Result<Context, Failure> {
    group
        .context(&context_config(a))
        .map_err(|e| format!("rank {}: --backend: {}", group.rank(), with_causes(&e)).into())
}

/// Rows `range` of embeddings, after checking that the file has `rows` of them.
fn embedding_rows(path: &Path, group: &Group) -> Result<(usize, Array2<f32>), String> {
    let n = npy::rows_of(path, 2, "embeddings")?;
    Ok((
        n,
        npy::read_embedding_rows(path, share(n, group.rank(), group.size()))?,
    ))
}

/// This rank's labels, which must be one per row of the embeddings (`n` of them).
fn label_rows(path: &Path, n: usize, group: &Group) -> Result<Array1<i64>, String> {
    let rows = npy::rows_of(path, 1, "labels")?;
    if rows != n {
        return Err(problem(
            path,
            format!("{rows} labels for {n} rows of embeddings"),
        ));
    }
    npy::read_label_rows(path, share(n, group.rank(), group.size()))
}

/// Runs a command's body as one rank, then has every rank print its failure before any
/// exits: mpirun ends the whole job as soon as one rank exits with an error, which would
/// otherwise cut the others' messages off.
fn as_rank(
    args: &DistributedArgs,
    body: impl FnOnce(&Group) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let (universe, group) = start(args)?;
    let done = body(&group);
    let done = match done {
        Err(Failure::Message(m)) => {
            eprintln!("wml: {m}");
            Err(Failure::Reported)
        }
        other => other,
    };
    // Everyone has printed (or a rank is stuck: the wait is bounded by the timeout).
    let _ = group.agree_on("finish", Ok::<(), String>(()));
    if let Some(waited) = group.timed_out() {
        // A collective this rank gave up on stays posted, and MPI_Finalize would wait for
        // it: end the whole job instead.
        eprintln!(
            "wml: rank {}: gave up on the other ranks after {:.1} s (--timeout); aborting the job",
            group.rank(),
            waited.as_secs_f64()
        );
        universe.world().abort(1);
    }
    done
}

pub(crate) fn knn(a: &KnnArgs, hooks: &Hooks) -> Result<(), Failure> {
    as_rank(&a.distributed, |group| knn_rank(a, hooks, group))
}

fn knn_rank(a: &KnnArgs, hooks: &Hooks, group: &Group) -> Result<(), Failure> {
    let cfg = knn_config(a, hooks);
    let read = (|| {
        let (q, queries) = embedding_rows(&a.queries, group)?;
        let refs = a
            .refs
            .as_deref()
            .map(|r| embedding_rows(r, group).map(|(_, rows)| rows))
            .transpose()?;
        if q.checked_mul(cfg.k).is_none_or(|n| n > i32::MAX as usize) {
            return Err(problem(
                &a.queries,
                format!(
                    "{q} queries × k = {} results pass what MPI gathers at once (2^31 - 1)",
                    cfg.k
                ),
            ));
        }
        Ok((q, queries, refs))
    })();
    let (q, queries, refs) = agreed(group, "read the inputs", read)?;
    let ctx = context(group, &a.common)?;
    let inputs = given(&[("queries", Some(&a.queries)), ("refs", a.refs.as_deref())]);
    // Without --refs each rank's references are its queries, and the global indices agree.
    let r = refs.as_ref().unwrap_or(&queries);
    let found = timed("knn", &ctx, &a.common, &inputs, || {
        distributed::knn(group, &ctx, queries.view(), r.view(), &cfg)
    })
    .map_err(|f| on_rank(group, f))?;

    // Every rank's rows to rank 0, which writes them.
    let indices: Vec<i64> = found.indices.iter().map(|&i| i64::from(i)).collect();
    let scores: Vec<f32> = found.scores.iter().copied().collect();
    let gathered = (|| {
        Ok((
            group.gather("gather the outputs", 0, &indices)?,
            group.gather("gather the outputs", 0, &scores)?,
        ))
    })()
    .map_err(|e: wgpu_metric_learning::Error| {
        Failure::from(format!("rank {}: {}", group.rank(), with_causes(&e)))
    })?;
    let written = match gathered {
        (Some(all_indices), Some(all_scores)) => {
            let shape = (q, cfg.k);
            let indices = Array2::from_shape_vec(shape, all_indices).map_err(|e| e.to_string());
            let scores = Array2::from_shape_vec(shape, all_scores).map_err(|e| e.to_string());
            indices.and_then(|indices| {
                npy::write(&a.out_indices, &indices)?;
                npy::write(&a.out_scores, &scores?)
            })
        }
        _ => Ok(()),
    };
    agreed(group, "write the outputs", written)
}

pub(crate) fn accuracy(a: &AccuracyArgs, hooks: &Hooks) -> Result<(), Failure> {
    as_rank(&a.distributed, |group| accuracy_rank(a, hooks, group))
}

fn accuracy_rank(a: &AccuracyArgs, hooks: &Hooks, group: &Group) -> Result<(), Failure> {
    let cfg = accuracy_config(a, hooks)?;
    let read = (|| {
        let (n, x) = embedding_rows(&a.embeddings, group)?;
        let y = label_rows(&a.labels, n, group)?;
        let refs = match (&a.refs, &a.ref_labels) {
            (Some(r), Some(l)) => {
                let (m, rows) = embedding_rows(r, group)?;
                Some((rows, label_rows(l, m, group)?))
            }
            _ => None,
        };
        Ok((x, y, refs))
    })();
    let (x, y, refs) = agreed(group, "read the inputs", read)?;
    let ctx = context(group, &a.common)?;
    let inputs = accuracy_inputs(a);
    let r = refs.as_ref().map(|(e, l)| MiningSet::new(e, l));
    let acc = timed("accuracy", &ctx, &a.common, &inputs, || {
        distributed::accuracy(group, &ctx, &MiningSet::new(&x, &y), r.as_ref(), &cfg)
    })
    .map_err(|f| on_rank(group, f))?;
    if group.rank() == 0 {
        print_accuracy(&acc, &cfg);
    }
    Ok(())
}

/// `wml loss arcface|… --distributed`: each rank reads its share of the rows and of the
/// classes (its columns of `W`/`fc`, its rows of the proxies); rank 0 writes the gradients,
/// assembled, and prints the JSON: the single process's.
pub(crate) fn classifier(
    name: &'static str,
    a: &ClassifierArgs,
    hooks: &Hooks,
) -> Result<(), Failure> {
    as_rank(&a.distributed, |group| {
        classifier_rank(name, a, hooks, group)
    })
}

fn classifier_rank(
    name: &'static str,
    a: &ClassifierArgs,
    hooks: &Hooks,
    group: &Group,
) -> Result<(), Failure> {
    let kind = crate::classifier::kind(name, a)?;
    let sampling = crate::classifier::sampling(a)?;
    let (per, on_rows) = (kind.centres_per_class(), kind.classes_on_rows());
    let read = (|| {
        let (n, x) = embedding_rows(&a.embeddings, group)?;
        let y = label_rows(&a.labels, n, group)?;
        let shape = npy::shape_of(&a.weights, 2, "weights")?;
        let centres = if on_rows { shape[0] } else { shape[1] };
        if centres % per != 0 {
            return Err(npy::problem(
                &a.weights,
                format!("{centres} centres are not a whole number of classes of {per}"),
            ));
        }
        let classes = share(centres / per, group.rank(), group.size());
        let mine = classes.start * per..classes.end * per;
        let w = if on_rows {
            npy::read_embedding_rows(&a.weights, mine)?
        } else {
            npy::read_columns(&a.weights, mine)?
        };
        Ok((n, x, y, w, shape))
    })();
    let (n, x, y, w, shape) = agreed(group, "read the inputs", read)?;
    let ctx = context(group, &a.common)?;
    let cfg = DistributedClassifierConfig {
        loss: ClassifierLossConfig {
            kind,
            sampling,
            hooks: hooks.clone(),
        },
        weights: ClassWeights::Sharded,
        gradients: RankGradients::Summed,
        check_replicas: false,
    };
    let files = given(&[
        ("embeddings", Some(a.embeddings.as_path())),
        ("labels", Some(a.labels.as_path())),
        ("weights", Some(a.weights.as_path())),
    ]);
    let labels = y.to_vec();
    let what = format!("loss {name}");
    let out = timed(&what, &ctx, &a.common, &files, || {
        distributed::classifier_loss(group, &ctx, x.view(), &labels, w.view(), &cfg)
    })
    .map_err(|f| on_rank(group, f))?;
    // Every rank's rows and classes to rank 0, which writes them.
    let grad: Vec<f32> = out.grad.iter().copied().collect();
    // The classes' gradients as rows (a class's centres, in order), then back to the layout.
    let classes = if on_rows {
        out.weight_grad
    } else {
        out.weight_grad.reversed_axes()
    };
    let weight_grad: Vec<f32> = classes.as_standard_layout().iter().copied().collect();
    let gathered = (|| {
        Ok((
            group.gather("gather the outputs", 0, &grad)?,
            group.gather("gather the outputs", 0, &weight_grad)?,
        ))
    })()
    .map_err(|e: wgpu_metric_learning::Error| {
        Failure::from(format!("rank {}: {}", group.rank(), with_causes(&e)))
    })?;
    let written = match gathered {
        (Some(grad), Some(weight_grad)) => (|| {
            let grad = Array2::from_shape_vec((n, x.ncols()), grad).map_err(|e| e.to_string())?;
            npy::write(&a.grad_out, &grad)?;
            if let Some(path) = &a.weight_grad_out {
                let (rows, cols) = if on_rows {
                    (shape[0], shape[1])
                } else {
                    (shape[1], shape[0])
                };
                let w =
                    Array2::from_shape_vec((rows, cols), weight_grad).map_err(|e| e.to_string())?;
                let w = if on_rows { w } else { w.reversed_axes() };
                npy::write(path, &w.as_standard_layout())?;
            }
            crate::classifier::print_loss(out.loss, out.count, out.classes_used);
            Ok(())
        })(),
        _ => Ok(()),
    };
    agreed(group, "write the outputs", written)
}
