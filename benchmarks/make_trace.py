"""Make numba_alloc/data/training_loop.csv, the trace numba-alloc replay,
numba-alloc demo --trace and the notebook use.

It runs the allocations of a small transformer's training loop through the
pool on a simulated 1 GiB device with history recording, and writes the
history as an RMM CSV log with numba_alloc.dump_trace:

* weights (embedding, 6 layers of attention and MLP matrices, layer norms)
  allocated once, Adam's two moment buffers at the first optimizer step;
* per step, a batch from a data-loader thread (token ids and labels), then
  forward activations whose sizes follow the batch's sequence length (128
  to 448 tokens), kept until backward frees them in reverse order, small
  temporaries freed at once, weight gradients freed after the optimizer step;
* a step that first tries a batch 16 times larger: its logits do not fit,
  so the log records an allocate failure, and the step goes on at the usual
  size.

Then, as real logs are messy: recording starts after the data loader
prefetched two batches (so their frees are of unknown pointers), and one
deallocate line is dropped, as when a logger loses a line (so its pointer is
allocated again while the log still holds it). Thread ids are made stable.

Usage: python benchmarks/make_trace.py [--out PATH] [--steps N]
"""

import argparse
import io
import threading
import time
from pathlib import Path

import numpy as np

import numba_alloc
from numba_alloc.observe.trace import BUNDLED_TRACE, DEALLOCATE, read_rmm_log, write_rmm_log

HIDDEN, LAYERS, HEADS, VOCAB, BATCH = 512, 6, 8, 8192, 8
MAIN_THREAD, LOADER_THREAD = 140245383681856, 140243960022592
HALF, FLOAT, INT = 2, 4, 4   # bytes per element
COMPUTE_SECONDS = 0.0005     # a layer's forward kernels (backward: twice that)


class Loop:
    def __init__(self, pool, seed=7):
        self.pool = pool
        self.rng = np.random.default_rng(seed)
        self.weights = [self.pool.malloc(VOCAB * HIDDEN * HALF)]          # embedding
        for _ in range(LAYERS):
            for shape in ((3 * HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (4 * HIDDEN, HIDDEN),
                          (HIDDEN, 4 * HIDDEN), (HIDDEN,), (HIDDEN,)):
                self.weights.append(self.pool.malloc(int(np.prod(shape)) * HALF))
        self.moments = None
        self.prefetched = None     # (sequence length, [token ids, labels]) of the next step

    def load_batch(self, seq):
        """The data loader's thread allocates a batch: token ids and labels."""
        out = []
        worker = threading.Thread(target=lambda: out.extend(
            self.pool.malloc(BATCH * seq * INT) for _ in range(2)))
        worker.start()
        worker.join()
        return out

    def sequence_length(self):
        return int(self.rng.integers(128, 449))

    def temporary(self, nbytes):
        self.pool.free(self.pool.malloc(nbytes))

    def step(self, batch=BATCH):
        pool = self.pool
        if self.prefetched is None:
            seq = self.sequence_length()
            self.prefetched = seq, self.load_batch(seq)
        seq, tokens = self.prefetched
        next_seq = self.sequence_length()
        self.prefetched = next_seq, self.load_batch(next_seq)
        x = pool.malloc(batch * seq * HIDDEN * HALF)
        saved = []
        for _ in range(LAYERS):
            tokens_hidden = batch * seq * HIDDEN * HALF
            layer = [pool.malloc(tokens_hidden)]                              # layer norm out
            layer.append(pool.malloc(3 * tokens_hidden))                      # q, k, v
            layer.append(pool.malloc(batch * HEADS * seq * seq * HALF))       # attention probs
            self.temporary(batch * HEADS * seq * FLOAT)                       # softmax stats
            layer.append(pool.malloc(tokens_hidden))                          # attention out
            layer.append(pool.malloc(4 * tokens_hidden))                      # MLP hidden
            self.temporary(int(self.rng.integers(1, 64)) * 4096)              # GEMM workspace
            layer.append(pool.malloc(tokens_hidden))                          # residual out
            saved.append(layer)
            time.sleep(COMPUTE_SECONDS)                                       # the kernels run
        logits = pool.malloc(batch * seq * VOCAB * HALF)
        loss = pool.malloc(FLOAT)
        self.temporary(batch * seq * FLOAT)
        grads = []
        grad_logits = pool.malloc(batch * seq * VOCAB * HALF)
        pool.free(logits)
        grad_x = pool.malloc(batch * seq * HIDDEN * HALF)
        pool.free(grad_logits)
        for layer in reversed(saved):
            for weight in (3 * HIDDEN * HIDDEN, HIDDEN * HIDDEN, 4 * HIDDEN * HIDDEN,
                           4 * HIDDEN * HIDDEN, HIDDEN, HIDDEN):
                grads.append(pool.malloc(weight * HALF))
            self.temporary(int(self.rng.integers(1, 64)) * 4096)              # GEMM workspace
            grad_in = pool.malloc(batch * seq * HIDDEN * HALF)
            pool.free(grad_x)
            grad_x = grad_in
            for activation in reversed(layer):
                pool.free(activation)
            time.sleep(2 * COMPUTE_SECONDS)
        grads.append(pool.malloc(VOCAB * HIDDEN * HALF))                      # embedding grad
        for buffer in (grad_x, x, loss, *tokens):
            pool.free(buffer)
        if self.moments is None:                                              # Adam's state
            self.moments = [pool.malloc(w.size * 2) for w in self.weights for _ in range(2)]
        self.temporary(sum(w.size for w in self.weights) // 64)               # grad-norm partials
        for g in grads:
            pool.free(g)


def make(steps, seed=7):
    """The trace's events."""
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
    loop = Loop(pool, seed)
    stale = loop.load_batch(256) + loop.load_batch(256)   # prefetched, then dropped
    numba_alloc.record_history(device=pool, max_entries=1_000_000)
    for buffer in stale:                    # allocated before recording began
        pool.free(buffer)
    for step in range(steps):
        if step == steps // 2:              # try a 16x larger batch: its logits do not fit
            try:
                pool.malloc(16 * BATCH * 512 * VOCAB * HALF)
            except numba_alloc.OutOfMemoryError:
                pass
        loop.step()
    text = io.StringIO()
    numba_alloc.dump_trace(text, device=pool)
    text.seek(0)
    events = read_rmm_log(text)
    threads = {events[0].thread: MAIN_THREAD}
    events = [e._replace(thread=threads.setdefault(e.thread, LOADER_THREAD)) for e in events]
    allocated = set()
    for lost, e in enumerate(events):
        allocated.add(e.pointer)
        if (lost > len(events) // 3 and e.action == DEALLOCATE and e.pointer in allocated
                and any(later.pointer == e.pointer for later in events[lost + 1:lost + 200])):
            return events[:lost] + events[lost + 1:]
    raise AssertionError("no deallocate line whose pointer comes back soon")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUNDLED_TRACE)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    events = make(args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_rmm_log(events, args.out)
    print(f"{args.out}: {len(events)} events, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
