//! torch's `SGD` and `AdamW` updates written out in f64, one element at a time: the oracle of
//! [`crate::weights_step`].

use ndarray::Array2;

use crate::WeightOptimizer;

/// One step of `opt` on `w` with gradient `g`, `buffers` the optimizer's state (empty before
/// the first step, made here) and `step` the step's number from 1.
pub fn weights_step(
    w: &mut Array2<f64>,
    g: &Array2<f64>,
    buffers: &mut Vec<Array2<f64>>,
    step: u64,
    opt: &WeightOptimizer,
) {
    match *opt {
        WeightOptimizer::Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } => {
            let (lr, momentum, dampening, wd) = (
                f64::from(lr),
                f64::from(momentum),
                f64::from(dampening),
                f64::from(weight_decay),
            );
            let mut d = g + &(w.mapv(|x| x * wd));
            if momentum != 0.0 {
                if buffers.is_empty() {
                    buffers.push(d.clone());
                } else {
                    buffers[0] = &buffers[0] * momentum + &(&d * (1.0 - dampening));
                }
                d = match nesterov {
                    true => &d + &(&buffers[0] * momentum),
                    false => buffers[0].clone(),
                };
            }
            *w -= &(d * lr);
        }
        WeightOptimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let (lr, b1, b2, eps, wd) = (
                f64::from(lr),
                f64::from(beta1),
                f64::from(beta2),
                f64::from(eps),
                f64::from(weight_decay),
            );
            if buffers.is_empty() {
                buffers.push(Array2::zeros(w.dim()));
                buffers.push(Array2::zeros(w.dim()));
            }
            *w *= 1.0 - lr * wd;
            buffers[0] = &buffers[0] * b1 + &(g * (1.0 - b1));
            buffers[1] = &buffers[1] * b2 + &(g.mapv(|x| x * x) * (1.0 - b2));
            let t = step as i32;
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            for ((w, m), v) in w.iter_mut().zip(&buffers[0]).zip(&buffers[1]) {
                *w -= lr / c1 * m / (v.sqrt() / c2.sqrt() + eps);
            }
        }
    }
}
