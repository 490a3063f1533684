// common/math.wgsl: functions WGSL lacks. Composed in front of a kernel's own source.

// log(1 + z) without losing a small z (Kahan's rewriting): WGSL has no log1p.
fn log1p(z: f32) -> f32 {
    let w = 1.0 + z;
    if (w == 1.0) {
        return z;
    }
    return log(w) * z / (w - 1.0);
}

// 1 / (1 + e^{-t}) without overflow.
fn sigmoid(t: f32) -> f32 {
    if (t >= 0.0) {
        return 1.0 / (1.0 + exp(-t));
    }
    let e = exp(t);
    return e / (1.0 + e);
}
