//! Where mined triplets go, shared by the wgpu and native paths.

use std::ops::ControlFlow;

use ndarray::ArrayView2;

use crate::error::Result;
use crate::hooks::Hooks;

/// A streaming callback: receives consecutive chunks `(t, 3)`; `Break` stops mining.
pub(crate) type Callback<'s> = &'s mut dyn FnMut(ArrayView2<'_, u32>) -> ControlFlow<()>;

/// The destination of a mining call: one flat `(a, p, n)` vector, or a callback.
pub(crate) enum Sink<'s> {
    Collect(&'s mut Vec<u32>),
    Stream(Callback<'s>),
}

/// Writes triplets to a [`Sink`] in blocks that share `(a, p)`: straight into the vector when
/// collecting (no intermediate copy), in chunks of exactly `chunk` rows (the last one shorter)
/// when streaming, through one reused buffer. A stream stops, before handing over its next
/// chunk, once the call is cancelled.
pub(crate) struct Writer<'s> {
    sink: Sink<'s>,
    chunk: usize,
    /// The call's hooks (their cancellation) and name.
    hooks: Hooks,
    op: &'static str,
    pending: Vec<u32>,
    delivered: u64,
    stopped: bool,
    /// Rows still to drop after a rewind: already handed to the callback.
    skip: u64,
}

/// Where a writer stood, to go back to with [`Writer::rewind`].
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    collected: usize,
    delivered: u64,
}

/// Appends rows `(a, p, n)` for every `n` of `negatives`.
fn append_rows(rows: &mut Vec<u32>, a: u32, p: u32, negatives: &[u32]) {
    let base = rows.len();
    rows.resize(base + 3 * negatives.len(), 0);
    for (row, &n) in rows[base..].chunks_exact_mut(3).zip(negatives) {
        row.copy_from_slice(&[a, p, n]);
    }
}

impl<'s> Writer<'s> {
    pub(crate) fn new(sink: Sink<'s>, chunk: usize, hooks: &Hooks, op: &'static str) -> Self {
        Self {
            sink,
            chunk: chunk.max(1),
            hooks: hooks.clone(),
            op,
            pending: Vec::new(),
            delivered: 0,
            stopped: false,
            skip: 0,
        }
    }

    /// The writer's position now.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            collected: match &self.sink {
                Sink::Collect(all) => all.len(),
                Sink::Stream(_) => 0,
            },
            delivered: self.delivered,
        }
    }

    /// Goes back to `mark`, so that the triplets since can be written again: a collected
    /// vector is cut back; a stream drops what is pending and will skip as many rows as it
    /// had delivered since, so the callback sees every triplet once and in order.
    pub(crate) fn rewind(&mut self, mark: Mark) {
        match &mut self.sink {
            Sink::Collect(all) => {
                all.truncate(mark.collected);
                self.delivered = mark.delivered;
            }
            Sink::Stream(_) => {
                self.pending.clear();
                self.skip = self.delivered - mark.delivered;
            }
        }
    }

    /// Room for `triplets` more rows (collecting only: a stream holds one chunk at a time).
    pub(crate) fn reserve(&mut self, triplets: u64) {
        if let Sink::Collect(all) = &mut self.sink {
            all.reserve(3 * triplets as usize);
        }
    }

    /// The vector a collecting writer appends to (`None` when streaming): the native path
    /// fills it in place, from every thread at once.
    pub(crate) fn collect_target(&mut self) -> Option<&mut Vec<u32>> {
        match &mut self.sink {
            Sink::Collect(all) => Some(all),
            Sink::Stream(_) => None,
        }
    }

    /// `Err(Cancelled)` once the call is cancelled: checked between output windows.
    pub(crate) fn check(&self) -> Result<()> {
        self.hooks.check(self.op)
    }

    /// Whether the callback asked to stop, or the call was cancelled.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// Writes the triplets `(a, p, n)` for each `n` of `negatives`, in that order.
    pub(crate) fn block(&mut self, a: u32, p: u32, negatives: &[u32]) {
        if self.stopped {
            return;
        }
        let skipped = self.skip.min(negatives.len() as u64);
        self.skip -= skipped;
        let negatives = &negatives[skipped as usize..];
        let chunk = self.chunk;
        if let Sink::Collect(all) = &mut self.sink {
            append_rows(all, a, p, negatives);
            self.delivered += negatives.len() as u64;
            return;
        }
        let mut rest = negatives;
        while !rest.is_empty() && !self.stopped {
            let room = chunk - self.pending.len() / 3;
            let (head, tail) = rest.split_at(room.min(rest.len()));
            append_rows(&mut self.pending, a, p, head);
            rest = tail;
            if self.pending.len() == 3 * chunk {
                self.flush();
            }
        }
    }

    fn flush(&mut self) {
        let Sink::Stream(callback) = &mut self.sink else {
            return;
        };
        if self.pending.is_empty() || self.stopped {
            return;
        }
        if self.hooks.check(self.op).is_err() {
            self.stopped = true;
            return;
        }
        if let Ok(rows) = ArrayView2::from_shape((self.pending.len() / 3, 3), &self.pending[..]) {
            self.delivered += rows.nrows() as u64;
            self.stopped = callback(rows).is_break();
        }
        self.pending.clear();
    }

    /// Delivers what is pending and returns the number of triplets delivered, or
    /// `Err(Cancelled)` if the call was cancelled.
    pub(crate) fn finish(mut self) -> Result<u64> {
        self.flush();
        self.hooks.check(self.op)?;
        Ok(self.delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes anchors 0..4, each with positive 9 and negatives 0..5.
    fn write_all(w: &mut Writer<'_>) {
        for a in 0..4 {
            w.block(a, 9, &[0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn a_rewound_stream_hands_every_row_over_once_in_order() {
        let mut seen: Vec<u32> = Vec::new();
        let mut callback = |rows: ArrayView2<'_, u32>| {
            seen.extend(rows.iter().copied());
            ControlFlow::Continue(())
        };
        let mut w = Writer::new(Sink::Stream(&mut callback), 3, &Hooks::new(), "t");
        let start = w.mark();
        // A first attempt gets through two anchors (three chunks delivered, one row pending)…
        w.block(0, 9, &[0, 1, 2, 3, 4]);
        w.block(1, 9, &[0, 1, 2, 3, 4]);
        // …then fails; the retry starts over.
        w.rewind(start);
        write_all(&mut w);
        assert_eq!(w.finish().ok(), Some(20));
        let mut want = Vec::new();
        for a in 0..4 {
            for n in 0..5 {
                want.extend([a, 9, n]);
            }
        }
        assert_eq!(seen, want);
    }

    #[test]
    fn a_cancelled_stream_hands_over_no_further_chunk() {
        let token = crate::hooks::CancelToken::new();
        let hooks = Hooks::new().cancel_with(&token);
        let mut chunks = 0;
        let mut callback = |_: ArrayView2<'_, u32>| {
            chunks += 1;
            ControlFlow::Continue(())
        };
        let mut w = Writer::new(Sink::Stream(&mut callback), 3, &hooks, "t");
        w.block(0, 9, &[0, 1, 2, 3]); // one chunk of 3 delivered, one row pending
        token.cancel();
        w.block(1, 9, &[0, 1, 2, 3]);
        assert!(w.stopped(), "the writer stops");
        assert!(matches!(
            w.finish(),
            Err(crate::Error::Cancelled { op: "t" })
        ));
        assert_eq!(chunks, 1, "nothing after the cancellation");
    }

    #[test]
    fn a_rewound_collection_is_cut_back() {
        let mut all = vec![7, 7, 7];
        let mut w = Writer::new(Sink::Collect(&mut all), 3, &Hooks::new(), "t");
        let start = w.mark();
        w.block(0, 9, &[0, 1]);
        w.rewind(start);
        write_all(&mut w);
        assert_eq!(w.finish().ok(), Some(20));
        assert_eq!(all.len(), 3 + 60);
        assert_eq!(&all[..6], &[7, 7, 7, 0, 9, 0]);
    }
}
