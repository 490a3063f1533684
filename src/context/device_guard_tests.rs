//! The process-wide device guard (`device::lifecycle_lock`, `device::submit`, `device::poll`)
//! on a real context: here, above the device module, which must not import the context.

use std::time::{Duration, Instant};

use super::test_gpu_context;
use crate::runtime::device::{lifecycle_lock, poll, submit};

#[test]
fn submissions_and_polls_wait_while_a_device_is_made_or_destroyed() {
    let Some(ctx) = test_gpu_context() else {
        return;
    };
    let gpu = ctx.gpu().expect("a wgpu context has a device");
    let (tx, rx) = std::sync::mpsc::channel();
    let held = lifecycle_lock();
    std::thread::scope(|s| {
        s.spawn(|| {
            let encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            let index = submit(&gpu.queue, [encoder.finish()]);
            let waited = poll(
                &gpu.device,
                wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: Some(Duration::from_secs(30)),
                },
            );
            let _ = tx.send(waited.is_ok());
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a submission ran while the lifecycle guard was held"
        );
        drop(held);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)),
            Ok(true),
            "the submission and its wait go on once the guard is released"
        );
    });
}

#[test]
fn a_wait_for_nothing_returns_at_once() {
    let Some(ctx) = test_gpu_context() else {
        return;
    };
    let gpu = ctx.gpu().expect("a wgpu context has a device");
    let started = Instant::now();
    let waited = poll(
        &gpu.device,
        wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(Duration::from_secs(5)),
        },
    );
    assert!(waited.is_ok(), "{waited:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
