"""Record a real training run's memory events as an RMM CSV log; the
recording functions of benchmarks/record_corpus.py too.

PyTorch trains a model on the CPU under ``torch.profiler`` with
``profile_memory=True``; every tensor allocation and free its allocator
makes (the profiler's ``[memory]`` events: address, bytes, negative for a
free) becomes a line of an RMM CSV log, gzip-compressed, which
``numba-alloc replay`` and benchmarks/bench_traces.py read. The model, its
optimizer and the data are made inside the recording, so the log holds
every tensor of the run. One intra-op thread keeps the log the same from
run to run.

Models:

* ``transformer``: a GPT-style decoder (token and position embeddings, 6
  pre-norm layers of 8-head attention and a 4x MLP, width 512, 16k
  vocabulary) on batches of 16 sequences whose length varies from 128 to
  384 tokens, AdamW;
* ``cnn``: a ResNet-style network (a stem and three stages of two residual
  blocks, 64 to 256 channels, batch norm) on batches of 32 RGB images of
  96 x 96 pixels, 100 classes, SGD with momentum.

    python benchmarks/record_torch_trace.py MODEL [--steps N] [--out PATH]

Writes benchmarks/traces/MODEL-training.csv.gz unless --out says where.
"""

import argparse
import gzip
import json
import os
import sys
import tempfile

import torch
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_traces import peak_live  # noqa: E402
from numba_alloc.observe.trace import ALLOCATE, DEALLOCATE, TraceEvent, write_rmm_log  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, vocab=16384, width=512, layers=6, heads=8, longest=384):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(longest, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, ids):
        n = ids.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        x = self.tokens(ids) + self.positions(torch.arange(n))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def transformer_steps(steps, generator):
    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        n = int(torch.randint(128, 385, (1,), generator=generator))
        ids = torch.randint(0, 16384, (16, n + 1), generator=generator)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        del logits, loss, ids


class Residual(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.skip = (nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                   nn.BatchNorm2d(outputs))
                     if stride != 1 or inputs != outputs else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


def cnn_steps(steps, generator):
    stages, layers, width = (64, 128, 256), [], 64
    for i, channels in enumerate(stages):
        layers += [Residual(width, channels, 1 if i == 0 else 2), Residual(channels, channels, 1)]
        width = channels
    model = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                          *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 100))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        images = torch.randn(32, 3, 96, 96, generator=generator)
        labels = torch.randint(0, 100, (32,), generator=generator)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        del images, labels, loss


MODELS = {"transformer": transformer_steps, "cnn": cnn_steps}


def profiled_events(run):
    """The memory events of ``run()`` (called under ``torch.profiler`` with
    profile_memory on: every allocation and free of PyTorch's CPU
    allocator, its storages' bytes) as TraceEvents, in the order they
    happened, times in seconds from the first."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as profiler:
            run()
        profiler.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
    memory = sorted((e for e in trace if e.get("name") == "[memory]" and e["args"]["Bytes"]),
                    key=lambda e: e["args"]["Ev Idx"])
    start = memory[0]["ts"] if memory else 0
    return [TraceEvent(1, (e["ts"] - start) / 1e6,
                       ALLOCATE if e["args"]["Bytes"] > 0 else DEALLOCATE,
                       e["args"]["Addr"], abs(e["args"]["Bytes"]), 0) for e in memory]


def to_fresh_storage(model):
    """Copy ``model``'s parameters and buffers to fresh storage in the
    order ``model.to("cuda")`` does (Module._apply), a tensor shared by
    two modules (a tied weight) once."""
    fresh = set()

    def copy(tensor):
        if tensor.data_ptr() in fresh:
            return tensor
        copied = tensor.clone()
        fresh.add(copied.data_ptr())
        return copied
    return model._apply(copy)


def recorded_only(events):
    """``events`` without the frees of storages allocated before the
    recording began."""
    held, kept = set(), []
    for e in events:
        if e.action == ALLOCATE:
            held.add(e.pointer)
        elif e.pointer in held:
            held.discard(e.pointer)
        else:
            continue
        kept.append(e)
    return kept


def save(events, out):
    """Write ``events`` to ``out`` as a gzip-compressed RMM CSV log; print
    its events, peak live bytes and compressed size."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with gzip.open(out, "wt", newline="") as f:
        write_rmm_log(events, f)
    print(f"{out}: {len(events):,} events, peak live {peak_live(events) / 2 ** 20:.1f} MiB, "
          f"{os.path.getsize(out) / 2 ** 20:.2f} MiB compressed")


def record(model, steps):
    """The run's memory events as TraceEvents, in the order they happened."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    return profiled_events(lambda: MODELS[model](steps, generator))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out")
    args = parser.parse_args()
    out = args.out or os.path.join(HERE, "traces", f"{args.model}-training.csv.gz")
    save(record(args.model, args.steps), out)


if __name__ == "__main__":
    main()
